"""Mixed against prefill/decode disaggregated, at the same number of simulated GPUs, on two traces.

For each trace (``prefill-heavy``: mostly long prompts with short answers beside chat turns;
``decode-heavy``: short prompts with long answers beside a few long prompts), simulated fleets of
``--gpus`` replicas each: one mixed fleet behind kvgate, one split ``--prefill`` prefill + the rest
decode behind kvgate (``role: prefill`` / ``role: decode`` pools, docs/pd.md) and, when
``vllm-router`` is installed (``--peer-bin-dir``) and its P/D mode comes up, one more P/D fleet behind
``vllm-router --vllm-pd-disaggregation``. Every fleet is this module re-run as ``--fleet-child`` (its
replicas' warm-up off); the simulator's decode replicas pull each prompt's KV from the prefill
replica and charge its bytes over ``kv_link_bytes_per_s``. The trace is played through
``kvgate.loadtest.compare.run_compare`` (slices interleaved across targets, the same bytes to each).

Printed per trace and target: requests, successes, goodput (both SLOs met: TTFT and the mean
inter-token gap), TTFT p50/p95, inter-token gap p50/p95/p99, and the ITL stability P/D is for: the
p95 over requests of each stream's longest gap (a mixed replica stalls its decodes while it runs a
long prefill), with ratios against the mixed row, and whether each fleet's simulator kept its
schedule (``kvgate_sim_lag_ratio``). A markdown table and a PNG (goodput, ITL p99,
worst-gap p95 and the gap CDFs) are written. Not a test.

    python -m bench.bench_pd [--gpus 4] [--prefill 2] [--rate 6] [--duration-s 20] [--slices 2]
        [--traces prefill-heavy,decode-heavy] [--peer-bin-dir /tmp/peersvenv/bin]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import peers
from bench.processes import processes
from kvgate.loadtest.client import wait_until_ok
from kvgate.loadtest.compare import run_compare, summaries_for
from kvgate.loadtest.report import Slo, Summary
from kvgate.loadtest.runner import RunOptions, RunResult, Target
from kvgate.loadtest.workload import Workload, build_trace
from kvgate.loadtest.workload_file import parse_workload
from kvgate.sim.fleet import DEFAULT_MODEL, SimFleet
from kvgate.sim.ports import free_ports

KVGATE = str(Path(sys.executable).parent / "kvgate")
MIXED = "kvgate mixed"
PD = "kvgate P/D"
ROUTER_PD = "vllm-router P/D"
TRACES = ("prefill-heavy", "decode-heavy")
SIM_LAG_LIMIT_RATIO = 0.05
CHAT = {"lognormal": {"median": 300, "sigma": 0.4, "min": 50, "max": 1000}}


def workload(name: str, rate_rps: float, duration_s: float, slo: Slo) -> Workload:
    """The two traces: the long prompts are what a mixed replica interleaves with its decodes."""
    if name == "prefill-heavy":
        classes = [
            {
                "name": "long-prompt",
                "weight": 0.7,
                "prompt_tokens": {"uniform": [3000, 8000]},
                "output_tokens": 64,
            },
            {"name": "chat", "weight": 0.3, "prompt_tokens": CHAT, "output_tokens": {"uniform": [150, 300]}},
        ]
    elif name == "decode-heavy":
        classes = [
            {
                "name": "long-answer",
                "weight": 0.9,
                "prompt_tokens": CHAT,
                "output_tokens": {"uniform": [400, 900]},
            },
            {
                "name": "long-prompt",
                "weight": 0.1,
                "prompt_tokens": {"uniform": [4000, 8000]},
                "output_tokens": 100,
            },
        ]
    else:
        raise ValueError(f"unknown trace {name!r}; known: {', '.join(TRACES)}")
    return parse_workload(
        {
            "name": name,
            "api": "chat",
            "duration_s": duration_s,
            "rate_rps": rate_rps,
            "slo_ttft_s": slo.ttft_s,
            "slo_itl_s": slo.itl_s,
            "classes": classes,
        }
    )


@dataclass(frozen=True, slots=True)
class Row:
    trace: str
    target: str
    summary: Summary
    result: RunResult
    lag_ratio: float
    """The worst replica's ``kvgate_sim_lag_ratio``: above ``SIM_LAG_LIMIT_RATIO`` the simulator
    ran slower than its schedule and the row's latencies are not the model's."""

    def gaps_s(self) -> list[float]:
        return sorted(gap for r in self.result.records if r.ok for gap in r.itl_s)

    def worst_gap_p95_s(self) -> float | None:
        """The p95 over streams of each stream's longest inter-token gap: how badly decodes stall."""
        return _quantile(sorted(max(r.itl_s) for r in self.result.records if r.ok and r.itl_s), 0.95)


