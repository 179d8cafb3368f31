"""Several gateways in front of one fleet admitting as one: claims on each replica's capacity kept in
Redis by one script (``coordinator``, ``claim_script``), promises shared so a client may come back
to any gateway (``shared_promises``), and Redis failing without stopping a gateway (``failures``).
"""
