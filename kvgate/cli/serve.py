"""The gateway's own subcommands, ``kvgate serve`` and ``kvgate config check``, each a
``register(subparsers)`` function that adds its parser and sets ``run`` (``args -> exit code``) and
``prog`` (its name in error lines). The ``kvgate`` entry that gathers every subcommand, the
simulator's and the load tester's too, is ``kvgate.cli``: the runtime never imports the load
tester."""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable

from kvgate.cli.command import CommandError, warning
from kvgate.config.gateway import GatewayConfig
from kvgate.config.loader import ConfigError, Warn, load_config, log_warning


def register_serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("serve", help="run the gateway in front of real replicas")
    parser.add_argument("--config", required=True, help="YAML config file (KVGATE_* variables override it)")
    parser.add_argument("--host", default=None, help="address to listen on (overrides server.host)")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (overrides server.port)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--log-format",
        default="json",
        choices=["json", "text"],
        help="every line the process writes on stderr: one JSON object (default), or text for a terminal",
    )
    parser.set_defaults(run=_serve, prog=parser.prog)


def register_config(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("config", help="configuration tools")
    actions = parser.add_subparsers(dest="config_command", required=True)
    check = actions.add_parser("check", help="validate a config file, listing every problem")
    check.add_argument("file")
    check.add_argument(
        "--no-secrets",
        action="store_true",
        help="open no *_file secret (CI, where they are not mounted); every other rule still runs",
    )
    check.set_defaults(run=_config_check, prog=check.prog)
    reference = actions.add_parser(
        "reference", help="print the generated reference of the admission, routing and autoscaler sections"
    )
    reference.set_defaults(run=_config_reference, prog=reference.prog)


def _config_reference(args: argparse.Namespace) -> int:
    from kvgate.config.reference import render

    print(render(), end="")
    return 0


def load(
    path: str, environ: dict[str, str] | None = None, warn: Warn = log_warning, read_secrets: bool = True
) -> GatewayConfig:
    """The config in ``path``, with every model's tokeniser and chat template loaded once, as the
    gateway will load them: a file that passes here starts."""
    try:
        config = load_config(path, environ, warn, read_secrets)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    problems = counting_problems(config)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise CommandError(f"invalid config {path}: {len(problems)} problem(s)\n{lines}")
    return config


def counting_problems(config: GatewayConfig) -> list[str]:
    """Why a model's prompts could not be counted: a tokeniser or chat template that does not load
    (a missing file, a missing extra), one line per model."""
    from kvgate.admission.counting import template_for, tokenizer_for

    problems = []
    for i, model in enumerate(config.models):
        loaders: list[tuple[str, Callable[[], object]]] = [
            ("tokenizer", functools.partial(tokenizer_for, model.tokenizer)),
            ("chat_template", functools.partial(template_for, model.chat_template)),
        ]
        for part, build in loaders:
            try:
                build()
            except Exception as exc:  # every way a third-party loader fails is a config problem
                problems.append(f"models.{i}.{part} ({model.name}): {exc}")
    return problems


def _config_check(args: argparse.Namespace) -> int:
    """An old key still read is a warning line of the check's own, besides the summary."""
    config = load(
        args.file, warn=lambda message: warning(args.prog, message), read_secrets=not args.no_secrets
    )
    replicas = sum(len(p.replicas) for p in config.pools)
    dns = sum(1 for p in config.pools if p.dns is not None)
    kubernetes = sum(1 for p in config.pools if p.kubernetes is not None)
    found_by_api = f", {kubernetes} Kubernetes pool(s)" if kubernetes else ""
    print(
        f"{args.file}: ok ({len(config.models)} model(s), {len(config.pools)} pool(s), "
        f"{replicas} static replica(s), {dns} DNS pool(s){found_by_api})"
    )
    for model in config.models:
        if config.disaggregated(model.name):
            serving = config.serving(model.name)
            mixed = list(serving["mixed"])
            share = model.disaggregated_share
            split = f", {share:g} of its requests (the rest whole on {mixed})" if mixed else ""
            print(
                f"  {model.name}: prefill {list(serving['prefill'])} hands off to decode "
                f"{list(serving['decode'])}{split}"
            )
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Flags win over ``KVGATE_SERVER__*`` variables, which win over the file. A refusal to start is
    the command line's one error line; once the config is good, everything the process writes goes
    through logging in one format (``kvgate.cli.logs``), the loader's warnings included."""
    from kvgate.cli.logs import configure
    from kvgate.gateway.edge.server import serve

    environ = dict(os.environ)
    if args.host is not None:
        environ["KVGATE_SERVER__HOST"] = args.host
    if args.port is not None:
        environ["KVGATE_SERVER__PORT"] = str(args.port)
    warnings: list[str] = []
    config = load(args.config, environ, warn=warnings.append)
    check_listen(config.server.host, config.server.port)
    configure(args.log_format, args.log_level)
    for line in warnings:
        log_warning(line)
    serve(config, log_level=args.log_level)
    return 0


def check_listen(host: str, port: int) -> None:
    """Fail with one line before start-up when ``host:port`` cannot be bound (in use, no such address)."""
    from kvgate.gateway.edge.server import bind_socket

    try:
        bind_socket(host, port).close()
    except OSError as exc:
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", status=1) from None
