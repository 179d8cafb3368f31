"""Whether a request runs now, waits or is refused, decided on what it costs in KV tokens.

Pure: the tokeniser seam and the cost estimate (``cost``, ``counting``), the reservations ledger
(``ledger``), the wait queue and its pump (``queue``, ``pump``), the decision (``controller``),
refusals and Retry-After (``refusals``, ``retry_after``, ``promises``), and the claims that let
several gateways admit as one (``claims``, ``coordination_gate``). Time comes in as ``now_s``.
"""
