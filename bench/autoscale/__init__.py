"""Closed-loop autoscaling benchmark: a burst of heavier requests against two scaling signals.

``--mode real`` (default) closes the loop with real parts, time-scaled to a few minutes: a
``kvgate sim`` process (``llama-3.1-70b-4xh100`` profile, two replicas, a control port), a
``kvgate serve`` process in front of it whose config carries the autoscaler section (so the gateway
runs the policy on its own ``/signals`` and publishes ``desired_replicas``), the load generator
(``kvgate.loadtest.runner``: the normal mix all along plus, for the burst, as many requests again with
16x longer prompts), and the loop of ``kvgate autoscale --actuator sim`` acting on the answer:
``SimActuator`` adds replicas through the simulator's control API (each cold-starts) and sets the
gateway's replica set through ``PUT /admin/pools/default/replicas``. Every policy duration (windows,
interval, stabilisation, cold start, ramp) is the seed's divided by ``SCALE_RATIO``; latency targets
are not scaled. A second run replaces the gateway's answer with an HPA-style scaler on ingress
requests/s, its target 0.75 x what one replica sustains at the normal mix. Prints the figures,
writes them as ``figures.json`` and both runs on one PNG (``real.png``) into ``--out``, with each
run's gateway config and logs.

``--mode model`` runs a token-level fluid model of the fleet on a manual clock instead (0.1 s
ticks, unscaled 120 s cold start, a 20-minute burst): kvgate's admission queue in front, routing to
the replica with the most KV room, reservations of ``prompt + max_output`` tokens against each
replica's KV capacity, chunked prefill at a fixed token rate, and decode whose inter-token latency
grows with the batch. Three scalers see the same seeded trace: ``work`` (the policy with the
model's prefill capacity), ``conjunction`` (the policy without capacity figures, the shipped
default) and ``requests`` (HPA-style on requests/s over 60 s against the baseline-mix target);
their plot is ``model.png``. Not a test: numbers only.

    python -m bench autoscale [--mode real|model] [--out DIR] [--png FILE]
"""
