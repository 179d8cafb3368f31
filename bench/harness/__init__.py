"""What every benchmark shares: fleets, gateways, peers, metrics, processes, reports, the command line."""
