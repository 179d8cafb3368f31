"""Mixed against prefill/decode disaggregated, at the same number of simulated GPUs, on two traces.

For each trace (``prefill-heavy``: mostly long prompts with short answers beside chat turns;
``decode-heavy``: short prompts with long answers beside a few long prompts), simulated fleets of
``--gpus`` replicas each: one mixed fleet behind kvgate, one split ``--prefill`` prefill + the rest
decode behind kvgate (``role: prefill`` / ``role: decode`` pools, docs/pd.md) and, when
``vllm-router`` is installed (``--peer-bin-dir``) and its P/D mode comes up, one more P/D fleet behind
``vllm-router --vllm-pd-disaggregation``. Every fleet is a fleet child (``bench.harness.fleet``, its
replicas' warm-up off); the simulator's decode replicas pull each prompt's KV from the prefill
replica and charge its bytes over ``kv_link_bytes_per_s``. The trace is played through
``kvgate.loadtest.compare.run_compare`` (slices interleaved across targets, the same bytes to each).

Printed per trace and target: requests, successes, goodput (both SLOs met: TTFT and the mean
inter-token gap), TTFT p50/p95, inter-token gap p50/p95/p99, and the ITL stability P/D is for: the
p95 over requests of each stream's longest gap (a mixed replica stalls its decodes while it runs a
long prefill), with ratios against the mixed row, and whether each fleet's simulator kept its
schedule (``kvgate_sim_lag_ratio``). A markdown table and a PNG (goodput, ITL p99,
worst-gap p95 and the gap CDFs) are written into ``--out`` (``pd.md``, ``pd.png``). Not a test.

    python -m bench pd [--gpus 4] [--prefill 2] [--rate 6] [--duration-s 20] [--slices 2]
        [--traces prefill-heavy,decode-heavy] [--peer-bin-dir /tmp/peersvenv/bin]
"""
