"""The gateway configuration every benchmark starts from: pools of replica URLs, one model, overrides.

What the benchmarks share is written once: the gateway listens on loopback, serves one model
(Llama-3.1-8B's 128k window and 131,072 KV bytes per token unless told otherwise) from one pool or a
prefill/decode pair; each benchmark adds only what it measures (``admission``, ``routing``,
``coordination``, limits in ``server`` ...). The result is the document ``kvgate serve --config``
reads (``kvgate.config.loader.parse_config`` for a gateway in the benchmark's own process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.sim.fleet import DEFAULT_MODEL


@dataclass(frozen=True, slots=True)
class Pool:
    replicas: Sequence[str]
    name: str = "default"
    kv_capacity_tokens: int = 450_000
    max_sequences: int | None = None
    role: str | None = None
    """``prefill`` or ``decode`` for a disaggregated pair; None: mixed."""

    def section(self) -> dict[str, Any]:
        pool: dict[str, Any] = {
            "name": self.name,
            "replicas": list(self.replicas),
            "kv_capacity_tokens": self.kv_capacity_tokens,
        }
        if self.role is not None:
            pool["role"] = self.role
        if self.max_sequences is not None:
            pool["max_sequences"] = self.max_sequences
        return pool


@dataclass(frozen=True, slots=True)
class Model:
    name: str = DEFAULT_MODEL
    max_model_len: int = 131_072
    kv_bytes_per_token: int = 131_072
    tokenizer: Mapping[str, Any] | None = None

    def section(self) -> dict[str, Any]:
        model: dict[str, Any] = {
            "name": self.name,
            "max_model_len": self.max_model_len,
            "kv_bytes_per_token": self.kv_bytes_per_token,
        }
        if self.tokenizer is not None:
            model["tokenizer"] = dict(self.tokenizer)
        return model


def gateway_config(
    pools: Pool | Sequence[Pool],
    *,
    port: int = 0,
    model: Model | None = None,
    **sections: Mapping[str, Any],
) -> dict[str, Any]:
    """The config document; ``server`` is merged over the loopback address, ``port`` and no drain
    delay (a benchmark's gateway stops at once: nothing is measured after), every other section
    (``health``, ``admission``, ``routing`` ...) is taken as given."""
    server = {"host": "127.0.0.1", "port": port, "drain_delay_s": 0, **sections.pop("server", {})}
    return {
        "server": server,
        "models": [(model or Model()).section()],
        "pools": [pool.section() for pool in ([pools] if isinstance(pools, Pool) else pools)],
        **{name: dict(section) for name, section in sections.items()},
    }
