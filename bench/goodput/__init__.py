"""Goodput by routing policy: kvgate against round-robin, least-request and the Rust routers, one trace.

Three simulated fleets of the same size and profile (each a fleet child, ``bench.harness.fleet``: a
``SimFleet`` with the replicas' own warm-up turned off, so no policy meets a cold engine), three
gateways (``kvgate serve``) that differ only in ``routing.policy``, each in front of its own fleet,
and this driver. With ``--peers`` (default: every one installed, see ``bench.harness.peers``), each
``vllm-router`` or ``sglang-router`` policy is one more target in front of one more fleet of its
own; a peer that is not installed or does not come up is named in one line and left out. The trace
mixes the ``mixed`` preset's short and 30,000-token requests with ``shared-prefix`` sessions (system
prompts shared by multi-turn conversations); the fleets' KV caches are cut down so they cannot hold
every system prompt at once, as a loaded fleet cannot. The trace is played through
``kvgate.loadtest.compare.run_compare``: cut into time slices, each slice played against every target in
rotating order, the same bytes to each.

Printed per target: goodput (requests meeting both SLOs: TTFT, and mean inter-token gap), p95 TTFT,
p95 inter-token gap, the fleet's prefix-cache hit rate and preemptions over the run (the replicas'
own ``vllm:prefix_cache_*`` and ``vllm:num_preemptions`` counters; beside the hit rate, ``hit 1st``
counts each request's first schedule only, leaving out the re-prefills after preemption), ratios
against round-robin, whether the simulator lagged (``kvgate_sim_lag_ratio``, the worst replica)
and whether the generator kept its schedule and was CPU-bound (the runner's own report). A PNG
(``goodput.png`` in ``--out``) shows goodput, hit rate and the TTFT CDFs. Not a test.

With ``--replay`` the trace is a production one in the Mooncake format (a shape of ``bench.traces``
at ``--rate``, or a file at ``--speed``), sent as streamed completions with the trace's lengths, on
full-size replicas that publish their KV cache events (kvgate subscribes, as it would to vLLM's), the
TTFT objective growing with the prompt; the replay's reuse ceiling is printed beside the hit rates.

    python -m bench goodput [--replicas 4] [--rate 16] [--duration-s 36] [--slices 3]
        [--peers all|none|NAME,...] [--peer-bin-dir DIR]
    python -m bench goodput --replay FILE|SHAPE [--speed 2] [--window-s 300] [--time-scale 0.5]
        [--cpu-offload-tokens N]
"""
