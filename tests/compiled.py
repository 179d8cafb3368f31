"""Whether a module runs as a C extension of ``make compile``: the few tests that look inside the code
(a method swapped out, an allocation found by its Python frame) cannot look inside compiled code."""

from __future__ import annotations

from types import ModuleType


def compiled(module: ModuleType) -> bool:
    """Whether ``module`` was imported from a compiled extension rather than its source."""
    return not str(module.__file__).endswith(".py")
