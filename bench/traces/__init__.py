"""Production-shaped traces in the Mooncake format (``shapes``), written by ``python -m bench traces``."""
