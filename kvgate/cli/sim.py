"""``kvgate sim``: serve N simulated vLLM replicas on consecutive ports from one process
(``kvgate sim calibrate``, in ``kvgate.cli.calibrate``, fits a profile to a real replica).

Replica ``i`` listens on ``--port + i`` once its cold start has passed; the control API (see
``kvgate.sim.fleet``) listens on ``--control-port`` (default ``--port + 100``). Profile numbers
can be overridden from the command line; a bad value is one line, ``kvgate sim: error: ...``, and
exit status 2. ``--time-scale`` multiplies every simulated duration (as ``kvgate up``'s does).
``--kv-events-port P`` makes replica ``i`` publish vLLM's KV cache events on ``P + i`` (off by default).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Any

from kvgate.cli.calibrate import register_calibrate
from kvgate.cli.command import CommandError, report
from kvgate.sim.fleet import DEFAULT_MODEL, SimFleet
from kvgate.sim.kv_publisher import KvEventsConfig
from kvgate.sim.profile import DEFAULT_PROFILE, PROFILES
from kvgate.sim.profile_file import load_profile
from kvgate.sim.replica import SimReplica
from kvgate.vocabulary.replica import Role

_OVERRIDES = (
    "kv_capacity_tokens",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "warmup_s",
    "kv_link_bytes_per_s",
    "kv_transfer_timeout_s",
    "cpu_offload_tokens",
    "cpu_offload_bytes_per_s",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=1, help="replicas to start (default 1)")
    parser.add_argument("--port", type=int, default=8000, help="port of replica 0 (default 8000)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--control-port", type=int, default=None, help="control API port (default --port + 100)"
    )
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"a built-in profile ({', '.join(sorted(PROFILES))}; default {DEFAULT_PROFILE}) or a "
        "profile file (.yaml), such as `kvgate sim calibrate` writes",
    )
    parser.add_argument(
        "--role",
        default="mixed",
        choices=[r.value for r in Role],
        help="mixed (default), prefill (one token, KV kept for a decode replica to pull) or decode "
        "(pulls the KV named by kv_transfer_params, then decodes)",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"served model name (default {DEFAULT_MODEL})")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiplies every simulated duration (default 1; 0.1: ten times faster; 0: no sleeping)",
    )
    parser.add_argument("--kv-capacity-tokens", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument(
        "--cold-start-s", type=float, default=None, help="seconds before a replica listens (default: profile)"
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        help="seconds after a cold start during which steps run slower, easing back (default: profile)",
    )
    parser.add_argument(
        "--kv-link-bytes-per-s",
        type=float,
        default=None,
        help="decode role: the link a prompt's KV is pulled over, in bytes/s (default: profile, 50e9)",
    )
    parser.add_argument(
        "--kv-transfer-timeout-s",
        type=float,
        default=None,
        help="prefill role: seconds a hand-off waits to be pulled before it is dropped (default 480)",
    )
    parser.add_argument(
        "--cpu-offload-tokens",
        type=int,
        default=None,
        help="host-memory KV tier of this many tokens, as vLLM's --kv-offloading-size (default 0: none)",
    )
    parser.add_argument(
        "--cpu-offload-bytes-per-s",
        type=float,
        default=None,
        help="the host link a prefix found only in host memory loads over, in bytes/s (default 25e9)",
    )
    parser.add_argument(
        "--kv-events-port",
        type=int,
        default=None,
        help="publish vLLM's KV cache events over ZMQ, replica i on this port + i (default: off)",
    )
    parser.add_argument(
        "--kv-events-topic", default="kv-events", help="the events' topic frame (default kv-events)"
    )
    parser.add_argument(
        "--kv-events-replay-port",
        type=int,
        default=None,
        help="answer vLLM's replay requests (a ZMQ ROUTER), replica i on this port + i (default: off)",
    )
    parser.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report prompt tokens served from cache in usage.prompt_tokens_details, as vLLM's flag",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds output lengths and ids (default 0)")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="serve simulated vLLM replicas",
        description="Serve simulated vLLM replicas (OpenAI API, vLLM /metrics) on consecutive ports.",
    )
    add_arguments(parser)
    parser.set_defaults(run=run, prog=parser.prog)
    register_calibrate(parser.add_subparsers(dest="sim_command"))


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; 0 on Ctrl-C or SIGTERM; a bad argument raises ``CommandError``."""
    overrides: dict[str, Any] = {
        name: getattr(args, name) for name in _OVERRIDES if getattr(args, name) is not None
    }
    try:
        profile = load_profile(args.profile, overrides)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if args.replicas < 0 or args.time_scale < 0:
        raise CommandError("--replicas and --time-scale must be >= 0")
    kv_events = None
    if args.kv_events_port is not None:
        if args.kv_events_port <= 0 or (args.kv_events_replay_port or 1) <= 0:
            raise CommandError("--kv-events-port and --kv-events-replay-port must be > 0")
        kv_events = KvEventsConfig(args.kv_events_port, args.kv_events_topic, args.kv_events_replay_port)
    elif args.kv_events_replay_port is not None:
        raise CommandError("--kv-events-replay-port needs --kv-events-port")
    cold_start_s = profile.cold_start_s if args.cold_start_s is None else args.cold_start_s
    control_port = args.port + 100 if args.control_port is None else args.control_port
    fleet = SimFleet(
        replicas=args.replicas,
        profile=args.profile,
        model=args.model,
        time_scale=args.time_scale,
        cold_start_s=cold_start_s,
        seed=args.seed,
        overrides=overrides,
        host=args.host,
        port=args.port,
        control_port=control_port,
        wait_ready=False,
        role=args.role,
        kv_events=kv_events,
        prompt_tokens_details=args.enable_prompt_tokens_details,
    )
    with contextlib.suppress(KeyboardInterrupt):
        _runner(_serve(fleet, cold_start_s * args.time_scale))
    return 0


async def _serve(fleet: SimFleet, load_s: float) -> None:
    try:
        await fleet.start()
    except OSError as exc:
        await fleet.close()
        raise CommandError(f"cannot listen: {exc.strerror or exc}", status=1) from None
    profile = fleet.profile
    print(
        f"kvgate sim: {len(fleet.replicas)} x {fleet.model} ({profile.name}, "
        f"{profile.kv_capacity_tokens} KV tokens, max_num_seqs {profile.max_num_seqs}, "
        f"time scale {fleet.time_scale:g}, role {fleet.role.value})",
        flush=True,
    )
    for url in fleet.urls:
        print(f"  replica {url}/v1  (listening in {load_s:g} s)", flush=True)
    for replica in fleet.replicas:
        if replica.kv_events_endpoint is not None:
            print(f"  replica {replica.index} KV events {replica.kv_events_endpoint}", flush=True)
    print(f"  control {fleet.control_url}/replicas", flush=True)
    announcements = [asyncio.create_task(_announce(r)) for r in fleet.replicas]
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await stop.wait()
    finally:
        for task in announcements:
            task.cancel()
        await fleet.close()


async def _announce(replica: SimReplica) -> None:
    try:
        await replica.wait_ready()
    except OSError as exc:
        report("kvgate sim", f"replica {replica.index} failed to listen: {exc.strerror or exc}")
        return
    print(f"  replica {replica.index} ready: {replica.url}/health answers 200", flush=True)


def _runner(main: Any) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)
