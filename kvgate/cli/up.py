"""``kvgate up``: a simulated vLLM fleet in-process, the gateway in front of it, and the autoscaling
loop resizing the fleet through the simulator's control API. A composition root: it wires the load
tester's simulator to the runtime, so it lives outside both (the runtime never imports the load
tester)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvgate.cli.command import CommandError, report
from kvgate.cli.serve import check_listen
from kvgate.config.autoscaler import AutoscalerConfig, PoolPolicy
from kvgate.config.loader import parse_config

if TYPE_CHECKING:
    from kvgate.sim.fleet import SimFleet

UP_POOL = "sim"


def register_up(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "up",
        help="a simulated vLLM fleet in-process, the gateway, and the autoscaler resizing the fleet",
    )
    parser.add_argument("--replicas", type=int, default=2, help="simulated replicas at start (default 2)")
    parser.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    parser.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    parser.add_argument("--profile", default="llama-3.1-8b-h100", help="simulator profile")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiplies every simulated duration, as kvgate sim's (default 1; 0.1: ten times faster; "
        "0: no sleeping)",
    )
    parser.add_argument(
        "--no-autoscale",
        dest="autoscale",
        action="store_false",
        help="do not run the autoscaler (by default it resizes the simulated fleet, with cold starts)",
    )
    parser.add_argument(
        "--pd",
        action="store_true",
        help="a prefill/decode fleet: --replicas prefill replicas and as many decode replicas, in two "
        "pools the gateway serves each request through (docs/pd.md); sized separately by the autoscaler",
    )
    parser.add_argument("--min-replicas", type=int, default=1, help="autoscaler floor (default 1)")
    parser.add_argument("--max-replicas", type=int, default=8, help="autoscaler ceiling (default 8)")
    parser.add_argument(
        "--autoscale-interval-s",
        type=float,
        default=5.0,
        help="seconds between autoscaler rounds (default 5)",
    )
    parser.set_defaults(run=_up, prog=parser.prog)


def _up(args: argparse.Namespace) -> int:
    import uvloop

    from kvgate.sim.profile_file import load_profile

    if args.replicas < 1:
        raise CommandError(f"--replicas must be at least 1, got {args.replicas}")
    if args.time_scale < 0:
        raise CommandError(f"--time-scale must be >= 0, got {args.time_scale:g}")
    try:
        load_profile(args.profile, {})
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    autoscaler = up_autoscaler(args)
    check_listen(args.host, args.port)
    try:
        uvloop.run(_run_up(args, autoscaler))
    except OSError as exc:
        raise CommandError(str(exc), status=1) from None
    return 0


def up_autoscaler(args: argparse.Namespace) -> AutoscalerConfig | None:
    """The policy ``kvgate up`` runs (the defaults, between the flags' bounds), or None when off."""
    if not args.autoscale:
        return None
    if args.min_replicas < 0 or args.max_replicas < 1 or args.min_replicas > args.max_replicas:
        raise CommandError(
            f"need 0 <= --min-replicas <= --max-replicas and --max-replicas >= 1, got "
            f"{args.min_replicas} and {args.max_replicas}"
        )
    if args.autoscale_interval_s <= 0:
        raise CommandError(f"--autoscale-interval-s must be > 0, got {args.autoscale_interval_s:g}")
    return AutoscalerConfig(
        interval_s=args.autoscale_interval_s,
        policy=PoolPolicy(min_replicas=args.min_replicas, max_replicas=args.max_replicas),
    )


async def _run_up(args: argparse.Namespace, autoscaler: AutoscalerConfig | None) -> None:
    from kvgate.sim.fleet import SimFleet

    roles = ("prefill", "decode") if args.pd else ("mixed",)
    async with contextlib.AsyncExitStack() as stack:
        fleets = {
            role: await stack.enter_async_context(
                SimFleet(
                    replicas=args.replicas,
                    profile=args.profile,
                    time_scale=args.time_scale,
                    cold_start_s=0.0,
                    control_port=0,
                    role=role,
                )
            )
            for role in roles
        }
        await _serve_up(args, autoscaler, fleets)


async def _serve_up(
    args: argparse.Namespace, autoscaler: AutoscalerConfig | None, fleets: Mapping[str, SimFleet]
) -> None:
    from kvgate.gateway.edge.server import running_gateway

    fleet = next(iter(fleets.values()))
    profile = fleet.profile
    pools = {UP_POOL if role == "mixed" else role: sim for role, sim in fleets.items()}
    config = parse_config(
        {
            "server": {"host": args.host, "port": args.port},
            "models": [
                {
                    "name": fleet.model,
                    "max_model_len": profile.max_model_len,
                    "kv_bytes_per_token": profile.kv_bytes_per_token,
                }
            ],
            "pools": [
                {
                    "name": name,
                    "role": sim.role.value,
                    "replicas": sim.urls,
                    "kv_capacity_tokens": profile.kv_capacity_tokens,
                    "max_sequences": profile.max_num_seqs,
                }
                for name, sim in pools.items()
            ],
            "auth": {"enabled": False},
            "admission": {"enabled": True, "max_active_sequences_per_replica": profile.max_num_seqs},
            "routing": {"policy": "kvgate"},
            "autoscaler": None if autoscaler is None else autoscaler.model_dump(mode="json"),
            "access_log": {"format": "text"},
        },
        {},
        "kvgate up",
    )
    async with running_gateway(config, port=args.port) as gateway:
        replicas = sum(len(sim.urls) for sim in pools.values())
        layout = " + ".join(f"{len(sim.urls)} {name}" for name, sim in pools.items()) if args.pd else None
        print(up_banner(gateway.url, fleet.model, replicas, args.profile, layout), flush=True)
        controls = {name: sim.control_url for name, sim in pools.items() if sim.control_url is not None}
        if config.autoscaler is None or not controls:
            await gateway.serving
            return
        print(
            f"autoscaler: every {config.autoscaler.interval_s:g} s, "
            f"{args.min_replicas}..{args.max_replicas} replicas per pool; simulator control API "
            + ", ".join(f"{name} {url}/replicas" for name, url in controls.items()),
            flush=True,
        )
        loop = asyncio.create_task(_autoscale(gateway.url, controls, config.autoscaler))
        try:
            await gateway.serving
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)


def up_banner(url: str, model: str, replicas: int, profile: str, layout: str | None = None) -> str:
    pd = "" if layout is None else f" ({layout}: prefill/decode disaggregated)"
    return f"""kvgate is up: {replicas} simulated {profile} replica(s){pd} serving {model}
OpenAI base URL: {url}/v1        (Ctrl-C stops everything)

  curl {url}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'

  python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{url}/v1", api_key="unused")
reply = client.chat.completions.create(
    model="{model}", messages=[{{"role": "user", "content": "Hello!"}}], max_tokens=32
)
print(reply.choices[0].message.content, reply.usage)
PY
"""


async def _autoscale(gateway_url: str, controls: Mapping[str, str], config: AutoscalerConfig) -> None:
    """``kvgate up``'s loop: the gateway's signals resize each simulated pool (``controls``: pool
    name to its simulator's control URL, with its cold starts) and the gateway's replica set; each
    change printed."""
    import aiohttp

    from kvgate.autoscaler.actuators import SimActuator
    from kvgate.autoscaler.loop import ChangeLog, GatewaySources, run_loop

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0)) as session:
        actuator = ChangeLog(SimActuator(session, dict(controls), gateway_urls=[gateway_url]))
        sources = GatewaySources(urls=(gateway_url,))
        await run_loop(session, sources, actuator, config, report=lambda line: report("kvgate up", line))
