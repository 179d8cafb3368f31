"""Open streams benchmark: what each concurrently open token stream costs one gateway process.

Processes: paced SSE backends (``bench.streams.backend``, one process for four replicas, its CPU
not counted), one gateway (the one ``kvgate serve`` runs: uvicorn on uvloop with the gateway's
edge protocol, admission and routing on, capacities set so every stream is admitted) and driver
processes (``bench.streams.driver``, raw sockets) that open N streams at a fixed rate and hold
them, each receiving one token every ITL. Once all N are open and settled, a steady window is
measured:

- gateway RSS (psutil) at the window's end minus its idle RSS, over N: memory per open stream;
- gateway CPU seconds (user + system, ``/proc`` via psutil) over the window, over the tokens the
  drivers received in it: CPU per token relayed;
- event-loop lag inside the gateway: a task in the gateway process sleeps 50 ms at a time and
  records by how much it wakes late (the gateway exports no such metric); p99 over the window,
  and idle before the streams;
- ITL as the clients see it, p50 / p99, against the backend's pacing and against the same N
  streams sent straight to the backends in the same run (the driver's and backend's own lag);
- errors (must be 0) and, after every stream has ended, the gateway's work gauges from
  ``/metrics`` (resident sequences, pending and queued tokens: must be back to 0).

A point is ``N@ITL_MS``; each runs direct first, then through a fresh gateway. A gateway holds two
descriptors per stream (client and replica connection): points above what the descriptor limit
allows (``kvgate.gateway.edge.edge_limits.connection_cap``) are refused before anything starts.
Every figure goes to ``results.json`` and the table and its plot to ``streams.md`` and
``streams.png`` in ``--out``, or to ``--report FILE`` (docs/streams.md is one).

    python -m bench streams --backend-cost 1000@50
    python -m bench streams [--points 1000@1000,2000@1000,5000@1000,9900@1000,400@30]
        [--open-per-s 500] [--window-s 20] [--drivers 2] [--report docs/streams.md]
"""
