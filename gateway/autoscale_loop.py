"""The recommendation loop: read ``/signals``, ask the policy, hand each answer to an actuator.

``kvgate autoscale --gateway URL --actuator log|sim|kubernetes`` runs it as its own process, so it
can live next to whatever engine resizes the fleet. ``GatewayRecommender`` runs the same policy
inside the gateway on the gateway's own signals and publishes the answer as
``kvgate_autoscaler_desired_replicas`` (with the reason), for KEDA or an HPA to act on. The policy
itself is pure; this module only fetches, times and logs. A failed read or actuation is printed and
retried on the next tick: a missed tick is harmless, the policy's windows are measured in samples'
own timestamps.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from autoscaler.policy import Autoscaler, Recommendation
from config.autoscaler import AutoscalerConfig
from gateway.autoscale_actuators import (
    Actuator,
    KubernetesActuator,
    LogActuator,
    SimActuator,
    kubernetes_apps_api,
)
from gateway.metrics import GatewayMetrics
from gateway.signals import pool_signals

Clock = Callable[[], float]
ADMIN_TOKEN_ENV = "KVGATE_ADMIN_TOKEN"


async def fetch_signals(session: aiohttp.ClientSession, gateway_url: str) -> dict[str, Any]:
    async with session.get(f"{gateway_url.rstrip('/')}/signals") as response:
        response.raise_for_status()
        doc: dict[str, Any] = await response.json()
        return doc


async def tick(
    session: aiohttp.ClientSession,
    gateway_url: str,
    autoscaler: Autoscaler,
    actuator: Actuator,
    clock: Clock = time.monotonic,
) -> list[Recommendation]:
    """One read-decide-act round."""
    doc = await fetch_signals(session, gateway_url)
    recommendations = autoscaler.update(pool_signals(doc, clock()))
    for rec in recommendations:
        await actuator.apply(rec)
    return recommendations


async def run_loop(
    gateway_url: str,
    actuator_name: str,
    config: AutoscalerConfig,
    args: argparse.Namespace,
    iterations: int | None = None,
) -> None:
    timeout = aiohttp.ClientTimeout(total=max(30.0, config.interval_s * 4))
    async with aiohttp.ClientSession(timeout=timeout) as session:
        actuator = build_actuator(actuator_name, session, args)
        autoscaler = Autoscaler(config)
        done = 0
        while iterations is None or done < iterations:
            started_s = time.monotonic()
            try:
                await tick(session, gateway_url, autoscaler, actuator)
            except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
                print(f"autoscale: tick failed: {exc!r}", file=sys.stderr, flush=True)
            done += 1
            if iterations is None or done < iterations:
                await asyncio.sleep(max(0.0, config.interval_s - (time.monotonic() - started_s)))


def build_actuator(name: str, session: aiohttp.ClientSession, args: argparse.Namespace) -> Actuator:
    if name == "log":
        return LogActuator()
    if name == "sim":
        return SimActuator(
            session,
            _pairs(args.sim_control, "--sim-control"),
            cold_start_s=args.cold_start_s,
            gateway_url=args.gateway,
            admin_token=args.admin_token,
        )
    if name == "kubernetes":
        return KubernetesActuator(
            kubernetes_apps_api(), args.namespace, _pairs(args.deployment, "--deployment")
        )
    raise ValueError(f"unknown actuator {name!r}")


def _pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    """``POOL=VALUE`` items as a mapping."""
    out = {}
    for item in values or ():
        pool, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{flag} takes POOL=VALUE, got {item!r}")
        out[pool] = value
    return out


class GatewayRecommender:
    """The policy inside the gateway: publishes desired replicas per pool on its own metrics."""

    def __init__(
        self, metrics: GatewayMetrics, config: AutoscalerConfig, clock: Clock = time.monotonic
    ) -> None:
        self._metrics = metrics
        self._config = config
        self._clock = clock
        self._autoscaler = Autoscaler(config)

    def recommend(self) -> list[Recommendation]:
        recommendations = self._autoscaler.update(pool_signals(self._metrics.signals_doc(), self._clock()))
        for rec in recommendations:
            self._metrics.set_desired_replicas(rec.pool, rec.desired_replicas, rec.reason)
        return recommendations

    async def run(self) -> None:
        while True:
            self.recommend()
            await asyncio.sleep(self._config.interval_s)


def load_autoscaler_config(path: str | None, interval_s: float | None) -> AutoscalerConfig:
    data: dict[str, Any] = {}
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
    if interval_s is not None:
        data = {**data, "interval_s": interval_s}
    return AutoscalerConfig.model_validate(data)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("autoscale", help="the recommendation loop against a running gateway")
    parser.add_argument("--gateway", required=True, help="gateway base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--actuator", choices=["log", "sim", "kubernetes"], default="log", help="default log")
    parser.add_argument(
        "--config", default=None, help="YAML file with the autoscaler section (interval_s, policy, pools)"
    )
    parser.add_argument("--interval-s", type=float, default=None, help="seconds between rounds (default 15)")
    parser.add_argument(
        "--iterations", type=int, default=None, help="stop after this many rounds (default: never)"
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
        help=f"bearer token for the gateway's /admin/* (default: ${ADMIN_TOKEN_ENV}); the sim actuator "
        "sets the pool's replica set there",
    )
    parser.add_argument("--namespace", default="default", help="Kubernetes namespace (default default)")
    parser.add_argument(
        "--deployment", action="append", default=None, metavar="POOL=NAME", help="Deployment per pool"
    )
    parser.set_defaults(run=run_autoscale)


def run_autoscale(args: argparse.Namespace) -> int:
    try:
        config = load_autoscaler_config(args.config, args.interval_s)
        if args.actuator == "sim" and not args.sim_control:
            raise ValueError("--actuator sim needs --sim-control POOL=URL")
        if args.actuator == "kubernetes" and not args.deployment:
            raise ValueError("--actuator kubernetes needs --deployment POOL=NAME")
        _pairs(args.sim_control, "--sim-control")
        _pairs(args.deployment, "--deployment")
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"autoscale: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(run_loop(args.gateway, args.actuator, config, args, iterations=args.iterations))
    except ValueError as exc:
        print(f"autoscale: {exc}", file=sys.stderr)
        return 2
    return 0
