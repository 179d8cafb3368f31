"""Many gateways, one fleet: 1, 2 and 4 gateways sharing Redis claims, against N uncoordinated ones.

Processes: simulated replicas (``kvgate sim``, real time), a private ``redis-server``, N gateways
(``kvgate serve``, one config) and this driver (aiohttp, open-loop Poisson arrivals at ``overload`` x
the fleet's estimated capacity, each request sent to a gateway drawn at random as a Service would).
Two tenants of equal weight share the load unevenly (``--share-a`` of the requests are tenant a's),
so fairness says b, asking for less than half, gets what it asks and a the rest. A 429'd client
waits its ``retry-after-ms`` and retries (on a gateway drawn again) up to ``--retries`` times.

Each phase runs the same arrival schedule through fresh gateways in front of the same replicas.
Printed per phase, with ratios to the one-gateway phase of the same run: goodput (streams whose
first token came within ``--ttft-slo-s`` of their first attempt, Retry-After waits included, and
whose mean inter-token time stayed within ``--itl-slo-s``, per second of arrivals), preemptions (the
replicas' own counter; must be 0), the inter-token time's p50 and p95, each tenant's share of its
requests that met both objectives, the peak over-commit (the most requests all gateways had
admitted at once, from their ``kvgate_resident_sequences``, over what the replicas' KV caches hold
at the requests' real token counts: above 1 means N gateways sent more than fits), the gateways' CPU
per finished request (``/proc``, all gateways together), Redis's CPU, the share of 429'd clients
whose first retry got in, and the coordination's syncs per second; the table as markdown, a PNG
(``coordination.png`` in ``--out``). Not a test.

    python -m bench coordination [--duration-s 15] [--overload 2.0] [--gateways 1,2,4]
"""
