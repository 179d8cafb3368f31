"""Autoscaling policies in closed loop on the simulator's engines, in virtual time: no sockets, no noise.

A real closed-loop run (``bench.autoscale``) takes many minutes of wall time per policy and
one scenario. The lab closes the same loop on one virtual clock: a fleet of the simulator's
``Engine``s (the profile's 60 s cold start and 30 s warm-up) behind kvgate's router, reservations
ledger and queue, the signals the gateway would export read through ``/signals``' own code, and a
scaler deciding the replica count every 15 s, carried out by an actuator that starts replicas cold
and drains them before removal. Virtual seconds are real seconds to every policy (its windows and
the cold start are not scaled); a run takes seconds of wall time and the same seed gives the same
numbers, so four scenarios x five scalers are compared in one sitting, and real processes confirm.

Scalers: kvgate's policy (``kvgate.autoscaler.policy``), without and with its forecast
(``kvgate_forecast``, its season the scenario's day); KEDA on ingress requests/s per replica; HPA on a
utilisation proxy (the engines' busy fraction); KEDA on vLLM's ``num_requests_waiting``; and an
oracle, the leanest schedule meeting the SLO computed from the whole trace and followed one cold
start ahead. Scenarios: a diurnal ramp, a 4x burst, a mix shift at constant request rate, a slow
leak of long-context sessions while the request rate falls; and weeks of ten-minute days whose
first day is history, measured on days 2-7: the burst every day, the mix shift every day, and the
burst moving to another time of day from the fourth day (the pattern breaks).

    python -m bench autoscale_lab [--scenario all|days|weeks|ramp,burst,...] [--policies ...]
        [--oracle-headroom H] [--present-only H,...] [--plots DIR] [--out DIR] [--seed N]
"""