async def sim_lag_ratio(session: aiohttp.ClientSession, fleet: Mapping[str, Sequence[str]]) -> float:
    worst = 0.0
    for url in (u for urls in fleet.values() for u in urls):
        async with session.get(url + "/metrics") as response:
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "kvgate_sim_lag_ratio":
                    worst = max(worst, sample.value)
    return worst


def _quantile(values: Sequence[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


async def serve_fleet(roles: Mapping[str, int], time_scale: float, seed: int) -> None:
    """The ``--fleet-child`` mode: print ``{role: [url, ...]}`` as one JSON line, serve until SIGTERM."""
    async with SimFleet(replicas=0, time_scale=time_scale, seed=seed, overrides={"warmup_s": 0.0}) as fleet:
        urls: dict[str, list[str]] = {}
        for role, count in roles.items():
            for _ in range(count):
                replica = await fleet.add_replica(role=role)
                urls.setdefault(role, []).append(replica.url)
        print(orjson.dumps(urls).decode(), flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()


def start_fleet(
    started: list[subprocess.Popen[bytes]], roles: str, args: argparse.Namespace
) -> dict[str, list[str]]:
    command = [sys.executable, "-m", "bench.bench_pd", "--fleet-child", roles]
    command += ["--time-scale", str(args.time_scale), "--seed", str(args.seed)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE)
    started.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"simulated fleet exited with {proc.wait()}")
    urls: dict[str, list[str]] = orjson.loads(line)
    return urls


def gateway_config(fleet: Mapping[str, Sequence[str]], port: int) -> dict[str, Any]:
    """The same gateway for both layouts but the pools: one mixed pool, or a prefill+decode pair."""
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "health": {"interval_s": 0.5},
        "models": [{"name": DEFAULT_MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}],
        "pools": [
            {"name": role, "role": role, "replicas": list(urls), "kv_capacity_tokens": 450_000}
            for role, urls in fleet.items()
        ],
        "routing": {"policy": "kvgate", "warmup_s": 0},
        "admission": {"max_queue_wait_s": 30},
    }


def start_gateway(started: list[subprocess.Popen[bytes]], fleet: Mapping[str, Sequence[str]]) -> str:
    port = free_ports()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as file:
        yaml.safe_dump(gateway_config(fleet, port), file)
    command = [KVGATE, "serve", "--config", file.name, "--log-level", "warning"]
    started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return f"http://127.0.0.1:{port}"


def start_router(
    started: list[subprocess.Popen[bytes]], binary: str, fleet: Mapping[str, Sequence[str]]
) -> tuple[subprocess.Popen[bytes], str, str]:
    """``vllm-router`` in its P/D mode, as its README starts it: the prefill and decode URLs."""
    port = free_ports(2)
    command = [binary, "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(port + 1)]
    command += ["--vllm-pd-disaggregation", "--kv-connector", "nixl", "--log-level", "warning"]
    for url in fleet["prefill"]:
        command += ["--prefill", url]
    for url in fleet["decode"]:
        command += ["--decode", url]
    with tempfile.NamedTemporaryFile("wb", prefix="bench-pd-router-", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    started.append(proc)
    return proc, f"http://127.0.0.1:{port}", log.name


def _fmt(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


def table(rows: Sequence[Row], slo: Slo) -> str:
    """One markdown table for every trace, with each row's ratios against its trace's mixed row."""
    lines = [
        f"SLO: TTFT <= {slo.ttft_s:g} s and mean inter-token gap <= {slo.itl_s * 1000:g} ms",
        "",
        "| trace | target | requests | ok | goodput % | TTFT p50 s | TTFT p95 s | ITL p50 ms | ITL p95 ms "
        "| ITL p99 ms | worst gap p95 ms | goodput vs mixed | TTFT p95 vs mixed | ITL p99 vs mixed "
        "| worst gap vs mixed | sim lag |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        s = row.summary
        base = next(r for r in rows if r.trace == row.trace and r.target == MIXED)
        b = base.summary
        worst, base_worst = row.worst_gap_p95_s(), base.worst_gap_p95_s()
        lines.append(
            f"| {row.trace} | {row.target} | {s.requests} | {s.ok} | {100 * s.goodput_ratio:.1f} "
            f"| {_fmt(s.ttft_p50_s)} | {_fmt(s.ttft_p95_s)} | {_fmt(s.itl_p50_s, 1000, 1)} "
            f"| {_fmt(s.itl_p95_s, 1000, 1)} | {_fmt(s.itl_p99_s, 1000, 1)} | {_fmt(worst, 1000, 1)} "
            f"| {_ratio(s.goodput_ratio, b.goodput_ratio)} | {_ratio(s.ttft_p95_s, b.ttft_p95_s)} "
            f"| {_ratio(s.itl_p99_s, b.itl_p99_s)} | {_ratio(worst, base_worst)} "
            f"| {row.lag_ratio:.3f}{' LAGGED' if row.lag_ratio > SIM_LAG_LIMIT_RATIO else ''} |"
        )
    lines.append(
        f"\nsim lag: the worst simulated replica's lag over its busy time; above {SIM_LAG_LIMIT_RATIO} "
        "(LAGGED) the simulator could not keep its schedule and that row's latencies are not the model's."
    )
    return "\n".join(lines)


def plot(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(row.trace for row in rows))
    fig, axes = plt.subplots(len(traces), 3, figsize=(14, 4 * len(traces)), squeeze=False)
    for (goodput_ax, stall_ax, cdf_ax), trace in zip(axes, traces, strict=True):
        mine = [row for row in rows if row.trace == trace]
        names = [row.target for row in mine]
        goodput_ax.bar(names, [100 * row.summary.goodput_ratio for row in mine], color="tab:green")
        goodput_ax.set_ylabel("requests meeting both SLOs (%)")
        goodput_ax.set_title(f"{trace}: goodput")
        worst = [1000 * (row.worst_gap_p95_s() or 0.0) for row in mine]
        p99 = [1000 * (row.summary.itl_p99_s or 0.0) for row in mine]
        x = range(len(mine))
        stall_ax.bar([i - 0.2 for i in x], p99, width=0.4, label="ITL p99")
        stall_ax.bar([i + 0.2 for i in x], worst, width=0.4, label="longest gap per stream, p95")
        stall_ax.set_xticks(list(x), names)
        stall_ax.set_ylabel("ms")
        stall_ax.set_title(f"{trace}: ITL stability")
        stall_ax.legend()
        for row in mine:
            gaps = row.gaps_s()
            if gaps:
                cdf_ax.plot(
                    [1000 * g for g in gaps],
                    [(i + 1) / len(gaps) for i in range(len(gaps))],
                    label=row.target,
                )
        cdf_ax.set_xscale("log")
        cdf_ax.set_xlabel("inter-token gap (ms)")
        cdf_ax.set_ylabel("share of gaps")
        cdf_ax.set_title(f"{trace}: inter-token gap CDF")
        cdf_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


async def run_trace(name: str, args: argparse.Namespace, slo: Slo, router: str | None) -> list[Row]:
    trace = build_trace(workload(name, args.rate, args.duration_s, slo), args.seed)
    decode = args.gpus - args.prefill
    print(
        f"\n== {name}: {len(trace.requests)} requests over {args.duration_s:g} s at {args.rate:g} req/s "
        f"({trace.prompt_tokens} prompt tokens); {args.gpus} simulated GPUs per target: {args.gpus} mixed, "
        f"or {args.prefill} prefill + {decode} decode",
        flush=True,
    )
    with processes() as started:
        mixed_fleet = start_fleet(started, f"mixed:{args.gpus}", args)
        pd_fleet = start_fleet(started, f"prefill:{args.prefill},decode:{decode}", args)
        fleets = {MIXED: mixed_fleet, PD: pd_fleet}
        urls = {MIXED: start_gateway(started, mixed_fleet), PD: start_gateway(started, pd_fleet)}
        routed = None
        if router is not None:
            fleets[ROUTER_PD] = start_fleet(started, f"prefill:{args.prefill},decode:{decode}", args)
            routed = start_router(started, router, fleets[ROUTER_PD])
        async with aiohttp.ClientSession() as session:
            for url in urls.values():
                await wait_until_ok(session, url + "/readyz")
            if routed is not None:
                proc, url, log = routed
                why_not = await peers.ready(session, proc, url)
                if why_not is None:
                    urls[ROUTER_PD] = url
                else:
                    print(f"{ROUTER_PD}: did not start ({why_not}; output in {log}), left out", flush=True)
        targets = [Target(target, url, DEFAULT_MODEL) for target, url in urls.items()]
        options = RunOptions(progress=sys.stderr)
        results = await run_compare(targets, trace, options, slice_count=args.slices, same_prompts=True)
        async with aiohttp.ClientSession() as session:
            lags = {target: await sim_lag_ratio(session, fleets[target]) for target in urls}
    return [
        Row(name, result.target.name, summary, result, lags[result.target.name])
        for result, summary in zip(results, summaries_for(results, slo), strict=True)
    ]


async def bench(args: argparse.Namespace) -> None:
    slo = Slo(args.slo_ttft_s, args.slo_itl_s)
    router = peers.locate("vllm-router", args.peer_bin_dir)
    if router is None:
        print(f"{ROUTER_PD}: vllm-router not found (--peer-bin-dir, or pip install vllm-router), left out")
    rows: list[Row] = []
    for name in args.traces.split(","):
        rows += await run_trace(name.strip(), args, slo, router)
        print("\n" + table([r for r in rows if r.trace == name.strip()], slo), flush=True)
    report = table(rows, slo)
    args.report.write_text(report + "\n")
    plot(rows, args.png)
    print(f"\ntable: {args.report}\nplot: {args.png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--gpus", type=int, default=4, help="simulated GPUs (replicas) per target (default 4)"
    )
    parser.add_argument("--prefill", type=int, default=2, help="of them, prefill replicas in P/D (default 2)")
    parser.add_argument("--rate", type=float, default=6.0, help="offered requests/s (default 6)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="trace length (default 20)")
    parser.add_argument("--slices", type=int, default=2, help="interleaved slices (default 2)")
    parser.add_argument("--traces", default=",".join(TRACES), help=f"some of {', '.join(TRACES)}")
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator time scale (default 1)")
    parser.add_argument("--slo-ttft-s", type=float, default=2.0, help="TTFT SLO (default 2 s)")
    parser.add_argument(
        "--slo-itl-s", type=float, default=0.05, help="mean inter-token gap SLO (default 0.05 s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peer-bin-dir", type=Path, help="where vllm-router is (e.g. another venv's bin)")
    parser.add_argument("--report", type=Path, default=Path("bench_pd.md"), help="markdown table path")
    parser.add_argument("--png", type=Path, default=Path("bench_pd.png"), help="plot path")
    parser.add_argument("--fleet-child", metavar="ROLE:N,...", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 0 < args.prefill < args.gpus:
        parser.error(f"--prefill must be between 1 and --gpus - 1, got {args.prefill}")
    import uvloop

    if args.fleet_child:
        roles = {
            role: int(count) for role, count in (part.split(":") for part in args.fleet_child.split(","))
        }
        uvloop.run(serve_fleet(roles, args.time_scale, args.seed))
    else:
        uvloop.run(bench(args))


if __name__ == "__main__":
    main()
