"""Goodput by routing policy: kvgate against round-robin, least-request and the Rust routers, one trace.

Three simulated fleets of the same size and profile (each this module re-run as ``--fleet-child``:
a ``SimFleet`` with the replicas' own warm-up turned off, so no policy meets a cold engine), three
gateways (``kvgate serve``) that differ only in ``kvgate.routing.policy``, each in front of its own fleet,
and this driver. With ``--peers`` (default: every one installed, see ``bench.peers``), each
``vllm-router`` or ``sglang-router`` policy is one more target in front of one more fleet of its
own; a peer that is not installed or does not come up is named in one line and left out. The trace
mixes the ``mixed`` preset's short and 30,000-token requests with ``shared-prefix`` sessions (system
prompts shared by multi-turn conversations); the fleets' KV caches are cut down so they cannot hold
every system prompt at once, as a loaded fleet cannot. The trace is played through
``kvgate.loadtest.compare.run_compare``: cut into time slices, each slice played against every target in
rotating order, the same bytes to each.

Printed per target: goodput (requests meeting both SLOs: TTFT, and mean inter-token gap), p95 TTFT,
p95 inter-token gap, the fleet's prefix-cache hit rate and preemptions over the run (the replicas'
own ``vllm:prefix_cache_*`` and ``vllm:num_preemptions`` counters; beside the hit rate, ``hit 1st``
counts each request's first schedule only, leaving out the re-prefills after preemption), ratios
against round-robin, whether the simulator lagged (``kvgate_sim_lag_ratio``, the worst replica)
and whether the generator kept its schedule and was CPU-bound (the runner's own report). A PNG shows
goodput, hit rate and the TTFT CDFs. Not a test.

    python -m bench.bench_goodput [--replicas 4] [--rate 16] [--duration-s 36] [--slices 3]
        [--peers all|none|NAME,...] [--peer-bin-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import peers
from bench.processes import processes
from bench.routing_lab import traces
from kvgate.loadtest.client import RequestRecord, RetryPolicy, wait_until_ok
from kvgate.loadtest.compare import ratios, run_compare, summaries_for
from kvgate.loadtest.report import Slo, Summary, class_table, percentile
from kvgate.loadtest.runner import RunOptions, RunResult, Target
from kvgate.loadtest.workload import Workload, build_trace, parse_workload
from kvgate.routing.prefix_hash import BLOCK_SIZE_TOKENS
from kvgate.sim.fleet import DEFAULT_MODEL, SimFleet
from kvgate.sim.ports import free_ports

POLICIES = ("kvgate", "round_robin", "least_request")
BASELINE = "round_robin"
KVGATE = os.path.join(os.path.dirname(sys.executable), "kvgate")
SIM_LAG_LIMIT_RATIO = 0.05


def workload(rate_rps: float, duration_s: float, slo_ttft_s: float, slo_itl_s: float) -> Workload:
    """``mixed``'s two classes next to ``shared-prefix`` sessions, open loop, Poisson."""
    return parse_workload(
        {
            "name": "mixed+shared-prefix",
            "api": "chat",
            "duration_s": duration_s,
            "rate_rps": rate_rps,
            "slo_ttft_s": slo_ttft_s,
            "slo_itl_s": slo_itl_s,
            "classes": [
                {
                    "name": "session",
                    "weight": 0.6,
                    "system_prompts": 16,
                    "system_prompt_tokens": {"uniform": [2000, 4000]},
                    "turns": {"uniform": [3, 6]},
                    "live_sessions": 32,
                    "prompt_tokens": {"lognormal": {"median": 150, "sigma": 0.5, "min": 20, "max": 600}},
                    "output_tokens": {"lognormal": {"median": 150, "sigma": 0.5, "min": 20, "max": 400}},
                },
                {"name": "short", "weight": 0.35, "prompt_tokens": 50, "output_tokens": 20},
                {"name": "long", "weight": 0.05, "prompt_tokens": 30000, "output_tokens": 2000},
            ],
        }
    )


@dataclass(frozen=True, slots=True)
class FleetCounters:
    prefix_hits_tokens: float
    prefix_queries_tokens: float
    first_schedule_hits_tokens: float
    first_schedule_queries_tokens: float
    preemptions: float
    lag_ratio: float
    """The worst replica's ``kvgate_sim_lag_ratio`` (cumulative lag over busy time)."""


