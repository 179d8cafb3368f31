"""Chaos benchmark: hostile clients and broken dependencies against real processes; invariants checked.

Each scenario starts its own ``kvgate sim`` replicas (real time) and ``kvgate serve`` gateway(s) on
loopback, each logging to a file under ``--out``, does its damage, then checks:

- **drained**: every work gauge on ``/metrics`` (queued requests and prompt tokens, pending prompt
  tokens, resident sequences, remaining decode tokens, the estimated KV occupancy) reads 0 again;
- **no tracebacks** in the gateway's log;
- **nothing lost**: every client got a complete answer, an OpenAI-shaped error, or a stream that
  ended with an error event and ``[DONE]`` (clients that hung up on purpose are counted apart);
- **still serving**: a few ordinary requests afterwards complete;

plus its own checks (below), and records figures: requests and outcomes, statuses, time to drain,
the gateway's RSS and open descriptors before and after (psutil), and the work gauges over time.

Scenarios: ``storm_streaming`` (N clients hang up at once mid-stream), ``storm_queued`` (two waves of
N clients hang up while queued in front of a small fleet), ``slow_readers`` (streams whose clients
stop reading: their reservations must be released while the sockets stay open), ``slowloris``
(partial headers and slow bodies, more connections than the gateway has descriptors: each must be
closed by a timeout and ordinary requests answered meanwhile), ``replica_kill`` (a replica killed
mid-stream through the simulator's control API), ``redis_restart`` (two gateways sharing a private
``redis-server`` that is stopped and started again: both keep serving, the failure is visible).

Settings that other work is adding (``server.header_timeout_s`` and friends,
``coordination.fail_mode``) are written into the generated config; a key today's gateway does not
know is dropped, named in the output, and the check that needs it fails with that reason.
Bounded in count and time, loopback only, stops by itself. Not a test. Writes ``results.md``,
``results.json``, a PNG of the work gauges and every process's log into ``--out``.

    python -m bench chaos [--quick] [--out DIR] [--only storm_queued,slowloris] [--clients 500]
"""
