"""The ``kvgate`` command line. Each subcommand is a ``register(subparsers)`` function that adds
its parser and sets ``run`` (``args -> exit code``) and ``prog`` (its name in error lines); adding
one is one line in ``COMMANDS``. Bad input is one line, ``kvgate <command>: error: ...``, and a
non-zero exit (see ``gateway.command``)."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

from config.autoscaler import AutoscalerConfig, PoolPolicy
from config.loader import ConfigError, load_config, parse_config
from config.schema import GatewayConfig
from gateway.autoscale_loop import register as register_autoscale
from gateway.command import CommandError, CommandParser, report
from loadtest.cli import register as register_loadtest
from loadtest.sim.cli import register as register_sim

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]
UP_POOL = "sim"


def register_serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("serve", help="run the gateway in front of real replicas")
    parser.add_argument("--config", required=True, help="YAML config file (KVGATE_* variables override it)")
    parser.add_argument("--host", default=None, help="address to listen on (overrides server.host)")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (overrides server.port)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(run=_serve, prog=parser.prog)


def register_up(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "up",
        help="a simulated vLLM fleet in-process, the gateway, and the autoscaler resizing the fleet",
    )
    parser.add_argument("--replicas", type=int, default=2, help="simulated replicas at start (default 2)")
    parser.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    parser.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    parser.add_argument("--profile", default="llama-3.1-8b-h100", help="simulator profile")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiplies every simulated duration, as kvgate sim's (default 1; 0.1: ten times faster; "
        "0: no sleeping)",
    )
    parser.add_argument(
        "--no-autoscale",
        dest="autoscale",
        action="store_false",
        help="do not run the autoscaler (by default it resizes the simulated fleet, with cold starts)",
    )
    parser.add_argument("--min-replicas", type=int, default=1, help="autoscaler floor (default 1)")
    parser.add_argument("--max-replicas", type=int, default=8, help="autoscaler ceiling (default 8)")
    parser.add_argument(
        "--autoscale-interval-s",
        type=float,
        default=5.0,
        help="seconds between autoscaler rounds (default 5)",
    )
    parser.set_defaults(run=_up, prog=parser.prog)


def register_config(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("config", help="configuration tools")
    actions = parser.add_subparsers(dest="config_command", required=True)
    check = actions.add_parser("check", help="validate a config file, listing every problem")
    check.add_argument("file")
    check.set_defaults(run=_config_check, prog=check.prog)


COMMANDS: list[Register] = [
    register_serve,
    register_up,
    register_config,
    register_sim,
    register_loadtest,
    register_autoscale,
]


def package_version() -> str:
    try:
        return version("kvgate")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = CommandParser(
        prog="kvgate", description="OpenAI-compatible gateway for vLLM fleets"
    )
    parser.add_argument("--version", action="version", version=f"kvgate {package_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except CommandError as exc:
        report(args.prog, str(exc))
        return exc.status
    except KeyboardInterrupt:
        return 130


def _load(path: str, environ: dict[str, str] | None = None) -> GatewayConfig:
    try:
        return load_config(path, environ)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None


def _config_check(args: argparse.Namespace) -> int:
    config = _load(args.file)
    replicas = sum(len(p.replicas) for p in config.pools)
    dns = sum(1 for p in config.pools if p.dns is not None)
    print(
        f"{args.file}: ok ({len(config.models)} model(s), {len(config.pools)} pool(s), "
        f"{replicas} static replica(s), {dns} DNS pool(s))"
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Flags win over ``KVGATE_SERVER__*`` variables, which win over the file."""
    from gateway.server import serve

    environ = dict(os.environ)
    if args.host is not None:
        environ["KVGATE_SERVER__HOST"] = args.host
    if args.port is not None:
        environ["KVGATE_SERVER__PORT"] = str(args.port)
    config = _load(args.config, environ)
    _check_listen(config.server.host, config.server.port)
    serve(config, log_level=args.log_level)
    return 0


def _check_listen(host: str, port: int) -> None:
    """Fail with one line before start-up when ``host:port`` cannot be bound (in use, no such address)."""
    from gateway.server import bind_socket

    try:
        bind_socket(host, port).close()
    except OSError as exc:
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", status=1) from None