@dataclass(frozen=True, slots=True)
class PolicyRun:
    policy: str
    summary: Summary
    result: RunResult
    hit_ratio: float
    preemptions: int
    lag_ratio: float
    hit_tokens: float = 0.0
    """Prompt tokens the replicas found in their prefix cache: prefill saved. A preempted sequence's
    prompt, scheduled again, queries (and hits) a second time, so this and the hit rate count it."""
    prefilled_tokens: float = 0.0
    """Prompt tokens the replicas computed (queries less hits), re-prefills after preemption included."""
    first_schedule_hit_ratio: float = 0.0
    """The hit rate over each request's first schedule only (``kvgate_sim_first_schedule_prefix_*``):
    what routing found cached for the prompts it placed, without the preempted prompts that, scheduled
    again, find their own blocks."""


async def serve_fleet(
    replicas: int, time_scale: float, kv_capacity_tokens: int, max_num_seqs: int, seed: int
) -> None:
    """The ``--fleet-child`` mode: print the replicas' URLs as one JSON line, serve until SIGTERM."""
    overrides = {"warmup_s": 0.0, "kv_capacity_tokens": kv_capacity_tokens, "max_num_seqs": max_num_seqs}
    async with SimFleet(replicas=replicas, time_scale=time_scale, seed=seed, overrides=overrides) as fleet:
        print(orjson.dumps(fleet.urls).decode(), flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()


def gateway_config(
    urls: Sequence[str],
    port: int,
    policy: str,
    kv_capacity_tokens: int,
    admission: bool = True,
    max_sequences: int = 256,
    slo: Slo | None = None,
) -> dict[str, Any]:
    """A gateway differing from the others only in ``kvgate.routing.policy``; with ``admission`` off every
    request is routed at once, as the Rust routers do, so the rows compare routing alone. With
    ``slo``, the model's objectives are the trace's, as an operator serving that SLO sets them: a
    request that would wait past its TTFT objective is refused at once, and each replica runs no more
    sequences than keep its inter-token latency within the ITL objective."""
    objectives = {} if slo is None else {"ttft_slo_s": slo.ttft_s, "itl_slo_s": slo.itl_s}
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "health": {"interval_s": 0.5},
        "models": [{"name": DEFAULT_MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}],
        "pools": [
            {
                "name": "default",
                "replicas": list(urls),
                # What the replicas hold: their cache is whole blocks.
                "kv_capacity_tokens": kv_capacity_tokens // BLOCK_SIZE_TOKENS * BLOCK_SIZE_TOKENS,
                "max_sequences": max_sequences,
            }
        ],
        "routing": {"policy": policy, "warmup_s": 0},
        "admission": {
            "max_queue_wait_s": 30,
            # The driver's clients honour a Retry-After of at most 30 s (``--retries``).
            "retry_after_cap_s": 30,
            "enabled": admission,
            "models": {DEFAULT_MODEL: objectives} if objectives else {},
        },
    }


def start_fleet(started: list[subprocess.Popen[bytes]], args: argparse.Namespace) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "bench.bench_goodput",
        "--fleet-child",
        "--replicas",
        str(args.replicas),
        "--time-scale",
        str(args.time_scale),
        "--kv-capacity-tokens",
        str(args.kv_capacity_tokens),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--seed",
        str(args.seed),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE)
    started.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"simulated fleet exited with {proc.wait()}")
    urls: list[str] = orjson.loads(line)
    return urls


