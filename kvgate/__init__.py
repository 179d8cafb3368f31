"""kvgate: an OpenAI-compatible gateway for vLLM fleets that admits, queues and routes requests by
the KV cache they will hold, and exports the work-based signals an autoscaler sizes the fleet on.

The rooms, each a subpackage, and what each may import (``tests/unit/test_imports.py``):
``config`` and ``vocabulary`` import none of the others; the pure cores ``admission``, ``routing``
and ``autoscaler`` import those two; ``gateway`` (the runtime edge) imports the cores; ``sim`` (the
vLLM simulator) and ``loadtest`` (``kvgate loadtest``) import the cores they need and never the
gateway; ``cli`` is the composition root that may import them all. ``docs/architecture.md`` draws
them.
"""
