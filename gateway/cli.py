"""The ``kvgate`` command line. Each subcommand is a ``register(subparsers)`` function that adds
its parser and sets ``run`` (``args -> exit code``); adding one is one line in ``COMMANDS``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from config.loader import ConfigError, load_config
from config.schema import GatewayConfig
from gateway.autoscale_loop import register as register_autoscale
from loadtest.cli import register as register_loadtest
from loadtest.sim.cli import register as register_sim

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def register_serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("serve", help="run the gateway in front of real replicas")
    parser.add_argument("--config", required=True, help="YAML config file (KVGATE_* variables override it)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(run=_serve)


def register_up(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("up", help="a simulated vLLM fleet in-process plus the gateway")
    parser.add_argument("--replicas", type=int, default=2, help="simulated replicas (default 2)")
    parser.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    parser.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    parser.add_argument("--profile", default="llama-3.1-8b-h100", help="simulator profile")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="simulated seconds per real second divisor (0: instant)"
    )
    parser.set_defaults(run=_up)


def register_config(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("config", help="configuration tools")
    actions = parser.add_subparsers(dest="config_command", required=True)
    check = actions.add_parser("check", help="validate a config file, listing every problem")
    check.add_argument("file")
    check.set_defaults(run=_config_check)


COMMANDS: list[Register] = [
    register_serve,
    register_up,
    register_config,
    register_sim,
    register_loadtest,
    register_autoscale,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate", description="OpenAI-compatible gateway for vLLM fleets")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130


def _load(path: str) -> GatewayConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return None


def _config_check(args: argparse.Namespace) -> int:
    config = _load(args.file)
    if config is None:
        return 2
    replicas = sum(len(p.replicas) for p in config.pools)
    dns = sum(1 for p in config.pools if p.dns is not None)
    print(
        f"{args.file}: ok ({len(config.models)} model(s), {len(config.pools)} pool(s), "
        f"{replicas} static replica(s), {dns} DNS pool(s))"
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    from gateway.server import serve

    config = _load(args.config)
    if config is None:
        return 2
    serve(config, log_level=args.log_level)
    return 0


def _up(args: argparse.Namespace) -> int:
    import uvloop

    uvloop.run(_run_up(args))
    return 0


async def _run_up(args: argparse.Namespace) -> None:
    from config.loader import parse_config
    from gateway.server import running_gateway
    from loadtest.sim.fleet import SimFleet

    async with SimFleet(
        replicas=args.replicas, profile=args.profile, time_scale=args.time_scale, cold_start_s=0.0
    ) as fleet:
        profile = fleet.profile
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
                        "name": "sim",
                        "replicas": fleet.urls,
                        "kv_capacity_tokens": profile.kv_capacity_tokens,
                        "max_sequences": profile.max_num_seqs,
                    }
                ],
                "admission": {
                    "enabled": True,
                    "auth_enabled": False,
                    "max_active_sequences_per_replica": profile.max_num_seqs,
                },
                "routing": {"policy": "kvgate"},
                "access_log": {"format": "text"},
            },
            {},
            "kvgate up",
        )
        async with running_gateway(config, port=args.port) as gateway:
            print(up_banner(gateway.url, fleet.model, len(fleet.urls), args.profile), flush=True)
            await gateway.serving


def up_banner(url: str, model: str, replicas: int, profile: str) -> str:
    return f"""kvgate is up: {replicas} simulated {profile} replica(s) serving {model}
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
