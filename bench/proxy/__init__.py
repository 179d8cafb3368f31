"""Proxy overhead benchmark: gateway CPU per request and added latency against direct calls.

Three processes: zero-delay backends (raw asyncio + httptools, one process for all of them, so its
CPU is not counted), the gateway (``kvgate serve``: uvicorn + uvloop, its CPU read from ``/proc``
via psutil), and this driver (aiohttp clients at a fixed concurrency). Each scenario runs direct and
through the gateway in the same run: non-streaming requests, 50-chunk streams back-to-back, 50-chunk
streams paced ~5 ms apart, non-streaming requests at a fixed 1000 per second (open loop: added
latency at a load the machine carries) and one at a time (serial). Prints a table.
``--decisions N`` instead times the decision path alone, in this process: price, admit, first token,
``finished`` and ``release`` for N requests against four healthy replicas, no sockets (CPU
microseconds per request). ``--client N`` times the upstream client alone, in this process on
uvloop: N non-stream requests to the zero-delay backends through an aiohttp session set up as the
gateway's other upstream calls are, then through the completion routes' ``ReplicaClient`` (CPU
microseconds per request). ``--access-log N`` times an answered request's access-log line, N
lines per way of writing it, and ``--tracing N`` its spans, N requests sampled and N sampled out,
in this process (``bench.proxy.record``). ``--peers`` compares router CPU with the Rust routers
instead (``bench.proxy.peers``).

``--report FILE`` runs the scenarios, then every part alone, and writes the figures as markdown
(``bench.proxy.report``): docs/proxy-report.md is that file, and the one-off measurements at its
end are kept when it is written again.

    python -m bench proxy [--concurrency 64] [--requests 4000] [--streams 600]
    python -m bench proxy --decisions 20000
    python -m bench proxy --client 20000
    python -m bench proxy --access-log 20000 --tracing 5000
    python -m bench proxy --report docs/proxy-report.md
    python -m bench proxy --peers all [--rounds 3] [--peer-bin-dir DIR]
"""
