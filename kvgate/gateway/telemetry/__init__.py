"""What the gateway tells operators and autoscalers: the one recorder (``metrics``) with its series
(``event_series``, ``collectors``, ``gauges``), the work per pool (``fleet_work`` reads the values of
``pool_work`` off the live state), the ``/signals`` document (``signals_doc``, ``sliding_windows``)
and the policy's answer on it (``recommender``), the access log, tracing and the event loop's own lag.
"""
