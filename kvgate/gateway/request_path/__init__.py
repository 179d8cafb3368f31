"""One request's life, in the order the proxy (``proxy``) calls each step: parse, price
(``pricing``, ``prompt``), admit and route (``dispatcher``), relay to a replica (``relay``; two hops
for prefill/decode pools, ``handoff``), account what it served (``accounting``), release its
reservation exactly once (its lease meanwhile: ``leases``). ``decision_path`` builds these parts over
one clock; ``forwarding`` decides which headers cross.
"""
