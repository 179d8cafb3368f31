"""Many gateways, one fleet: 1, 2 and 4 gateways sharing Redis claims, against N uncoordinated ones.

Processes: simulated replicas (``kvgate sim``, real time), a private ``redis-server``, N gateways
(``kvgate serve``, one config) and this driver (aiohttp, open-loop Poisson arrivals at ``overload`` x
the fleet's estimated capacity, each request sent to a gateway drawn at random as a Service would).
Two tenants of equal weight share the load unevenly (``--share-a`` of the requests are tenant a's),
so fairness says b, asking for less than half, gets what it asks and a the rest. A 429'd client
waits its ``retry-after-ms`` and retries (on a gateway drawn again) up to ``--retries`` times.

Each phase runs the same arrival schedule through fresh gateways in front of the same replicas.
Printed per phase, with ratios to the one-gateway phase of the same run: goodput (streams whose
first token came within ``--ttft-slo-s`` of their first attempt, Retry-After waits included, and
whose mean inter-token time stayed within ``--itl-slo-s``, per second of arrivals), preemptions (the
replicas' own counter; must be 0), the inter-token time's p50 and p95, each tenant's share of its
requests that met both objectives, the peak over-commit (the most requests all gateways had
admitted at once, from their ``kvgate_resident_sequences``, over what the replicas' KV caches hold
at the requests' real token counts: above 1 means N gateways sent more than fits), the gateways' CPU
per finished request (``/proc``, all gateways together), Redis's CPU, the share of 429'd clients
whose first retry got in, and the coordination's syncs per second. Not a test.

    python -m bench.bench_coordination [--duration-s 15] [--overload 2.0] [--gateways 1,2,4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis
import yaml

from kvgate.admission.tokenizer import TiktokenTokenizer
from kvgate.loadtest.client import wait_until_ok
from kvgate.sim.ports import free_ports

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KV_CAPACITY_TOKENS = 20000
MAX_NUM_SEQS = 64
MAX_TOKENS = 200
PROMPT_WORDS = 300
KVGATE = os.path.join(os.path.dirname(sys.executable), "kvgate")
TENANTS = {"a": "sk-bench-a", "b": "sk-bench-b"}
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class Outcome:
    tenant: str
    ttft_s: float | None = None
    finished: bool = False
    rejects: int = 0
    first_retry_ok: bool | None = None
    itl_s: float | None = None
    """Mean seconds between output tokens, first to last."""


@dataclass(slots=True)
class Phase:
    name: str
    gateways: int
    coordinated: bool
    duration_s: float = 0.0
    window_s: float = 0.0
    """Seconds over which the requests arrived: goodput is per second of it."""
    outcomes: list[Outcome] = field(default_factory=list)
    preemptions: float = 0.0
    peak_admitted: int = 0
    gateway_cpu_s: float = 0.0
    redis_cpu_s: float = 0.0
    syncs: float = 0.0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def _script_calls(redis_url: str) -> int:
    """Lua script calls Redis has served: one per gateway sync."""
    client = aioredis.from_url(redis_url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))


async def _preemptions(session: aiohttp.ClientSession, urls: list[str]) -> float:
    return sum([_sum(await _scrape(session, url), "vllm:num_preemptions_total") for url in urls])


async def _scrape(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as response:
        return await response.text()


def _sum(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


async def _watch_gateways(
    session: aiohttp.ClientSession, urls: list[str], phase: Phase, stop: asyncio.Event
) -> None:
    """The most sequences all gateways had admitted at once, sampled every 0.25 s."""
    while not stop.is_set():
        texts = await asyncio.gather(*(_scrape(session, url) for url in urls))
        admitted = sum(_sum(text, "kvgate_resident_sequences") for text in texts)
        phase.peak_admitted = max(phase.peak_admitted, int(admitted))
        await asyncio.sleep(0.25)


async def _one(
    session: aiohttp.ClientSession,
    urls: list[str],
    rng: random.Random,
    prompt: str,
    tenant: str,
    retries: int,
) -> Outcome:
    outcome = Outcome(tenant)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}
    first_s = time.monotonic()
    try:
        for attempt in range(retries + 1):
            headers = {"authorization": f"Bearer {TENANTS[tenant]}", "x-stainless-retry-count": str(attempt)}
            url = rng.choice(urls)
            async with session.post(url + "/v1/completions", json=body, headers=headers) as response:
                if response.status == 429:
                    await response.read()
                    outcome.rejects += 1
                    if attempt == retries:
                        return outcome
                    await asyncio.sleep(int(response.headers.get("retry-after-ms", "1000")) / 1000.0)
                    continue
                if response.status != 200:
                    await response.read()
                    return outcome
                first_token_s = last_s = 0.0
                async for _ in response.content.iter_any():
                    last_s = time.monotonic()
                    if outcome.ttft_s is None:
                        first_token_s = last_s
                        outcome.ttft_s = last_s - first_s
                        if attempt >= 1 and outcome.first_retry_ok is None:
                            outcome.first_retry_ok = attempt == 1
                outcome.itl_s = (last_s - first_token_s) / (MAX_TOKENS - 1)
                outcome.finished = True
                return outcome
    except aiohttp.ClientError as exc:
        print(f"request failed: {exc!r}", file=sys.stderr)
    return outcome


def _config(replica_urls: list[str], port: int, redis_url: str | None, namespace: str) -> dict[str, object]:
    config: dict[str, object] = {
        "server": {"host": "127.0.0.1", "port": port},
        "health": {"interval_s": 0.5},
        "models": [{"name": MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}],
        "pools": [
            {
                "name": "default",
                "replicas": replica_urls,
                "kv_capacity_tokens": KV_CAPACITY_TOKENS,
                "max_sequences": MAX_NUM_SEQS,
            }
        ],
        "admission": {
            "max_queue_wait_s": 2.0,
            "tenants": [{"name": name, "api_keys": [key], "weight": 1} for name, key in TENANTS.items()],
        },
    }
    if redis_url is not None:
        config["coordination"] = {"redis_url": redis_url, "namespace": namespace, "interval_s": 0.2}
    return config


async def _phase(
    phase: Phase,
    replica_urls: list[str],
    redis_url: str,
    redis_pid: int,
    arrivals: list[tuple[float, str, str]],
    retries: int,
) -> Phase:
    ports = [free_ports() for _ in range(phase.gateways)]
    namespace = f"bench-{phase.name.replace(' ', '-')}"
    files: list[str] = []
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    for port in ports:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(
                _config(replica_urls, port, redis_url if phase.coordinated else None, namespace), f
            )
        files.append(f.name)
        log = open(f.name + ".log", "wb")  # noqa: SIM115 - closed with the phase
        logs.append(log)
        procs.append(
            subprocess.Popen([KVGATE, "serve", "--config", f.name], stdout=subprocess.DEVNULL, stderr=log)
        )
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    rng = random.Random(1)
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=600)
        ) as session:
            for url, name in zip(urls, files, strict=True):
                try:
                    await wait_until_ok(session, url + "/readyz")
                except RuntimeError:
                    print(Path(name + ".log").read_text()[-3000:], file=sys.stderr)
                    raise
            before = await _preemptions(session, replica_urls)
            cpu_before = sum(_cpu_s(p.pid) for p in procs)
            redis_before = _cpu_s(redis_pid)
            calls_before = await _script_calls(redis_url)
            stop = asyncio.Event()
            watcher = asyncio.create_task(_watch_gateways(session, urls, phase, stop))
            start = time.monotonic()
            tasks = []
            for at_s, prompt, tenant in arrivals:
                delay = start + at_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(_one(session, urls, rng, prompt, tenant, retries)))
                if len(tasks) % 50 == 0:
                    print(f"  {phase.name}: {len(tasks)}/{len(arrivals)} sent", file=sys.stderr)
            phase.outcomes = list(await asyncio.gather(*tasks))
            phase.duration_s = time.monotonic() - start
            phase.window_s = arrivals[-1][0]
            stop.set()
            await watcher
            phase.gateway_cpu_s = sum(_cpu_s(p.pid) for p in procs) - cpu_before
            phase.redis_cpu_s = _cpu_s(redis_pid) - redis_before
            after = await _preemptions(session, replica_urls)
            phase.preemptions = after - before
            phase.syncs = (await _script_calls(redis_url) - calls_before) / phase.duration_s
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
        for log in logs:
            log.close()
        for name in files:
            os.unlink(name)
            os.unlink(name + ".log")
    return phase


@dataclass(frozen=True, slots=True)
class Row:
    phase: Phase
    goodput_per_s: float
    good_pct: dict[str, float]
    """Per tenant, the share of its requests that finished within the TTFT objective."""
    overcommit_ratio: float
    cpu_ms_per_request: float
    first_retry_ok_pct: float
    itl_p50_ms: float
    itl_p95_ms: float


def _good(outcome: Outcome, ttft_slo_s: float, itl_slo_s: float) -> bool:
    return (
        outcome.finished
        and outcome.ttft_s is not None
        and outcome.ttft_s <= ttft_slo_s
        and outcome.itl_s is not None
        and outcome.itl_s <= itl_slo_s
    )


def _row(phase: Phase, ttft_slo_s: float, itl_slo_s: float, fits: int) -> Row:
    good = [o for o in phase.outcomes if _good(o, ttft_slo_s, itl_slo_s)]
    itls = sorted(o.itl_s for o in phase.outcomes if o.itl_s is not None)
    finished = [o for o in phase.outcomes if o.finished]
    good_ids = {id(o) for o in good}
    pct = {}
    for tenant in TENANTS:
        sent = [o for o in phase.outcomes if o.tenant == tenant]
        pct[tenant] = 100.0 * sum(1 for o in sent if id(o) in good_ids) / max(1, len(sent))
    retried = [o for o in phase.outcomes if o.first_retry_ok is not None]
    return Row(
        phase,
        len(good) / max(phase.window_s, 1e-9),
        pct,
        phase.peak_admitted / fits,
        1000.0 * phase.gateway_cpu_s / max(1, len(finished)),
        100.0 * sum(1 for o in retried if o.first_retry_ok) / len(retried) if retried else float("nan"),
        1000.0 * itls[len(itls) // 2] if itls else float("nan"),
        1000.0 * itls[int(0.95 * (len(itls) - 1))] if itls else float("nan"),
    )


def _table(rows: list[Row]) -> str:
    base = rows[0]
    lines = [
        "| gateways | Redis claims | goodput /s | vs 1 | preemptions | ITL p50/p95 ms | a good % "
        "| b good % | peak over-commit | gateway CPU ms/req | Redis CPU s | syncs /s | 1st retry ok % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r.phase
        lines.append(
            f"| {p.gateways} | {'on' if p.coordinated else 'off'} | {r.goodput_per_s:.2f} "
            f"| {r.goodput_per_s / base.goodput_per_s:.2f}x | {p.preemptions:.0f} "
            f"| {r.itl_p50_ms:.1f}/{r.itl_p95_ms:.1f} "
            f"| {r.good_pct['a']:.1f} | {r.good_pct['b']:.1f} | {r.overcommit_ratio:.2f}x "
            f"| {r.cpu_ms_per_request:.2f} | {p.redis_cpu_s:.2f} | {p.syncs:.1f} "
            f"| {r.first_retry_ok_pct:.1f} |"
        )
    return "\n".join(lines)


def _plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.phase.gateways} gw\n{'claims' if r.phase.coordinated else 'uncoord.'}" for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    colors = ["tab:blue" if r.phase.coordinated or r.phase.gateways == 1 else "tab:red" for r in rows]
    axes[0].bar(labels, [r.goodput_per_s for r in rows], color=colors)
    axes[0].set_title("goodput (streams/s within TTFT and ITL objectives)")
    axes[1].bar(labels, [r.overcommit_ratio for r in rows], color=colors)
    axes[1].axhline(1.0, color="black", linestyle="--", linewidth=1)
    axes[1].set_title("peak admitted at once / what the fleet holds")
    axes[2].bar(labels, [r.phase.preemptions for r in rows], color=colors)
    axes[2].set_title("preemptions")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--overload", type=float, default=2.0)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument(
        "--gateways", default="1,2,4", help="gateway counts, coordinated; >1 also uncoordinated"
    )
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--share-a", type=float, default=0.75, help="tenant a's share of the requests")
    parser.add_argument("--ttft-slo-s", type=float, default=2.0)
    parser.add_argument("--itl-slo-s", type=float, default=0.025, help="mean inter-token objective")
    parser.add_argument("--itl-s", type=float, default=0.012, help="assumed decode step at full batch")
    parser.add_argument("--png", type=Path, default=Path("bench_coordination.png"))
    args = parser.parse_args()
    redis_binary = shutil.which("redis-server")
    if redis_binary is None:
        sys.exit("needs redis-server on PATH")
    estimated = min(MAX_NUM_SEQS, KV_CAPACITY_TOKENS // (PROMPT_WORDS + MAX_TOKENS)) * args.replicas
    capacity_per_s = estimated / (MAX_TOKENS * args.itl_s)
    rate_per_s = args.overload * capacity_per_s
    rng = random.Random(0)
    arrivals: list[tuple[float, str, str]] = []
    t = rng.expovariate(rate_per_s)
    while t < args.duration_s:
        prompt = " ".join(f"w{rng.randrange(10**6)}" for _ in range(PROMPT_WORDS // 3))
        arrivals.append((t, prompt, "a" if rng.random() < args.share_a else "b"))
        t += rng.expovariate(rate_per_s)
    tokens = TiktokenTokenizer.from_name()
    kv_tokens = max(tokens.count(prompt) for _, prompt, _ in arrivals) + MAX_TOKENS
    fits = min(MAX_NUM_SEQS, KV_CAPACITY_TOKENS // kv_tokens) * args.replicas
    sim_port = free_ports(args.replicas + 1)
    redis_port = free_ports()
    with tempfile.TemporaryDirectory() as redis_dir:
        redis = subprocess.Popen(
            [
                redis_binary,
                "--port",
                str(redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            cwd=redis_dir,
            stdout=subprocess.DEVNULL,
        )
        sim = subprocess.Popen(
            [
                *(KVGATE, "sim", "--replicas", str(args.replicas), "--port", str(sim_port)),
                *("--kv-capacity-tokens", str(KV_CAPACITY_TOKENS), "--max-num-seqs", str(MAX_NUM_SEQS)),
                *("--cold-start-s", "0", "--control-port", str(sim_port + args.replicas)),
            ],
        )
        replica_urls = [f"http://127.0.0.1:{sim_port + i}" for i in range(args.replicas)]
        counts = [int(n) for n in args.gateways.split(",")]
        plan = [Phase(f"{n} coordinated", n, n > 1) for n in counts]
        plan += [Phase(f"{n} uncoordinated", n, False) for n in counts if n > 1]
        try:
            async with aiohttp.ClientSession() as session:
                for url in replica_urls:
                    await wait_until_ok(session, url + "/health")
            print(
                f"{args.replicas} simulated replicas (KV {KV_CAPACITY_TOKENS} tokens each, {fits} requests "
                f"of up to {kv_tokens} KV tokens fit them), capacity ~{capacity_per_s:.1f} req/s, offered "
                f"{rate_per_s:.1f} req/s ({args.overload}x) for {args.duration_s:.0f} s, tenant a "
                f"{args.share_a:.0%} of requests; {len(plan)} phases",
                file=sys.stderr,
            )
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            phases = []
            for phase in plan:
                print(f"phase {phase.name} ...", file=sys.stderr)
                phases.append(await _phase(phase, replica_urls, redis_url, redis.pid, arrivals, args.retries))
                rows = [_row(p, args.ttft_slo_s, args.itl_slo_s, fits) for p in phases]
                print(_table(rows).splitlines()[-1], file=sys.stderr)
        finally:
            sim.terminate()
            sim.wait(10)
            redis.terminate()
            redis.wait(10)
    rows = [_row(p, args.ttft_slo_s, args.itl_slo_s, fits) for p in phases]
    print(_table(rows))
    _plot(rows, args.png)
    print(f"\nplot: {args.png}")


if __name__ == "__main__":
    asyncio.run(main())
