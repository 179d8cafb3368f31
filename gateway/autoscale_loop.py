"""The recommendation loop: read ``/signals``, ask the policy, hand each answer to an actuator.

``kvgate autoscale --gateway URL --actuator log|sim|kubernetes`` runs it as its own process, so it
can live next to whatever engine resizes the fleet; ``kvgate up`` runs it in-process against its
simulated fleet. ``GatewayRecommender`` runs the same policy inside the gateway on the gateway's own
signals and publishes the answer as ``kvgate_autoscaler_desired_replicas`` (with the reason), for
KEDA or an HPA to act on. The policy itself is pure; this module only fetches, times and logs.

Several gateways (sharing Redis, each serving its share of the clients) each see only their own
queue and traffic, so the loop reads every one (``--gateway`` repeated, or ``--gateway-dns`` naming a
headless Service whose addresses are all read each round) and merges their documents per pool
before the policy sees them (``merge_signals``). A round in which any gateway does not answer is
skipped, one line on stderr: a partial sum would read as less demand and could scale in. A missed
round is harmless, the policy's windows are measured in samples' own timestamps.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import aiohttp
import yaml
from pydantic import ValidationError

from autoscaler.policy import Autoscaler, Recommendation
from config.autoscaler import AutoscalerConfig
from gateway.autoscale_actuators import (
    Actuator,
    KubernetesActuator,
    LogActuator,
    SimActuator,
    kubernetes_apps_api,
)
from gateway.command import CommandError, http_url, report
from gateway.metrics import GatewayMetrics
from gateway.signals_window import pool_signals

Clock = Callable[[], float]
ADMIN_TOKEN_ENV = "KVGATE_ADMIN_TOKEN"

SUMMED = (
    "queued_requests",
    "queued_prompt_tokens",
    "pending_prompt_tokens",
    "resident_sequences",
    "remaining_decode_tokens",
    "prompt_tokens_per_s",
    "output_tokens_per_s",
    "requests_per_s",
)
"""Each gateway holds its own clients' requests: the pool's total is the sum."""
HIGHEST = (
    "replicas_current",
    "replicas_ready",
    "replicas_warming",
    "kv_occupancy_estimate_ratio",
    "kv_occupancy_scraped_ratio",
    "ttft_p95_s",
    "itl_p95_s",
    "queue_wait_p95_s",
    "e2e_p95_s",
)
"""Every gateway sees the same replicas and scrapes the same occupancy; quantiles do not add, and
the largest p95 is an upper bound of the fleet's p95 (conservative: it may scale out a little
early, never late)."""


class SignalsUnavailable(Exception):
    """A gateway's ``/signals`` could not be read; the message is one line naming the URL."""