def _up(args: argparse.Namespace) -> int:
    import uvloop

    from loadtest.sim.profile import resolve_profile

    if args.replicas < 1:
        raise CommandError(f"--replicas must be at least 1, got {args.replicas}")
    if args.time_scale < 0:
        raise CommandError(f"--time-scale must be >= 0, got {args.time_scale:g}")
    try:
        resolve_profile(args.profile, {})
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    autoscaler = up_autoscaler(args)
    _check_listen(args.host, args.port)
    try:
        uvloop.run(_run_up(args, autoscaler))
    except OSError as exc:
        raise CommandError(str(exc), status=1) from None
    return 0


def up_autoscaler(args: argparse.Namespace) -> AutoscalerConfig | None:
    """The policy ``kvgate up`` runs (the defaults, between the flags' bounds), or None when off."""
    if not args.autoscale:
        return None
    if args.min_replicas < 0 or args.max_replicas < 1 or args.min_replicas > args.max_replicas:
        raise CommandError(
            f"need 0 <= --min-replicas <= --max-replicas and --max-replicas >= 1, got "
            f"{args.min_replicas} and {args.max_replicas}"
        )
    if args.autoscale_interval_s <= 0:
        raise CommandError(f"--autoscale-interval-s must be > 0, got {args.autoscale_interval_s:g}")
    return AutoscalerConfig(
        interval_s=args.autoscale_interval_s,
        policy=PoolPolicy(min_replicas=args.min_replicas, max_replicas=args.max_replicas),
    )


async def _run_up(args: argparse.Namespace, autoscaler: AutoscalerConfig | None) -> None:
    from gateway.autoscale_loop import run_up_loop
    from gateway.server import running_gateway
    from loadtest.sim.fleet import SimFleet

    async with SimFleet(
        replicas=args.replicas,
        profile=args.profile,
        time_scale=args.time_scale,
        cold_start_s=0.0,
        control_port=0,
    ) as fleet:
        profile = fleet.profile
        config = parse_config(
            {
                "server": {"host": args.host, "port": args.port},
                "models": [
                    {
                        "name": fleet.model,
                        "max_model_len": profile.max_model_len,
                        "kv_bytes_per_token": profile.kv_bytes_per_token,
                    }
                ],
                "pools": [
                    {
                        "name": UP_POOL,
                        "replicas": fleet.urls,
                        "kv_capacity_tokens": profile.kv_capacity_tokens,
                        "max_sequences": profile.max_num_seqs,
                    }
                ],
                "admission": {
                    "enabled": True,
                    "auth_enabled": False,
                    "max_active_sequences_per_replica": profile.max_num_seqs,
                },
                "routing": {"policy": "kvgate"},
                "autoscaler": None if autoscaler is None else autoscaler.model_dump(mode="json"),
                "access_log": {"format": "text"},
            },
            {},
            "kvgate up",
        )
        async with running_gateway(config, port=args.port) as gateway:
            print(up_banner(gateway.url, fleet.model, len(fleet.urls), args.profile), flush=True)
            if config.autoscaler is None or fleet.control_url is None:
                await gateway.serving
                return
            print(
                f"autoscaler: every {config.autoscaler.interval_s:g} s, "
                f"{args.min_replicas}..{args.max_replicas} replicas; "
                f"simulator control API {fleet.control_url}/replicas",
                flush=True,
            )
            loop = asyncio.create_task(
                run_up_loop(gateway.url, UP_POOL, fleet.control_url, config.autoscaler)
            )
            try:
                await gateway.serving
            finally:
                loop.cancel()
                await asyncio.gather(loop, return_exceptions=True)


def up_banner(url: str, model: str, replicas: int, profile: str) -> str:
    return f"""kvgate is up: {replicas} simulated {profile} replica(s) serving {model}
OpenAI base URL: {url}/v1        (Ctrl-C stops everything)

  curl {url}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'

  python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{url}/v1", api_key="unused")
reply = client.chat.completions.create(
    model="{model}", messages=[{{"role": "user", "content": "Hello!"}}], max_tokens=32
)
print(reply.choices[0].message.content, reply.usage)
PY
"""
