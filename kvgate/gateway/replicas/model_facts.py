"""What each replica says it serves, against what the config says it should.

A replica's ``GET /v1/models`` (vLLM's: ``data[].id`` and ``data[].max_model_len``) is read once when
it joins the fleet (at start, and whenever discovery adds it) and compared with the config; its
``/metrics`` page's cache facts (KV capacity, block size) are compared on each scrape
(``kvgate.gateway.replicas.scrape``). Every disagreement is one log line naming the replica, the
fact, the configured value and the replica's:

- a model configured for the replica's pool that the replica does not serve is **refused**: the
  replica takes no request for it (its request would be a 404 from vLLM), and a replica left with no
  model takes none at all;
- a ``max_model_len`` the replica reports lower than the config's is an **error** (a request that
  fits the configured window but not the replica's is a 400 from vLLM), a higher one a warning (the
  gateway refuses requests the replica could serve);
- a KV block size other than ``routing.block_size_tokens`` is a warning (prefix hashes then name
  other blocks than the replica's cache holds).

A replica that does not answer ``/v1/models`` keeps the configured facts and is asked again on the
next scrape.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from kvgate.gateway.replicas.upstream import replica_headers
from kvgate.gateway.state import GatewayState, ReplicaState

MODELS_PATH = "/v1/models"
log = logging.getLogger("kvgate.model_facts")


@dataclass(frozen=True, slots=True)
class Served:
    """What a replica's ``/v1/models`` says: each served name and its context window, when given."""

    max_model_len: Mapping[str, int | None]


@dataclass(frozen=True, slots=True)
class Finding:
    level: int
    """A ``logging`` level: ERROR for what refuses or fails requests, WARNING otherwise."""
    message: str


def parse_models(body: Any) -> Served | None:
    """The served models of a ``/v1/models`` body, or None when it is not one."""
    if not isinstance(body, Mapping) or not isinstance(body.get("data"), list):
        return None
    served: dict[str, int | None] = {}
    for entry in body["data"]:
        if isinstance(entry, Mapping) and isinstance(entry.get("id"), str):
            length = entry.get("max_model_len")
            valid = isinstance(length, int) and not isinstance(length, bool) and length > 0
            served[entry["id"]] = length if valid else None
    return Served(served)


def compare(
    replica: ReplicaState, served: Served, configured_max_model_len: Mapping[str, int]
) -> tuple[frozenset[str], list[Finding]]:
    """The models ``replica`` keeps (those configured for it that it serves) and what disagrees."""
    where = f"replica {replica.url} ({replica.name}) of pool {replica.pool}"
    findings: list[Finding] = []
    kept = frozenset(m for m in replica.models if m in served.max_model_len)
    missing = sorted(replica.models - kept)
    if missing:
        then = "it takes no requests at all" if not kept else f"it takes requests for {sorted(kept)} only"
        findings.append(
            Finding(
                logging.ERROR,
                f"{where} does not serve {missing}, configured for its pool; it serves "
                f"{sorted(served.max_model_len)} (GET {MODELS_PATH}): {then}",
            )
        )
    for model in sorted(kept):
        reported = served.max_model_len[model]
        configured = configured_max_model_len.get(model)
        if reported is None or configured is None or reported == configured:
            continue
        if reported < configured:
            findings.append(
                Finding(
                    logging.ERROR,
                    f"{where} serves {model} with max_model_len {reported} tokens but models.{model}."
                    f"max_model_len is {configured}: a request between the two is a 400 from the "
                    f"replica; set max_model_len to {reported}",
                )
            )
        else:
            findings.append(
                Finding(
                    logging.WARNING,
                    f"{where} serves {model} with max_model_len {reported} tokens but models.{model}."
                    f"max_model_len is {configured}, which stays in use: requests the replica could "
                    "serve are refused",
                )
            )
    return kept, findings


def block_size_finding(replica: ReplicaState, reported: int | None, configured: int) -> Finding | None:
    if reported is None or reported == configured:
        return None
    return Finding(
        logging.WARNING,
        f"replica {replica.url} ({replica.name}) of pool {replica.pool} has KV blocks of {reported} "
        f"tokens (vllm:cache_config_info block_size) but routing.block_size_tokens is {configured}: "
        "prefix-cache routing hashes other blocks than the replica caches; set it to "
        f"{reported}",
    )


class ModelFacts:
    """Reads each new replica's ``/v1/models`` once and applies what it says (see the module)."""

    def __init__(
        self, state: GatewayState, session: aiohttp.ClientSession, timeout: aiohttp.ClientTimeout
    ) -> None:
        self._state = state
        self._session = session
        self._timeout = timeout
        self._read: set[str] = set()
        """Replicas whose facts were read and applied."""
        self._block_sizes: dict[str, int] = {}
        """Per replica, the block size last warned about."""

    def forget_gone(self) -> None:
        present = self._state.replicas.keys()
        self._read &= present
        for replica_id in [r for r in self._block_sizes if r not in present]:
            del self._block_sizes[replica_id]

    def pending(self, replica: ReplicaState) -> bool:
        return replica.replica_id not in self._read

    async def read(self, replica: ReplicaState) -> None:
        """Ask ``replica`` what it serves, once it answers, and apply it."""
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, UnicodeDecodeError):
            async with self._session.get(
                replica.url + MODELS_PATH, headers=replica_headers(replica), timeout=self._timeout
            ) as response:
                if response.status != 200:
                    return
                body = await response.read()
            try:
                served = parse_models(orjson.loads(body))
            except orjson.JSONDecodeError:
                return
            if served is None:
                return
            configured = {name: model.max_model_len for name, model in self._state.models.items()}
            kept, findings = compare(replica, served, configured)
            self._read.add(replica.replica_id)
            if kept != replica.models:
                replica.models = kept
            for finding in findings:
                log.log(finding.level, "%s", finding.message)

    def check_block_size(self, replica: ReplicaState, reported: int | None) -> None:
        configured = self._state.ledger.block_tokens
        if reported is None or self._block_sizes.get(replica.replica_id) == reported:
            return
        self._block_sizes[replica.replica_id] = reported
        finding = block_size_finding(replica, reported, configured)
        if finding is not None:
            log.log(finding.level, "%s", finding.message)
