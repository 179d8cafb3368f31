"""``kvgate autoscale``: the recommendation loop (``kvgate.autoscaler.loop``) against running
gateways, with the actuator the flags name. Its ``--config`` is a kvgate config file, the one
``kvgate serve`` takes or one holding only an ``autoscaler:`` section (``kvgate.config.loop``);
flags win over ``KVGATE_*`` variables, which win over the file, as for ``kvgate serve``."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Mapping, Sequence

import aiohttp

from kvgate.autoscaler.actuators import (
    Actuator,
    KubernetesActuator,
    LogActuator,
    SimActuator,
    kubernetes_apis,
)
from kvgate.autoscaler.loop import GatewaySources, run_loop
from kvgate.cli.command import CommandError, http_url, report, warning
from kvgate.config.autoscaler import AutoscalerConfig
from kvgate.config.loader import ConfigError
from kvgate.config.loop import TOKEN_VARIABLE, LoopConfig, load_loop_config
from kvgate.config.renames import variable


def build_actuator(
    name: str,
    session: aiohttp.ClientSession,
    args: argparse.Namespace,
    admin_token: str | None,
    sources: GatewaySources | None = None,
) -> Actuator:
    if name == "log":
        return LogActuator()
    if name == "sim":
        return SimActuator(
            session,
            _pairs(args.sim_control, "--sim-control"),
            cold_start_s=args.cold_start_s,
            gateway_urls=args.gateway or (),
            admin_token=admin_token,
        )
    if name == "kubernetes":
        apps, pods = kubernetes_apis()
        return KubernetesActuator(
            apps,
            args.namespace,
            _pairs(args.deployment, "--deployment"),
            pods=pods,
            session=session,
            gateways=None if sources is None else sources.resolve,
            admin_token=admin_token,
            drain_timeout_s=args.drain_timeout_s,
            log=lambda line: report(args.prog, line),
        )
    raise CommandError(f"unknown actuator {name!r}")


def _pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    """``POOL=VALUE`` items as a mapping."""
    out = {}
    for item in values or ():
        pool, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"{flag} takes POOL=VALUE, got {item!r}")
        out[pool] = value
    return out


def loop_config(args: argparse.Namespace, environ: Mapping[str, str]) -> LoopConfig:
    """The loop's config from ``--config`` and ``environ``, ``--interval-s`` over both;
    ``CommandError`` listing every problem when bad, a warning line per old form still read."""
    environ = dict(environ)
    if args.interval_s is not None:
        environ[variable("autoscaler.interval_s")] = str(args.interval_s)
    try:
        return load_loop_config(args.config, environ, lambda message: warning(args.prog, message))
    except ConfigError as exc:
        raise CommandError(str(exc)) from None


def admin_token(args: argparse.Namespace, config: LoopConfig) -> str | None:
    """``--admin-token``, else the config's ``auth.admin_token``."""
    if args.admin_token is not None:
        return str(args.admin_token)
    token = config.auth.admin_token
    return None if token is None else token.get_secret_value()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("autoscale", help="the recommendation loop against running gateways")
    parser.add_argument(
        "--gateway",
        action="append",
        default=None,
        metavar="URL",
        help="gateway base URL, e.g. http://127.0.0.1:8080; repeat for each gateway (their signals add up)",
    )
    parser.add_argument(
        "--gateway-dns",
        action="append",
        default=None,
        metavar="URL",
        help="a URL whose host name resolves to every gateway (a headless Service); every address is "
        "read each round, e.g. http://kvgate-pods.inference.svc:8080",
    )
    parser.add_argument("--actuator", choices=["log", "sim", "kubernetes"], default="log", help="default log")
    parser.add_argument(
        "--config",
        default=None,
        help="kvgate config file (the one kvgate serve takes, or one with only an autoscaler: section); "
        "KVGATE_AUTOSCALER__* and KVGATE_AUTH__ADMIN_TOKEN variables override it",
    )
    parser.add_argument("--interval-s", type=float, default=None, help="seconds between rounds (default 15)")
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="stop after this many rounds (default: never); exit 1 when none of them succeeded",
    )
    parser.add_argument(
        "--sim-control",
        action="append",
        default=None,
        metavar="POOL=URL",
        help="simulator control URL per pool",
    )
    parser.add_argument(
        "--cold-start-s", type=float, default=None, help="cold start of replicas the sim actuator adds"
    )
    parser.add_argument(
        "--admin-token",
        default=None,
        help=f"bearer token for the gateways' /admin/* (default: the config's auth.admin_token, or "
        f"${TOKEN_VARIABLE}); the sim actuator sets the pool's replica set on every --gateway",
    )
    parser.add_argument("--namespace", default="default", help="Kubernetes namespace (default default)")
    parser.add_argument(
        "--deployment", action="append", default=None, metavar="POOL=NAME", help="Deployment per pool"
    )
    parser.add_argument(
        "--drain-timeout-s",
        type=float,
        default=600.0,
        help="kubernetes actuator: longest wait for the pods a scale-in removes to finish their "
        "requests, once out of routing, before the scale goes down anyway (default 600)",
    )
    parser.set_defaults(run=run_autoscale, prog=parser.prog)


def run_autoscale(args: argparse.Namespace) -> int:
    """0 when the loop ran (with ``--iterations``: when a round succeeded), 1 when every round of a
    bounded run failed (each failure already one line on stderr); bad arguments raise
    ``CommandError`` (exit 2)."""
    if not args.gateway and not args.gateway_dns:
        raise CommandError("give at least one --gateway URL or --gateway-dns URL")
    sources = GatewaySources(
        urls=tuple(http_url(u, "--gateway") for u in args.gateway or ()),
        dns_urls=tuple(http_url(u, "--gateway-dns") for u in args.gateway_dns or ()),
    )
    config = loop_config(args, os.environ)
    if args.actuator == "sim" and not args.sim_control:
        raise CommandError("--actuator sim needs --sim-control POOL=URL")
    if args.actuator == "kubernetes" and not args.deployment:
        raise CommandError("--actuator kubernetes needs --deployment POOL=NAME")
    _pairs(args.sim_control, "--sim-control")
    _pairs(args.deployment, "--deployment")
    succeeded = asyncio.run(_run(args, sources, config.autoscaler, admin_token(args, config)))
    return 1 if args.iterations is not None and args.iterations > 0 and succeeded == 0 else 0


async def _run(
    args: argparse.Namespace, sources: GatewaySources, config: AutoscalerConfig, token: str | None
) -> int:
    timeout = aiohttp.ClientTimeout(total=max(30.0, config.interval_s * 4))
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            actuator = build_actuator(args.actuator, session, args, token, sources)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        return await run_loop(
            session,
            sources,
            actuator,
            config,
            report=lambda line: report(args.prog, line),
            iterations=args.iterations,
        )
