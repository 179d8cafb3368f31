"""The chaos scenarios of clients too slow to serve: streams whose clients stop reading, and
slowloris headers and slow bodies beyond the gateway's descriptors. Each must be cut off by a
timeout while ordinary requests are still answered."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from bench.chaos.attackers import RawResult, slow_reader_socket, trickle
from bench.chaos.checks import (
    SLACK_S,
    TIMEOUTS,
    Run,
    Scenario,
    Setting,
    bounded,
    gateway_data,
    with_gateway,
)
from bench.chaos.clients import COMPLETE, ERROR_ANSWER, Outcome, StreamClient, completion_body
from bench.chaos.gauges import KV_ESTIMATE, read_work
from bench.chaos.stage import footprint


async def slow_readers(run: Run) -> Scenario:
    k = run.args.slow_readers
    hold_s = run.args.hold_s
    scenario = Scenario("slow_readers", f"{k} streaming clients stop reading for {hold_s:g} s")

    async def body(run: Run, s: Scenario, setting: Setting) -> None:
        url, port = setting.url, setting.port
        socks = [slow_reader_socket(port, completion_body(6000)) for _ in range(k)]
        s.event(f"{k} streams sent; their clients never read")
        known = "server.send_timeout_s" not in run.unknown_keys
        released_at: float | None = None
        remaining_before = 0.0
        """Decode tokens the streams still had to generate at the last reading before the release:
        above 0, the release came from the send timeout, not from the generations finishing."""
        peak_kv = 0.0
        try:
            end = time.monotonic() + hold_s
            start = time.monotonic()
            while time.monotonic() < end:
                await asyncio.sleep(0.5)
                work = await read_work(run.session, url)
                peak_kv = max(peak_kv, work[KV_ESTIMATE])
                if released_at is not None:
                    continue
                if work["kvgate_resident_sequences"] == 0 and time.monotonic() > start + 1:
                    released_at = time.monotonic() - start
                else:
                    remaining_before = work["kvgate_remaining_decode_tokens"]
            held = await read_work(run.session, url)
            s.figures["peak_kv_estimate_ratio"] = round(peak_kv, 4)
            s.figures["held_after_hold"] = held
            ok = released_at is not None and remaining_before > 0
            reason = "" if known else " (server.send_timeout_s unknown today: no send timeout)"
            s.check(
                "reservations of non-reading clients released while their sockets stay open, before "
                "their generations would have ended",
                ok,
                (
                    f"released after {released_at:.1f} s (the buffers between gateway and client filled, "
                    f"then send_timeout_s {TIMEOUTS['send_timeout_s']:g} s) with {remaining_before:g} "
                    "decode tokens still to generate"
                    if released_at is not None
                    else f"after {hold_s:g} s still held: {held['kvgate_resident_sequences']:g} sequences, "
                    f"KV estimate {held[KV_ESTIMATE]:.1%}{reason}"
                ),
            )
        finally:
            for sock in socks:
                sock.close()
            s.event("slow readers closed their sockets")

    await with_gateway(run, scenario, 2, gateway_data, body)
    return scenario


async def slowloris(run: Run) -> Scenario:
    loris, slow_bodies, nofile = run.args.slowloris, run.args.slow_bodies, run.args.nofile
    hold_s = run.args.hold_s
    scenario = Scenario(
        "slowloris",
        f"{loris} partial-header and {slow_bodies} slow-body connections for {hold_s:g} s "
        f"against a gateway limited to {nofile} descriptors",
    )

    def data(urls: list[str]) -> dict[str, Any]:
        return gateway_data(urls, server={"max_connections": nofile - 128})

    async def body(run: Run, s: Scenario, setting: Setting) -> None:
        url, port, proc = setting.url, setting.port, setting.proc
        started = time.monotonic()
        partial = b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: "
        slow = b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 100000\r\n\r\n{"
        attack = [
            asyncio.create_task(trickle(port, partial, b"a", 2.0, hold_s, started)) for _ in range(loris)
        ]
        attack += [
            asyncio.create_task(trickle(port, slow, b" ", 2.0, hold_s, started)) for _ in range(slow_bodies)
        ]
        s.event(f"{loris + slow_bodies} hostile connections opening")
        probes: list[Outcome] = []
        while time.monotonic() - started < hold_s:
            await asyncio.sleep(1.0)
            client = StreamClient(url + "/v1/completions", completion_body(4, stream=False))
            probes.append(await bounded(run, client))
        s.figures["fds_during_attack"] = footprint(proc)[1]
        results: list[RawResult] = list(await asyncio.gather(*attack))
        s.event("attack over")
        for label, group, key in (
            ("slowloris", results[:loris], "header_timeout_s"),
            ("slow bodies", results[loris:], "body_timeout_s"),
        ):
            limit_s = TIMEOUTS[key] + SLACK_S
            closed = [r for r in group if r.closed_at_s is not None and r.closed_at_s <= limit_s]
            answers = Counter(r.first_bytes[:12].decode(errors="replace") for r in group if r.first_bytes)
            s.figures[f"{label}_closed_in_time"] = len(closed)
            s.figures[f"{label}_ends"] = dict(Counter(r.how for r in group))
            s.figures[f"{label}_answers"] = dict(answers)
            note = "" if f"server.{key}" not in run.unknown_keys else f" (server.{key} unknown today)"
            s.check(
                f"{label} closed within {key} + {SLACK_S:g} s",
                len(closed) == len(group),
                f"{len(closed)}/{len(group)} closed by {limit_s:g} s, "
                f"{len(group) - sum(r.closed_at_s is not None for r in group)} still open at {hold_s:g} s"
                f"{note}",
            )
        answered = [p for p in probes if p.kind == COMPLETE or (p.kind == ERROR_ANSWER and p.status == 503)]
        s.figures["probes_during_attack"] = dict(Counter(f"{p.kind}:{p.status}" for p in probes))
        s.check(
            "ordinary requests served during the attack",
            len(answered) == len(probes),
            f"{len(answered)}/{len(probes)} served (200) or refused by a connection cap (503); others: "
            f"{Counter(p.detail[:90] for p in probes if p not in answered).most_common(2)}",
        )
        await asyncio.sleep(1.0)
        fds = footprint(proc)[1]
        s.check(
            "descriptors back near the start once attackers leave",
            fds <= s.figures["fds_before"] + 20,
            f"{s.figures['fds_before']} before, {s.figures['fds_during_attack']} during, {fds} after",
        )

    await with_gateway(run, scenario, 1, data, body, nofile=nofile)
    return scenario
