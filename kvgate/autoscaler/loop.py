"""The recommendation loop: read ``/signals``, ask the policy, hand each answer to an actuator.

``kvgate autoscale --gateway URL --actuator log|sim|kubernetes`` runs it as its own process, so it
can live next to whatever engine resizes the fleet; ``kvgate up`` runs it in-process against its
simulated fleet. The policy itself is pure; this module only fetches, times and reports.

The loop reads every gateway (``--gateway`` repeated, or ``--gateway-dns`` naming a headless Service
whose addresses are all read each round) and merges their documents (``signals.merge_signals``). A
round in which any gateway does not answer is skipped, one line on stderr: a partial sum would read
as less demand and could scale in. A missed round is harmless, the policy's windows are measured in
samples' own timestamps.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

import aiohttp

from kvgate.autoscaler.actuators import Actuator
from kvgate.autoscaler.policy import Autoscaler
from kvgate.autoscaler.recommendation import Recommendation
from kvgate.autoscaler.signals import merge_signals, pool_signals
from kvgate.config.autoscaler import AutoscalerConfig
from kvgate.vocabulary.clock import Clock

Report = Callable[[str], None]
"""Where a failed round's one line goes (the command line prints it as its error line)."""


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
    clock: Clock = time.time,
) -> list[Recommendation]:
    """One read-decide-act round. Samples are stamped with the wall clock: the policy measures its
    windows in their differences, and its forecast and schedule read the time of day from them."""
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
    report: Report,
    iterations: int | None = None,
) -> int:
    """Rounds every ``config.interval_s`` until ``iterations`` (forever by default); the number that
    succeeded. A failed round is one line to ``report`` and the next round tries again."""
    autoscaler = Autoscaler(config)
    done = succeeded = 0
    while iterations is None or done < iterations:
        started_s = time.monotonic()
        try:
            await tick(session, await sources.resolve(), autoscaler, actuator)
            succeeded += 1
        except SignalsUnavailable as exc:
            report(f"cannot read signals: {exc}")
        except aiohttp.ClientError as exc:
            report(f"cannot act: {_describe(exc)}")
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
