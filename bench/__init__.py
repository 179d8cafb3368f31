"""kvgate's benchmarks and labs: not installed, not tests; each measures one thing about kvgate.

``python -m bench`` lists them (``bench.catalog``), ``python -m bench NAME --help`` says what one
measures and how to run it. They share one harness (``bench.harness``): simulated fleets, gateways
from one config builder, the Rust routers as peers, one ``/metrics`` parser, one process reaper and
one convention for what a run writes (``--out``).
"""
