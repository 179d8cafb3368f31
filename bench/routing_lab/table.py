"""What the routing lab prints: per policy, goodput, refusals, TTFT, ITL, prefix hits and preemptions,
goodput by request class, and where the served requests' sequence slots went."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bench.routing_lab.replay import LabResult


def percentile(values: Iterable[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def print_results(
    results: Sequence[LabResult], ttft_slo: float, itl_slo: float, ttft_per_prompt_token_s: float = 0.0
) -> None:
    classes = sorted({o.request.class_name for o in results[0].outcomes})
    print(
        f"{'policy':<16} {'good %':>7} {'refused':>7} {'ttft p50':>9} {'ttft p95':>9} {'itl p95 ms':>10} "
        f"{'hit':>6} {'+host':>6} {'preempt':>7}  " + " ".join(f"{c[:10]:>10}" for c in classes)
    )
    for result in results:
        served = [o for o in result.outcomes if not o.refused]
        ttft = [o.ttft_s for o in served if o.ttft_s is not None]
        itl = [o.mean_itl_s for o in served if o.mean_itl_s is not None]
        p50, p95, itl95 = percentile(ttft, 0.5), percentile(ttft, 0.95), percentile(itl, 0.95)
        per_class = " ".join(
            f"{100 * result.good_share(ttft_slo, itl_slo, c, ttft_per_prompt_token_s):>9.1f}%"
            for c in classes
        )
        good = result.good_share(ttft_slo, itl_slo, None, ttft_per_prompt_token_s)
        print(
            f"{result.policy:<16} {100 * good:>6.1f}% "
            f"{len(result.outcomes) - len(served):>7} {p50 or 0:>9.3f} {p95 or 0:>9.3f} "
            f"{1000 * (itl95 or 0):>10.1f} {result.hit_ratio:>6.3f} "
            f"{result.tiered_hit_ratio:>6.3f} {result.preemptions:>7}  {per_class}"
        )
    print("sequence slot-seconds of the served requests (prefill: routed to first token; decode: the rest)")
    for result in results:
        prefill_s, decode_s = slot_seconds(result)
        share = prefill_s / (prefill_s + decode_s) if prefill_s + decode_s else 0.0
        print(
            f"{result.policy:<16} prefill {prefill_s:>7.0f} s  decode {decode_s:>7.0f} s  "
            f"prefill share {share:.3f}"
        )


MARKDOWN_HEADER = (
    "| trace | admission | cache facts | policy | good % | refused | TTFT p50 / p95 | ITL p95 | prefix hit "
    "| +host | preemptions |"
)


def print_markdown(
    results: Sequence[LabResult],
    trace: str,
    admission: bool,
    kv_events: bool,
    ttft_slo: float,
    itl_slo: float,
    ttft_per_prompt_token_s: float = 0.0,
) -> None:
    """The rows as the documents' tables show them, so ``make docs-check`` can compare them."""
    print(MARKDOWN_HEADER)
    print("|" + "---|" * MARKDOWN_HEADER.count(" |"))
    facts = "events" if kv_events else "routed"
    for result in results:
        served = [o for o in result.outcomes if not o.refused]
        ttft = [o.ttft_s for o in served if o.ttft_s is not None]
        itl = [o.mean_itl_s for o in served if o.mean_itl_s is not None]
        p50, p95, itl95 = percentile(ttft, 0.5), percentile(ttft, 0.95), percentile(itl, 0.95)
        good = result.good_share(ttft_slo, itl_slo, None, ttft_per_prompt_token_s)
        print(
            f"| {trace} | {'on' if admission else 'off'} | {facts} | {result.policy} | {100 * good:.1f} % "
            f"| {len(result.outcomes) - len(served)} | {_seconds(p50)} / {_seconds(p95)} "
            f"| {1000 * (itl95 or 0):.1f} ms | {result.hit_ratio:.3f} | {result.tiered_hit_ratio:.3f} "
            f"| {result.preemptions} |"
        )


def _seconds(value: float | None) -> str:
    value = value or 0.0
    return f"{1000 * value:.0f} ms" if value < 1 else f"{value:.2f} s"


def slot_seconds(result: LabResult) -> tuple[float, float]:
    """Sequence-slot time the served requests held in prefill and in decode.

    When the fleet is bound by its sequence slots (what keeps more requests from being admitted is
    ``max_num_seqs``, not KV or compute), a router can raise goodput only by shortening this time,
    and the prefill share is the most that prefix hits could save."""
    prefill_s = decode_s = 0.0
    for outcome in result.outcomes:
        if outcome.routed_s is None or outcome.first_token_s is None or outcome.last_token_s is None:
            continue
        prefill_s += outcome.first_token_s - outcome.routed_s
        decode_s += outcome.last_token_s - outcome.first_token_s
    return prefill_s, decode_s