def start_gateway(
    started: list[subprocess.Popen[bytes]], urls: Sequence[str], policy: str, args: argparse.Namespace
) -> str:
    port = free_ports()
    config = gateway_config(
        urls,
        port,
        policy,
        args.kv_capacity_tokens,
        args.admission == "on",
        args.max_num_seqs,
        Slo(args.slo_ttft_s, args.slo_itl_s) if args.slo_admission == "on" else None,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as file:
        yaml.safe_dump(config, file)
    started.append(
        subprocess.Popen(
            [KVGATE, "serve", "--config", file.name, "--log-level", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    return f"http://127.0.0.1:{port}"


def start_peer(
    started: list[subprocess.Popen[bytes]], peer: peers.Peer, binary: str, urls: Sequence[str]
) -> tuple[subprocess.Popen[bytes], str, str]:
    """The peer's process, its URL and the file its output goes to (named when it fails)."""
    port = free_ports(2)
    with tempfile.NamedTemporaryFile(
        "wb", prefix=f"bench-{peer.program}-", suffix=".log", delete=False
    ) as log:
        proc = subprocess.Popen(
            peer.command(binary, urls, port, port + 1), stdout=log, stderr=subprocess.STDOUT
        )
    started.append(proc)
    return proc, f"http://127.0.0.1:{port}", log.name


def installed_peers(args: argparse.Namespace) -> list[tuple[peers.Peer, str]]:
    """The chosen peers whose program is found, each with its path; one line for each that is not."""
    found = []
    for peer in peers.select(args.peers):
        binary = peers.locate(peer.program, args.peer_bin_dir)
        if binary is None:
            print(f"{peer.name}: {peer.program} not found (pip install 'kvgate[bench]'), left out")
        else:
            found.append((peer, binary))
    return found


async def fleet_counters(session: aiohttp.ClientSession, urls: Sequence[str]) -> FleetCounters:
    hits = queries = first_hits = first_queries = preemptions = lag = 0.0
    for url in urls:
        async with session.get(url + "/metrics") as response:
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:prefix_cache_hits_total":
                    hits += sample.value
                elif sample.name == "vllm:prefix_cache_queries_total":
                    queries += sample.value
                elif sample.name == "kvgate_sim_first_schedule_prefix_hits_total":
                    first_hits += sample.value
                elif sample.name == "kvgate_sim_first_schedule_prefix_queries_total":
                    first_queries += sample.value
                elif sample.name == "vllm:num_preemptions_total":
                    preemptions += sample.value
                elif sample.name == "kvgate_sim_lag_ratio":
                    lag = max(lag, sample.value)
    return FleetCounters(hits, queries, first_hits, first_queries, preemptions, lag)


def _fmt(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or base == 0:
        return "-"
    return f"{value / base:.2f}x"


@dataclass(frozen=True, slots=True)
class RetryOutcomes:
    """What became of the requests refused at their first attempt (with ``--retries``): ``retried``
    came back after the Retry-After they were given, ``first_retry_ok`` were admitted then, and
    ``told_not_to_retry`` were refused with ``x-should-retry: false`` or a wait past the client's."""

    refused_first: int
    retried: int
    first_retry_ok: int
    told_not_to_retry: int
    admitted_ttft_p95_s: float | None
    """TTFT of the attempt that was admitted (the wait out of a Retry-After taken off)."""

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> RetryOutcomes:
        retried = [r for r in records if r.retries >= 1]
        stopped = [r for r in records if r.retries == 0 and r.rejected]
        return cls(
            len(retried) + len(stopped),
            len(retried),
            sum(1 for r in retried if r.retries == 1 and r.ok),
            len(stopped),
            percentile(
                [r.ttft_s - r.wait_honoured_s for r in records if r.ok and r.ttft_s is not None], 0.95
            ),
        )

    def line(self) -> str:
        share = f"{self.first_retry_ok / self.retried:.0%}" if self.retried else "-"
        return (
            f"refused at first {self.refused_first}, retried {self.retried}, first retry admitted "
            f"{self.first_retry_ok} ({share}), told not to retry {self.told_not_to_retry}; TTFT p95 of "
            f"the admitted attempt {_fmt(self.admitted_ttft_p95_s)} s"
        )


def print_table(runs: Sequence[PolicyRun], slo: Slo) -> None:
    print(
        f"\nSLO: TTFT <= {slo.ttft_s:g} s and mean inter-token gap <= {slo.itl_s * 1000:g} ms\n"
        f"{'target':<18} {'requests':>8} {'ok':>5} {'429':>5} {'goodput':>8} {'good %':>7} {'good/s':>7} "
        f"{'ttft p50':>9} {'ttft p95':>9} {'itl p95 ms':>10} {'prefix hit':>10} {'hit 1st':>7} "
        f"{'saved M':>7} {'prefill M':>9} {'preempt':>7} {'sim lag':>8}"
    )
    for run in runs:
        s = run.summary
        print(
            f"{run.policy:<18} {s.requests:>8} {s.ok:>5} {s.rejects:>5} {s.goodput_requests:>8} "
            f"{100 * s.goodput_ratio:>6.1f}% {s.goodput_rps:>7.2f} {_fmt(s.ttft_p50_s):>9} "
            f"{_fmt(s.ttft_p95_s):>9} {_fmt(s.itl_p95_s, 1000, 1):>10} {run.hit_ratio:>10.3f} "
            f"{run.first_schedule_hit_ratio:>7.3f} {run.hit_tokens / 1e6:>7.3f} "
            f"{run.prefilled_tokens / 1e6:>9.3f} "
            f"{run.preemptions:>7} {run.lag_ratio:>8.3f}"
        )
    base = next((run for run in runs if run.policy == BASELINE), runs[0])
    table = ratios([run.summary for run in runs], base.policy)
    print(f"\nagainst {base.policy} (goodput and hit rate above 1, TTFT and ITL below 1 are better):")
    for run in runs:
        if run is base:
            continue
        s, b = run.summary, base.summary
        print(
            f"  {run.policy:<18} goodput {_ratio(table[run.policy]['goodput'], 1.0)}, "
            f"ttft p95 {_ratio(s.ttft_p95_s, b.ttft_p95_s)}, itl p95 {_ratio(s.itl_p95_s, b.itl_p95_s)}, "
            f"prefix hit rate {_ratio(run.hit_ratio, base.hit_ratio)} "
            f"(first schedules {_ratio(run.first_schedule_hit_ratio, base.first_schedule_hit_ratio)})"
        )
    print()
    for run in runs:
        print(f"  {run.policy:<18} {RetryOutcomes.of(run.result.records).line()}")
    print()
    for run in runs:
        s = run.summary
        lag = "LAGGED: results invalid" if run.lag_ratio > SIM_LAG_LIMIT_RATIO else "kept up"
        schedule = "kept its schedule" if s.schedule_kept else "fell behind its schedule"
        bound = "CPU-bound" if s.cpu_bound else "not CPU-bound"
        print(
            f"  {run.policy:<18} simulator {lag} (lag ratio {run.lag_ratio:.3f}, limit "
            f"{SIM_LAG_LIMIT_RATIO}); generator {schedule} (send lag p99 {_fmt(s.lag_p99_s, 1000, 1)} ms), "
            f"{bound} ({s.cpu_ratio:.0%} of one core, {s.cpu_per_request_ms:.1f} ms/request)"
        )


def plot(runs: Sequence[PolicyRun], slo: Slo, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [run.policy for run in runs]
    fig, (goodput_ax, hit_ax, ttft_ax) = plt.subplots(1, 3, figsize=(13, 4))
    goodput_ax.bar(names, [100 * run.summary.goodput_ratio for run in runs], color="tab:green")
    goodput_ax.set_ylabel("requests meeting both SLOs (%)")
    goodput_ax.set_title("goodput")
    hit_ax.bar(names, [100 * run.hit_ratio for run in runs], color="tab:blue")
    hit_ax.set_ylabel("prefix-cache hits / queries (tokens, %)")
    hit_ax.set_title("fleet prefix-cache hit rate")
    for ax in (goodput_ax, hit_ax):
        ax.tick_params(axis="x", labelrotation=30)
    for run in runs:
        ttft = sorted(r.ttft_s for r in run.result.records if r.ok and r.ttft_s is not None)
        if ttft:
            ttft_ax.plot(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))], label=run.policy)
    ttft_ax.axvline(slo.ttft_s, color="grey", linestyle="--", label="TTFT SLO")
    ttft_ax.set_xscale("log")
    ttft_ax.set_xlabel("time to first token (s)")
    ttft_ax.set_ylabel("share of successful requests")
    ttft_ax.set_title("TTFT CDF")
    ttft_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


async def bench(args: argparse.Namespace) -> None:
    slo = Slo(args.slo_ttft_s, args.slo_itl_s)
    if args.trace == "mixed":
        trace = build_trace(workload(args.rate, args.duration_s, slo.ttft_s, slo.itl_s), args.seed)
    else:
        trace = traces.TRACES[args.trace].trace(args.seed)
    classes: dict[str, int] = {}
    for request in trace.requests:
        classes[request.class_name] = classes.get(request.class_name, 0) + 1
    mix = ", ".join(f"{n} {c}" for c, n in sorted(classes.items()))
    found = installed_peers(args)
    print(
        f"{len(trace.requests)} requests over {args.duration_s:g} s at {args.rate:g} req/s ({mix}; "
        f"{trace.prompt_tokens} prompt tokens); {len(args.policies) + len(found)} fleets of {args.replicas} "
        f"simulated llama-3.1-8b-h100 replicas (KV {args.kv_capacity_tokens} tokens each, time scale "
        f"{args.time_scale:g}), one gateway or router per target, {args.slices} interleaved slices"
    )
    with processes() as started:
        names = [*args.policies, *(p.name for p, _ in found)]
        fleets = {name: start_fleet(started, args) for name in names}
        gateways = {policy: start_gateway(started, fleets[policy], policy, args) for policy in args.policies}
        routers = {peer: start_peer(started, peer, binary, fleets[peer.name]) for peer, binary in found}
        async with aiohttp.ClientSession() as session:
            for url in gateways.values():
                await wait_until_ok(session, url + "/readyz")
            for peer, (proc, url, log) in routers.items():
                why_not = await peers.ready(session, proc, url)
                if why_not is None:
                    gateways[peer.name] = url
                else:
                    print(f"{peer.name}: did not start ({why_not}; output in {log}), left out")
            before = {name: await fleet_counters(session, fleets[name]) for name in gateways}
            targets = [Target(name, url, DEFAULT_MODEL) for name, url in gateways.items()]
            retry = RetryPolicy(max_retries=args.retries, max_header_wait_s=30.0) if args.retries else None
            results = await run_compare(
                targets,
                trace,
                RunOptions(retry=retry, progress=sys.stderr),
                slice_count=args.slices,
                same_prompts=True,
            )
            after = {name: await fleet_counters(session, fleets[name]) for name in gateways}
    runs = []
    for result, summary in zip(results, summaries_for(results, slo), strict=True):
        policy = result.target.name
        queries = after[policy].prefix_queries_tokens - before[policy].prefix_queries_tokens
        hits = after[policy].prefix_hits_tokens - before[policy].prefix_hits_tokens
        preemptions = int(after[policy].preemptions - before[policy].preemptions)
        hit_ratio = hits / queries if queries else 0.0
        first = after[policy].first_schedule_hits_tokens, after[policy].first_schedule_queries_tokens
        first_hits = first[0] - before[policy].first_schedule_hits_tokens
        first_queries = first[1] - before[policy].first_schedule_queries_tokens
        runs.append(
            PolicyRun(
                policy,
                summary,
                result,
                hit_ratio,
                preemptions,
                after[policy].lag_ratio,
                hits,
                queries - hits,
                first_hits / first_queries if first_queries else 0.0,
            )
        )
    print_table(runs, slo)
    print("\nby request class:\n" + class_table(results, slo))
    plot(runs, slo, args.png)
    print(f"\nplot: {args.png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--replicas", type=int, default=4, help="replicas per fleet (default 4)")
    parser.add_argument("--rate", type=float, default=16.0, help="offered requests/s (default 16)")
    parser.add_argument("--duration-s", type=float, default=36.0, help="trace length (default 36)")
    parser.add_argument("--slices", type=int, default=3, help="interleaved slices (default 3)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator time scale (default 1)")
    parser.add_argument(
        "--kv-capacity-tokens", type=int, default=100_000, help="KV cache per replica (default 100000)"
    )
    parser.add_argument("--slo-ttft-s", type=float, default=1.0, help="TTFT SLO (default 1 s)")
    parser.add_argument(
        "--slo-itl-s", type=float, default=0.05, help="mean inter-token gap SLO (default 0.05 s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--trace",
        choices=("mixed", *traces.TRACES),
        default="mixed",
        help="mixed (default: this module's trace, set by --rate and --duration-s) or one of "
        "bench.routing_lab.traces (its own rate, duration, fleet shape and SLO replace those options)",
    )
    parser.add_argument(
        "--max-num-seqs", type=int, default=256, help="sequence slots per replica (default 256)"
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=0,
        help="times a client honours a 429's Retry-After (up to 30 s) and retries (default 0)",
    )
    parser.add_argument(
        "--admission",
        choices=("on", "off"),
        default="on",
        help="kvgate's admission in the kvgate rows (default on; off compares routing alone)",
    )
    parser.add_argument(
        "--slo-admission",
        choices=("on", "off"),
        default="on",
        help="give the kvgate rows the trace's TTFT and ITL objectives (admission.models.<m>.ttft_slo_s, "
        "itl_slo_s) as an operator serving that SLO would (default on)",
    )
    parser.add_argument(
        "--policies",
        type=lambda text: tuple(p for p in text.split(",") if p),
        default=POLICIES,
        help=f"kvgate routing policies to run, comma-separated (default {','.join(POLICIES)})",
    )
    parser.add_argument(
        "--peers",
        default="all",
        help=f"Rust routers to add: all (default; those installed), none, or some of "
        f"{', '.join(p.name for p in peers.PEERS)}",
    )
    parser.add_argument(
        "--peer-bin-dir", type=Path, help="where the routers' scripts are (e.g. another venv's bin)"
    )
    parser.add_argument("--png", type=Path, default=Path("bench_goodput.png"), help="plot path")
    parser.add_argument("--fleet-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trace != "mixed":
        chosen = traces.TRACES[args.trace]
        args.rate, args.duration_s = chosen.rate_rps, chosen.duration_s
        args.slo_ttft_s, args.slo_itl_s = chosen.slo_ttft_s, chosen.slo_itl_s
        args.replicas = chosen.replicas
        args.kv_capacity_tokens = chosen.profile_overrides["kv_capacity_tokens"]
        args.max_num_seqs = chosen.profile_overrides["max_num_seqs"]
    import uvloop

    if args.fleet_child:
        uvloop.run(
            serve_fleet(args.replicas, args.time_scale, args.kv_capacity_tokens, args.max_num_seqs, args.seed)
        )
    else:
        uvloop.run(bench(args))


if __name__ == "__main__":
    main()
