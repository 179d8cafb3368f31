"""The host-tier loads in flight on one engine: which blocks each brings in, and when each ends.

vLLM's offloading connector loads a prefix found only in host memory back over the host link
(``cpu_offload_bytes_per_s``) while the request waits and others run; loads queue on that link, one
at a time, so they end in the order they started, and a block is loaded once (a second request
needing it waits for the first load). The engine (``engine``) decides what to load; this is the
link's bookkeeping, kept apart so the scheduler reads as scheduling. Pure: times are given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from kvgate.sim.sequence import EngineRequest


class HostLoads:
    def __init__(self, kv_bytes_per_token: float, link_bytes_per_s: float) -> None:
        self._kv_bytes_per_token = kv_bytes_per_token
        self._link_bytes_per_s = link_bytes_per_s
        self._pending: deque[EngineRequest] = deque()
        """Requests whose prefix is loading, in the order their loads end."""
        self._link_free_s = 0.0
        self._blocks: set[int] = set()
        """Hashes of the blocks pending loads bring in."""

    def __len__(self) -> int:
        return len(self._pending)

    def __iter__(self) -> Iterator[EngineRequest]:
        return iter(self._pending)

    def __contains__(self, request: object) -> bool:
        return request in self._pending

    @property
    def next_done_s(self) -> float | None:
        """When the first pending load ends."""
        return self._pending[0].load_done_s if self._pending else None

    def overlaps(self, hashes: tuple[int, ...]) -> bool:
        """Whether a pending load already brings in one of these blocks."""
        return not self._blocks.isdisjoint(hashes)

    def start(self, request: EngineRequest, hashes: tuple[int, ...], num_tokens: int, now_s: float) -> None:
        """Load ``num_tokens`` of ``request``'s prefix (blocks ``hashes``) once the link is free."""
        load_s = num_tokens * self._kv_bytes_per_token / self._link_bytes_per_s
        request.load_done_s = self._link_free_s = max(now_s, self._link_free_s) + load_s
        request.loading = hashes
        self._blocks.update(hashes)
        self._pending.append(request)

    def finished(self, now_s: float) -> list[EngineRequest]:
        """The requests whose loads have ended by ``now_s``, in order, no longer pending."""
        done: list[EngineRequest] = []
        pending = self._pending
        while pending and pending[0].load_done_s <= now_s:
            request = pending.popleft()
            self._blocks.difference_update(request.loading)
            request.loading = ()
            done.append(request)
        return done

    def cancel(self, request: EngineRequest) -> None:
        """Forget a pending load whose request went away."""
        self._pending.remove(request)
        self._blocks.difference_update(request.loading)
