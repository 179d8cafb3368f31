"""The one base class of every configuration section.

A section is frozen, so a config read at start-up stays what was read while the gateway hands its
sections out, and strict about its keys, so a misspelt key fails loudly instead of falling back to
a default without a word. Field names carry their unit (``_s``, ``_tokens``, ``_bytes``,
``_ratio``) and every field's description gives its unit, default and an example; the loader
names the unit when it reports a bad value.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
