"""How many replicas each pool should have, from the work it holds, with the reason.

The policy is pure (``policy`` over windows of ``signals.PoolSignals``, with ``rules``, ``trend``
and ``recommendation``); its two edges are the loop that reads gateways' ``/signals``
(``loop``) and the actuators that resize a fleet (``actuators``).
"""
