"""Routing policies replayed on the simulator's own engines in simulated time: no sockets, no noise.

A real benchmark of a routing policy (``bench.goodput``) takes minutes of wall time on
shared cores and its numbers move between runs. The lab plays the same kind of trace through the
real ``Router`` in front of the simulator's ``Engine`` (vLLM's continuous batching with chunked
prefill, a prefix cache and preemption, stepped by the profile's roofline) on one virtual clock, so
a policy change is judged in seconds and the same inputs always give the same numbers.

What the router sees is what the gateway would: ``ReplicaView``s from the lab's own ledger (prompt
tokens still waiting for a first token, resident sequences, decode tokens they may still produce,
worst-case KV reserved), updated at every decision, plus a ``/metrics``-like scrape of each engine
every ``scrape_every_s``. Prompts are rendered and tokenised as the simulator does, so the router's
block hashes and the engines' prefix cache agree. With ``admission`` on, a request the router finds
no room for waits at the gateway and is offered again, in arrival order, whenever a sequence
finishes or another request arrives (a newcomer that still fits once the queue had its turn goes
at once, as kvgate's queue walk lets it; the queue has no deadlines here); a request that waited longer than
``max_queue_wait_s`` is refused. A request may be held for the full replica holding its prefix
(``routing.prefix_hold_s``, within half that wait), as the gateway's dispatcher does. With admission
off, every request is routed at once without the room filter (as a router without admission, and
as kvgate with ``admission.enabled: false``): the engines queue and preempt.

    python -m bench routing_lab [--trace below|overload|many-prefix] [--policies kvgate,...]
"""
