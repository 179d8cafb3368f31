"""The runtime edge: everything between a client's socket and a replica's, around the pure cores.

Five subsystems share the live state (``state``: replicas, requests in flight, the ledger):
``edge`` (the HTTP server, its limits, the ASGI app and admin routes, OpenAI-shaped errors),
``request_path`` (price, admit, route, relay, account, release: one request's life), ``replicas``
(the client to replicas, probes, scrapes, discovery, the fleet as decisions see it),
``coordination`` (several gateways sharing capacity through Redis) and ``telemetry`` (``/metrics``,
``/signals``, the access log, tracing).
"""
