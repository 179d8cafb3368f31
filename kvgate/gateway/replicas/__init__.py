"""The replicas as the gateway reaches them: the pooled HTTP/1.1 client of the completion routes
(``replica_http``, ``replica_connection``, ``replica_errors``), the aiohttp session for everything
else (``upstream``), health probes (``probes``), vLLM ``/metrics`` scrapes (``scrape``), DNS
discovery (``discovery``) and the fleet as each decision sees it (``fleet``).
"""
