"""The gateway of the open streams benchmark: ``kvgate serve``'s stack with the loop watched from inside.

The gateway as ``kvgate serve`` runs it, on uvloop, beside a task that samples the event loop's lag
and prints it (``lag T LAG T LAG ...`` each second, in seconds), and a note of each full garbage
collection (``gc T SECONDS``); ``ready`` once it is about to listen. Started from another checkout's
directory (``--gateway-code``), the gateway is that checkout's.

    python -m bench.streams.gateway_child CONFIG.yaml
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time

LAG_PERIOD_S = 0.05


def serve_gateway(config_path: str) -> None:
    import uvloop

    from kvgate.config.loader import load_config
    from kvgate.gateway.edge.app import Gateway
    from kvgate.gateway.edge.server import DrainingServer, uvicorn_config

    config = load_config(config_path, {})
    gateway = Gateway(config)
    collecting_since_s = [0.0]

    def time_full_collections(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            collecting_since_s[0] = time.monotonic()
        else:
            now_s = time.monotonic()
            print(f"gc {now_s:.4f} {now_s - collecting_since_s[0]:.6f}", flush=True)

    gc.callbacks.append(time_full_collections)
    server = DrainingServer(uvicorn_config(gateway, config.server.host, config.server.port), gateway)

    async def sample_lag() -> None:
        samples: list[str] = []
        reported_s = time.monotonic()
        while True:
            before_s = time.monotonic()
            await asyncio.sleep(LAG_PERIOD_S)
            now_s = time.monotonic()
            samples.append(f"{now_s:.4f} {now_s - before_s - LAG_PERIOD_S:.6f}")
            if now_s - reported_s >= 1.0:
                print("lag " + " ".join(samples), flush=True)
                samples.clear()
                reported_s = now_s

    async def main() -> None:
        sampler = asyncio.create_task(sample_lag())
        print("ready", flush=True)
        await server.serve()
        sampler.cancel()

    uvloop.run(main())


if __name__ == "__main__":
    serve_gateway(sys.argv[1])
