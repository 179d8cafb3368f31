"""``kvgate autoscale``: the recommendation loop (``kvgate.autoscaler.loop``) against running
gateways, with the actuator the flags name."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from pydantic import ValidationError

from kvgate.autoscaler.actuators import (
    Actuator,
    KubernetesActuator,
    LogActuator,
    SimActuator,
    kubernetes_apps_api,
)
from kvgate.autoscaler.loop import GatewaySources, run_loop
from kvgate.cli.command import CommandError, http_url, report
from kvgate.config.autoscaler import AutoscalerConfig

ADMIN_TOKEN_ENV = "KVGATE_ADMIN_TOKEN"


def build_actuator(name: str, session: aiohttp.ClientSession, args: argparse.Namespace) -> Actuator:
    if name == "log":
        return LogActuator()
    if name == "sim":
        return SimActuator(
            session,
            _pairs(args.sim_control, "--sim-control"),
            cold_start_s=args.cold_start_s,
            gateway_urls=args.gateway or (),
            admin_token=args.admin_token,
        )
    if name == "kubernetes":
        return KubernetesActuator(
            kubernetes_apps_api(), args.namespace, _pairs(args.deployment, "--deployment")
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


def load_autoscaler_config(path: str | None, interval_s: float | None) -> AutoscalerConfig:
    """The policy from ``path`` (YAML; none: the defaults); ``CommandError`` in one line when bad."""
    data: Any = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
            raise CommandError(f"{path}: not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise CommandError(f"{path}: the autoscaler section must be a mapping")
    if interval_s is not None:
        data = {**data, "interval_s": interval_s}
    try:
        return AutoscalerConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise CommandError(f"{path or '--interval-s'}: {problems}") from None


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
        "--config", default=None, help="YAML file with the autoscaler section (interval_s, policy, pools)"
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
        default=os.environ.get(ADMIN_TOKEN_ENV),
        help=f"bearer token for the gateways' /admin/* (default: ${ADMIN_TOKEN_ENV}); the sim actuator "
        "sets the pool's replica set on every --gateway",
    )
    parser.add_argument("--namespace", default="default", help="Kubernetes namespace (default default)")
    parser.add_argument(
        "--deployment", action="append", default=None, metavar="POOL=NAME", help="Deployment per pool"
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
    config = load_autoscaler_config(args.config, args.interval_s)
    if args.actuator == "sim" and not args.sim_control:
        raise CommandError("--actuator sim needs --sim-control POOL=URL")
    if args.actuator == "kubernetes" and not args.deployment:
        raise CommandError("--actuator kubernetes needs --deployment POOL=NAME")
    _pairs(args.sim_control, "--sim-control")
    _pairs(args.deployment, "--deployment")
    succeeded = asyncio.run(_run(args, sources, config))
    return 1 if args.iterations is not None and args.iterations > 0 and succeeded == 0 else 0


async def _run(args: argparse.Namespace, sources: GatewaySources, config: AutoscalerConfig) -> int:
    timeout = aiohttp.ClientTimeout(total=max(30.0, config.interval_s * 4))
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            actuator = build_actuator(args.actuator, session, args)
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
