"""Which replica serves an admitted request: filters, scorers in [0, 1], a seeded picker.

Pure: the policies (``policies/``) score replicas over one snapshot of the fleet on outstanding
tokens and prefix-cache locality (``prefix_hash``, ``prefix_index``), ramp cold replicas
(``ramp``), eject failing ones (``health``) and bound retries (``retry_budget``).
"""
