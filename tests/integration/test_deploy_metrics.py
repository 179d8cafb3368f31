"""Every metric the manifests query exists: ``kvgate serve`` runs as its own process with the base
ConfigMap's gateway config (its autoscaler and admission sections as shipped; only the listen
address and the pool's replicas, static URLs of a simulated fleet instead of the headless Service,
differ), serves a little traffic, and its /metrics and the replicas' /metrics (the simulator mimics
vLLM's) are scraped. Each selector of every overlay's ScaledObject, HPA, PrometheusRule and
Grafana panel must match a scraped series: the name, and the label values it asks for (the pool
"chat" included), apart from the few series that appear only after a rare event."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson

from loadtest.client import wait_until_ok
from loadtest.sim.fleet import SimFleet, free_port
from tests.integration.test_serve_process import gauges
from tests.unit.test_deploy import OVERLAYS, base_gateway_config, queried_selectors, render, unmatched

RARE = frozenset(
    {
        # counted from the first 429, alerted on as a ratio: no series means no rejects
        ("kvgate_admission_decisions_total", "decision", "reject"),
        # published only while the policy is capped at max_replicas
        ("kvgate_autoscaler_decision_info", "reason", "max_replicas"),
    }
)
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+\S+")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def series_of(exposition: str) -> dict[str, list[dict[str, str]]]:
    """The label sets of every sample in a Prometheus text exposition, by sample name."""
    series: dict[str, list[dict[str, str]]] = {}
    for line in exposition.splitlines():
        match = _SAMPLE.match(line)
        if match:
            series.setdefault(match.group(1), []).append(dict(_LABEL.findall(match.group(2) or "")))
    return series


async def scrape(http: aiohttp.ClientSession, urls: list[str]) -> dict[str, list[dict[str, str]]]:
    merged: dict[str, list[dict[str, str]]] = {}
    for url in urls:
        async with http.get(url + "/metrics") as response:
            assert response.status == 200, url
            for name, label_sets in series_of(await response.text()).items():
                merged.setdefault(name, []).extend(label_sets)
    return merged


def adapted(base: dict[str, Any], port: int, replica_urls: list[str]) -> dict[str, Any]:
    """The base config, listening on loopback and with the simulated replicas as each pool's."""
    config = orjson.loads(orjson.dumps(base))
    config["server"] = {**config["server"], "host": "127.0.0.1", "port": port}
    for pool in config["pools"]:
        pool.pop("dns")
        pool["replicas"] = replica_urls
    return config


def test_the_series_parser_reads_labels_and_colons() -> None:
    text = '# HELP x y\nvllm:num_requests_running{model_name="m",engine="0"} 3\nkvgate_up 1\n'
    assert series_of(text) == {
        "vllm:num_requests_running": [{"model_name": "m", "engine": "0"}],
        "kvgate_up": [{}],
    }


async def test_every_metric_the_manifests_query_is_exported_with_the_base_config(tmp_path: Path) -> None:
    base = base_gateway_config()
    selectors = [s for overlay in sorted(OVERLAYS) for s in queried_selectors(render(f"overlays/{overlay}"))]
    assert len({s.metric for s in selectors}) >= 15
    model = base["models"][0]["name"]
    async with SimFleet(replicas=2, model=model, time_scale=0.0) as fleet:
        port = free_port()
        config_file = tmp_path / "kvgate.yaml"
        config_file.write_bytes(orjson.dumps(adapted(base, port, fleet.urls)))  # JSON is YAML
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "kvgate"), "serve", "--config", str(config_file)
        )
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:
                await wait_until_ok(http, url + "/readyz")
                client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
                answers = await asyncio.gather(
                    *(
                        client.chat.completions.create(
                            model=model, messages=[{"role": "user", "content": f"question {i}"}], max_tokens=8
                        )
                        for i in range(8)
                    )
                )
                assert all(a.usage is not None and a.usage.completion_tokens == 8 for a in answers)
                stream = await client.completions.create(
                    model=model,
                    prompt="tell a story",
                    max_tokens=16,
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
                assert sum(1 for chunk in [c async for c in stream] if chunk.choices) == 16
                await client.close()
                # the gateway scrapes the replicas on its own period: wait for their occupancy
                for _ in range(300):
                    problems = unmatched(selectors, await scrape(http, [url, *fleet.urls]), RARE)
                    if not problems:
                        break
                    await asyncio.sleep(0.1)
                assert problems == [], "\n".join(problems)
                for _ in range(100):
                    values = await gauges(url)
                    if values and all(value == 0 for value in values.values()):
                        break
                    await asyncio.sleep(0.05)
                assert len(values) >= 6 and all(value == 0 for value in values.values()), values
        finally:
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 30) in (0, -signal.SIGTERM)