async def fetch_signals(session: aiohttp.ClientSession, gateway_url: str) -> dict[str, Any]:
    url = f"{gateway_url.rstrip('/')}/signals"
    try:
        async with session.get(url) as response:
            response.raise_for_status()
            doc: dict[str, Any] = await response.json()
            return doc
    except aiohttp.ClientResponseError as exc:
        raise SignalsUnavailable(f"{url}: HTTP {exc.status} {exc.message}") from None
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise SignalsUnavailable(f"{url}: {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or exc.os_error})"
    return str(exc) or type(exc).__name__


def merge_signals(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One ``/signals`` document for the fleet from each gateway's: per pool, work and rates add,
    replica counts, occupancy and latency quantiles take the largest (see ``SUMMED``, ``HIGHEST``)."""
    if len(docs) == 1:
        return dict(docs[0])
    pools: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for name, p in doc.get("pools", {}).items():
            merged = pools.get(name)
            if merged is None:
                pools[name] = dict(p)
                continue
            for key in SUMMED:
                merged[key] = merged.get(key, 0) + p.get(key, 0)
            for key in HIGHEST:
                present = [v for v in (merged.get(key), p.get(key)) if v is not None]
                merged[key] = max(present) if present else None
            decisions = dict(merged.get("decisions", {}))
            for decision, n in p.get("decisions", {}).items():
                decisions[decision] = decisions.get(decision, 0) + n
            merged["decisions"] = decisions
    first = docs[0] if docs else {}
    return {**first, "gateways": len(docs), "pools": pools}


@dataclass(frozen=True, slots=True)
class GatewaySources:
    """Where the gateways are: fixed URLs, and URLs whose host names every gateway pod."""

    urls: tuple[str, ...] = ()
    dns_urls: tuple[str, ...] = ()

    async def resolve(self) -> list[str]:
        """Every gateway to read this round: the fixed URLs, then one per address of each DNS name."""
        out = list(self.urls)
        loop = asyncio.get_running_loop()
        for url in self.dns_urls:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            try:
                infos = await loop.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise SignalsUnavailable(f"cannot resolve {parts.hostname}: {exc.strerror or exc}") from None
            addresses = sorted({str(info[4][0]) for info in infos})
            out.extend(f"{parts.scheme}://{f'[{a}]' if ':' in a else a}:{port}" for a in addresses)
        return out


async def read_signals(session: aiohttp.ClientSession, gateways: Sequence[str]) -> dict[str, Any]:
    """Every gateway's document, merged; ``SignalsUnavailable`` when any one does not answer."""
    docs = await asyncio.gather(*(fetch_signals(session, url) for url in gateways))
    return merge_signals(docs)


async def tick(
    session: aiohttp.ClientSession,
    gateways: Sequence[str],
    autoscaler: Autoscaler,
    actuator: Actuator,
    clock: Clock = time.monotonic,
) -> list[Recommendation]:
    """One read-decide-act round."""
    doc = await read_signals(session, gateways)
    recommendations = autoscaler.update(pool_signals(doc, clock()))
    for rec in recommendations:
        await actuator.apply(rec)
    return recommendations


async def run_loop(
    session: aiohttp.ClientSession,
    sources: GatewaySources,
    actuator: Actuator,
    config: AutoscalerConfig,
    iterations: int | None = None,
    prog: str = "kvgate autoscale",
) -> int:
    """Rounds every ``config.interval_s`` until ``iterations`` (forever by default); the number that
    succeeded. A failed round is one error line for ``prog`` and the next round tries again."""
    autoscaler = Autoscaler(config)
    done = succeeded = 0
    while iterations is None or done < iterations:
        started_s = time.monotonic()
        try:
            await tick(session, await sources.resolve(), autoscaler, actuator)
            succeeded += 1
        except SignalsUnavailable as exc:
            report(prog, f"cannot read signals: {exc}")
        except aiohttp.ClientError as exc:
            report(prog, f"cannot act: {_describe(exc)}")
        done += 1
        if iterations is None or done < iterations:
            await asyncio.sleep(max(0.0, config.interval_s - (time.monotonic() - started_s)))
    return succeeded


class ChangeLog:
    """An actuator that prints one line when a pool's desired replicas change, then acts."""

    def __init__(self, actuator: Actuator, out: TextIO = sys.stdout) -> None:
        self._actuator = actuator
        self._out = out
        self._last: dict[str, int] = {}

    async def apply(self, recommendation: Recommendation) -> None:
        r = recommendation
        before = self._last.get(r.pool)
        if before != r.desired_replicas:
            was = "" if before is None else f"{before} -> "
            print(
                f"autoscaler: pool {r.pool}: {was}{r.desired_replicas} replica(s) ({r.reason})",
                file=self._out,
                flush=True,
            )
            self._last[r.pool] = r.desired_replicas
        await self._actuator.apply(r)


async def run_up_loop(gateway_url: str, controls: Mapping[str, str], config: AutoscalerConfig) -> None:
    """``kvgate up``'s loop: the gateway's signals resize each simulated pool (``controls``: pool
    name to its simulator's control URL, with its cold starts) and the gateway's replica set; each
    change printed."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0)) as session:
        actuator = ChangeLog(SimActuator(session, dict(controls), gateway_urls=[gateway_url]))
        await run_loop(session, GatewaySources(urls=(gateway_url,)), actuator, config, prog="kvgate up")


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
        return await run_loop(session, sources, actuator, config, iterations=args.iterations)
