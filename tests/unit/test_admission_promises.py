from __future__ import annotations

import dataclasses
from itertools import count

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.admission.cost import CostEstimate
from kvgate.admission.decision import AdmissionRequest, Admit, Queue, Refusal, RefusalReason
from kvgate.admission.promises import PromiseBook, fingerprint, request_key, retry_count
from kvgate.admission.tenants import Tenant
from kvgate.config.admission import AdmissionConfig
from kvgate.config.tenants import PriorityClass
from tests.unit.test_admission_controller import MODEL, Fleet

_ids = count(1)
NO_QUEUE = AdmissionConfig(max_queue_wait_s=0.0, promise_grace_s=1.0, promise_max_share=1.0)
"""Promises may hold the whole of ``full_fleet``'s one replica: two of 512 tokens."""


def freq(
    body: bytes,
    prompt: int = 112,
    max_output: int = 400,
    tenant: Tenant | None = None,
    retry: int | None = 0,
) -> AdmissionRequest:
    """A request as the openai SDK sends it: ``retry`` is its ``x-stainless-retry-count`` (0 on the
    first attempt; None for a client that does not say)."""
    return AdmissionRequest(
        f"p{next(_ids)}",
        tenant or Tenant("t"),
        CostEstimate(MODEL, prompt, max_output, 131072),
        None,
        body,
        retry,
    )


def full_fleet(config: AdmissionConfig = NO_QUEUE) -> tuple[Fleet, list[AdmissionRequest]]:
    """One replica of 1024 KV tokens (64 blocks) holding two 512-token sequences."""
    fleet = Fleet(config, {"r": 1024})
    resident = [freq(b"a"), freq(b"b")]
    for request in resident:
        assert isinstance(fleet.admit(request), Admit)
    return fleet, resident


def refused(fleet: Fleet, request: AdmissionRequest) -> Refusal:
    decision = fleet.admit(request)
    assert isinstance(decision, Refusal) and decision.retry_after is not None, decision
    return decision


def test_a_request_back_at_its_retry_after_goes_before_new_arrivals() -> None:
    fleet, resident = full_fleet()
    first = refused(fleet, freq(b"c"))
    assert first.reason is RefusalReason.KV_CAPACITY
    assert fleet.controller.queue_stats(fleet.now_s).promised_requests == 1
    assert first.retry_after is not None
    fleet.now_s = first.retry_after.expected_s - 0.5
    fleet.release(resident[0].request_id)
    newcomer = refused(fleet, freq(b"d"))
    assert newcomer.retry_after is not None
    assert newcomer.retry_after.expected_s > 0.5
    fleet.now_s = first.retry_after.milliseconds / 1000.0
    assert isinstance(fleet.admit(freq(b"c", retry=1)), Admit)
    assert fleet.controller.queue_stats(fleet.now_s).promised_requests == 1
    assert fleet.ledger.totals().reserved_kv_tokens == 1024


def test_without_the_promise_the_newcomer_would_have_taken_the_room() -> None:
    fleet, resident = full_fleet()
    fleet.now_s = 3.0
    fleet.release(resident[0].request_id)
    assert isinstance(fleet.admit(freq(b"d")), Admit)


def test_unclaimed_promises_expire_and_free_what_they_held() -> None:
    fleet, resident = full_fleet()
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None
    fleet.release(resident[0].request_id)
    fleet.now_s = first.retry_after.expected_s + NO_QUEUE.promise_grace_s + 0.01
    assert fleet.controller.queue_stats(fleet.now_s).promised_requests == 0
    assert isinstance(fleet.admit(freq(b"d")), Admit)


def test_a_claimant_never_over_commits_the_fleet() -> None:
    fleet, _ = full_fleet()
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None
    fleet.now_s = first.retry_after.expected_s
    again = fleet.admit(freq(b"c", retry=1))
    assert not isinstance(again, Admit)
    assert fleet.ledger.totals().reserved_kv_tokens == 1024
    assert fleet.controller.queue_stats(fleet.now_s).promised_requests == 1


def test_a_claimant_that_must_wait_is_queued_at_the_head_of_its_class() -> None:
    config = AdmissionConfig(max_queue_wait_s=10.0, promise_grace_s=1.0)
    fleet, resident = full_fleet(config)
    hurried = AdmissionRequest("c1", Tenant("t"), CostEstimate(MODEL, 100, 400, 131072), 0.1, b"c", 0)
    first = refused(fleet, hurried)
    assert first.reason is RefusalReason.DEADLINE and first.retry_after is not None
    fleet.now_s = first.retry_after.expected_s
    waiting = fleet.admit(freq(b"e"))
    claimant = fleet.admit(freq(b"c", retry=1))
    assert isinstance(waiting, Queue) and isinstance(claimant, Queue)
    dispatched = fleet.release(resident[0].request_id)
    assert [d.ticket for d in dispatched] == [claimant.ticket]
    assert [d.ticket for d in fleet.release(resident[1].request_id)] == [waiting.ticket]


def test_retry_after_grows_with_the_promises_ahead() -> None:
    fleet, _ = full_fleet()
    hints = [refused(fleet, freq(bytes([i]) * 3, prompt=16, max_output=112)).retry_after for i in range(6)]
    expected = [h.expected_s for h in hints if h is not None]
    assert expected == sorted(expected)
    assert expected[-1] > expected[0]
    assert all(h is not None and h.honest for h in hints)
    assert fleet.controller.queue_stats(0.0).promised_requests == 6


def test_a_promise_never_outranks_a_higher_class() -> None:
    fleet, resident = full_fleet()
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None
    fleet.now_s = first.retry_after.expected_s
    fleet.release(resident[0].request_id)
    critical = Tenant("vip", priority=PriorityClass.CRITICAL)
    assert isinstance(fleet.admit(freq(b"v", tenant=critical)), Admit)
    assert not isinstance(fleet.admit(freq(b"c", retry=1)), Admit)


def test_early_return_keeps_its_place_and_is_told_the_time_left() -> None:
    config = AdmissionConfig(
        max_queue_wait_s=0.0, promise_grace_s=1.0, retry_after_cap_s=10.0, promise_max_share=1.0
    )
    fleet, _ = full_fleet(config)
    first = refused(fleet, freq(b"c", max_output=600))
    assert first.retry_after is not None and first.retry_after.honest
    due_s = first.retry_after.expected_s
    assert due_s > 3.0
    fleet.now_s = 1.0
    early = refused(fleet, freq(b"c", max_output=600, retry=1))
    assert early.retry_after is not None
    assert abs(early.retry_after.expected_s - (due_s - 1.0)) < 1e-9
    assert fleet.controller.queue_stats(fleet.now_s).promised_requests == 1


def test_an_identical_first_attempt_does_not_claim_the_promise() -> None:
    fleet, resident = full_fleet()
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None
    fleet.now_s = first.retry_after.expected_s
    fleet.release(resident[0].request_id)
    assert not isinstance(fleet.admit(freq(b"c", retry=0)), Admit)
    assert isinstance(fleet.admit(freq(b"c", retry=1)), Admit)


def test_an_identical_body_without_retry_evidence_does_not_claim_the_promise() -> None:
    fleet, resident = full_fleet()
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None
    fleet.now_s = first.retry_after.expected_s
    fleet.release(resident[0].request_id)
    assert not isinstance(fleet.admit(freq(b"c", retry=None)), Admit)
    assert isinstance(fleet.admit(freq(b"c", retry=1)), Admit)


def test_a_refused_request_that_will_not_say_it_retries_books_no_promise() -> None:
    fleet, _ = full_fleet()
    refused(fleet, freq(b"c", retry=None))
    assert fleet.controller.queue_stats(0.0).promised_requests == 0


def test_a_promise_never_makes_a_request_wait_while_capacity_is_free() -> None:
    config = AdmissionConfig(max_queue_wait_s=0.0, promise_grace_s=1.0, retry_after_cap_s=1.0)
    fleet, resident = full_fleet(config)
    first = refused(fleet, freq(b"c", max_output=600))
    assert first.retry_after is not None and first.retry_after.expected_s > 3.0
    for request in resident:
        fleet.release(request.request_id)
    fleet.now_s = 1.0
    assert isinstance(fleet.admit(freq(b"c", max_output=600, retry=1)), Admit), "the room is free now"
    assert fleet.controller.queue_stats(fleet.now_s).promised_requests == 0, "the promise was used up"
    assert isinstance(fleet.admit(freq(b"c", max_output=100, retry=1)), Admit)


def test_another_clients_identical_body_on_an_idle_fleet_is_admitted_not_told_to_wait() -> None:
    config = AdmissionConfig(max_queue_wait_s=0.0, promise_grace_s=1.0, retry_after_cap_s=1.0)
    fleet, resident = full_fleet(config)
    refused(fleet, freq(b"c", max_output=400))
    for request in resident:
        fleet.release(request.request_id)
    fleet.now_s = 0.5
    assert isinstance(fleet.admit(freq(b"c", max_output=400, retry=2)), Admit)


def test_promises_count_against_the_queue_bounds() -> None:
    config = AdmissionConfig(max_queue_wait_s=0.0, queue_max_requests=2, promise_max_share=1.0)
    fleet, _ = full_fleet(config)
    refused(fleet, freq(b"c"))
    refused(fleet, freq(b"d"))
    assert refused(fleet, freq(b"e")).reason is RefusalReason.QUEUE_FULL
    assert fleet.controller.queue_stats(0.0).promised_requests == 2


def test_requests_without_a_body_are_never_promised() -> None:
    fleet, _ = full_fleet()
    plain = AdmissionRequest("x", Tenant("t"), CostEstimate(MODEL, 100, 400, 131072))
    refused(fleet, plain)
    assert fleet.controller.queue_stats(0.0).promised_requests == 0


def test_book_find_expire() -> None:
    book = PromiseBook(grace_s=1.0)
    request = freq(b"x")
    late = book.book(("t", b"k"), request, 5.0)
    early = book.book(("t", b"k"), request, 2.0)
    assert book.find(("t", b"k")) == early
    assert [p.promise_id for p in book.due(1.5)] == [early.promise_id]
    assert book.expire(3.5) == 1
    assert book.find(("t", b"k")) == late
    book.remove(late)
    assert len(book) == 0 and book.kv_tokens == 0 and book.find(("t", b"k")) is None


def test_retry_count_header() -> None:
    assert retry_count({"x-stainless-retry-count": "2"}) == 2
    assert retry_count({"x-stainless-retry-count": "-1"}) is None
    assert retry_count({}) is None
    assert retry_count({"x-stainless-retry-count": "\u00b2"}) is None, "a superscript digit is no count"
    assert retry_count({"x-stainless-retry-count": "9" * 5000}) is None, "nor is a number too long to convert"
    assert fingerprint(b"same") == fingerprint(b"same") != fingerprint(b"other")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["arrive", "return", "release", "wait"]),
            st.integers(0, 7),
            st.sampled_from([PriorityClass.CRITICAL, PriorityClass.STANDARD]),
        ),
        max_size=40,
    )
)
def test_promises_never_over_commit_a_replica(steps: list[tuple[str, int, PriorityClass]]) -> None:
    fleet = Fleet(AdmissionConfig(max_queue_wait_s=1.0, promise_grace_s=1.0), {"r1": 1200, "r2": 896})
    resident: list[str] = []
    due_s: dict[int, float] = {}
    for action, n, priority in steps:
        if action in ("arrive", "return"):
            request = freq(
                bytes([n]), max_output=100 * (n + 1), tenant=Tenant(f"t{n % 2}", priority=priority)
            )
            if action == "return" and n in due_s:
                fleet.now_s = max(fleet.now_s, due_s.pop(n))
                request = dataclasses.replace(request, retry_count=1)
            decision = fleet.admit(request)
            if isinstance(decision, Admit):
                resident.append(request.request_id)
            elif isinstance(decision, Refusal) and decision.retry_after is not None:
                due_s[n] = fleet.now_s + decision.retry_after.expected_s
        elif action == "release" and resident:
            resident += [d.request.request_id for d in fleet.release(resident.pop(n % len(resident)))]
        else:
            fleet.now_s += 0.5 * n
            fleet.controller.expire(fleet.snapshot())
            resident += [d.request.request_id for d in fleet.pump()]
        for view in fleet.views():
            assert view.load.reserved_kv_tokens <= view.kv_capacity_tokens


def test_a_promise_keeps_the_body_digest_not_the_body() -> None:
    fleet, _ = full_fleet()
    refused(fleet, freq(b"c" * 1000))
    (promise,) = fleet.controller._promises.due(float("inf"))
    assert promise.key == ("t", fingerprint(b"c" * 1000)) and promise.request.body is None


def test_a_wait_beyond_what_clients_wait_is_said_and_never_promised() -> None:
    config = AdmissionConfig(max_queue_wait_s=0.0, retry_after_cap_s=1.0)
    fleet, _ = full_fleet(config)
    first = refused(fleet, freq(b"c", max_output=600))
    assert first.retry_after is not None and first.retry_after.expected_s > 1.0
    assert first.retry_after.headers()["x-should-retry"] == "false"
    assert fleet.controller.queue_stats(fleet.now_s).promised_requests == 0, "no slot held for it"


def test_promises_are_counted_made_kept_and_lapsed() -> None:
    fleet, resident = full_fleet()
    first = refused(fleet, freq(b"c"))
    refused(fleet, freq(b"d"))
    counts = fleet.controller.promise_counts
    assert (counts.made, counts.kept, counts.broken, counts.lapsed) == (2, 0, 0, 0)
    assert first.retry_after is not None
    fleet.now_s = first.retry_after.expected_s
    fleet.release(resident[0].request_id)
    assert isinstance(fleet.admit(freq(b"c", retry=1)), Admit)
    assert (counts.kept, counts.broken) == (1, 0)
    fleet.now_s += 1000.0
    fleet.controller.expire(fleet.snapshot())
    assert counts.lapsed == 1, "d never came back"


def test_a_request_with_its_own_key_owns_its_promise_whatever_its_body() -> None:
    fleet, resident = full_fleet()
    keyed = dataclasses.replace(freq(b"c", retry=None), request_key="req-7f3a")
    first = refused(fleet, keyed)
    assert first.retry_after is not None
    assert fleet.controller.queue_stats(fleet.now_s).promised_requests == 1, "a key is enough"
    fleet.now_s = first.retry_after.expected_s
    fleet.release(resident[0].request_id)
    other = dataclasses.replace(freq(b"c", retry=1), request_key="req-other")
    assert not isinstance(fleet.admit(other), Admit), "same body, another request"
    back = dataclasses.replace(freq(b"c, resent with a new timestamp", retry=None), request_key="req-7f3a")
    assert isinstance(fleet.admit(back), Admit)
    assert fleet.controller.promise_counts.kept == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [("req-7f3a", "req-7f3a"), ("", None), ("has space", None), ("x" * 256, None), ("é", None)],
)
def test_only_a_usable_idempotency_key_names_a_request(value: str, expected: str | None) -> None:
    assert request_key({"idempotency-key": value}) == expected
    assert request_key({}) is None


def test_promises_hold_room_only_within_their_share_of_the_fleet() -> None:
    config = AdmissionConfig(max_queue_wait_s=0.0, promise_grace_s=1.0, promise_max_share=0.4)
    fleet, resident = full_fleet(config)
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None
    fleet.now_s = first.retry_after.expected_s - 0.5
    fleet.release(resident[0].request_id)
    assert isinstance(fleet.admit(freq(b"d")), Admit), "its 512 tokens are over 0.4 of 1024"


def test_a_promise_booked_by_another_gateway_is_honoured_here_and_dropped_there() -> None:
    """Gateway a refuses with a promise; its client comes back to gateway b (a Service picks any):
    early, b tells it the time left to its slot; on time, b gives it the head of its class before a
    newcomer, and a, hearing it was kept, drops it without counting it lapsed."""
    config = AdmissionConfig(
        max_queue_wait_s=0.0, promise_grace_s=1.0, retry_after_cap_s=10.0, promise_max_share=1.0
    )
    a, _ = full_fleet(config)
    b, b_resident = full_fleet(config)
    for gateway in (a, b):
        gateway.controller.promises.shared = True
    first = refused(a, freq(b"c", max_output=600))
    assert first.retry_after is not None
    booked, kept = a.controller.promises.take_news()
    assert [p.key for p in booked] == [("t", fingerprint(b"c"))] and kept == []
    assert a.controller.promises.take_news() == ([], [])
    b.controller.promises.learn(booked[0].key, booked[0].due_s)
    assert b.controller.queue_stats(b.now_s).promised_requests == 0, "b sets no room aside for it"

    due_s = first.retry_after.expected_s
    b.now_s = 1.0
    early = refused(b, freq(b"c", max_output=600, retry=1))
    assert early.retry_after is not None
    assert abs(early.retry_after.expected_s - (due_s - 1.0)) < 1e-9

    b.now_s = due_s
    b.release(b_resident[0].request_id)
    b.release(b_resident[1].request_id)
    assert isinstance(b.admit(freq(b"c", max_output=600, retry=2)), Admit)
    assert b.controller.promise_counts.kept == 1
    _, kept = b.controller.promises.take_news()
    assert kept == [booked[0].key]
    a.controller.promises.remove(booked[0])
    assert a.controller.queue_stats(due_s).promised_requests == 0
    assert a.controller.promise_counts.lapsed == 0


def test_a_promise_claimed_before_the_others_heard_of_it_is_not_told() -> None:
    fleet, resident = full_fleet()
    fleet.controller.promises.shared = True
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None
    fleet.now_s = first.retry_after.expected_s
    fleet.release(resident[0].request_id)
    assert isinstance(fleet.admit(freq(b"c", retry=1)), Admit)
    assert fleet.controller.promises.take_news() == ([], [])


def test_a_learnt_promise_lapses_after_its_window() -> None:
    book = PromiseBook(grace_s=1.0)
    book.learn(("t", b"key:k"), 5.0)
    book.learn(("t", b"key:k"), 8.0)
    book.expire(6.5)
    assert book.returning(freq(b"x", retry=1)) is None
    key_request = dataclasses.replace(freq(b"x", retry=1), request_key="k")
    claimed = book.returning(key_request)
    assert claimed is not None and claimed.due_s == 8.0
    book.expire(9.5)
    assert book.returning(key_request) is None
    assert book.counts.lapsed == 0, "another gateway's promise lapses there, not here"


def test_a_promise_holds_its_room_until_the_moment_it_lapses() -> None:
    fleet, resident = full_fleet()
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None
    due_s = first.retry_after.expected_s
    fleet.release(resident[0].request_id)
    fleet.now_s = due_s + NO_QUEUE.promise_grace_s
    assert isinstance(fleet.admit(freq(b"d")), Refusal), "the freed room is held for c"
    fleet.now_s = due_s + NO_QUEUE.promise_grace_s + 1e-6
    assert isinstance(fleet.admit(freq(b"e")), Admit), "released as soon as its window closed"
    assert fleet.controller.promise_counts.lapsed == 1


def test_past_the_promises_share_the_slot_moves_to_when_the_share_holds_it() -> None:
    config = AdmissionConfig(max_queue_wait_s=0.0, promise_grace_s=1.0, promise_max_share=0.75)
    fleet, _ = full_fleet(config)
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None and first.retry_after.honest
    second = refused(fleet, freq(b"d"))
    assert second.retry_after is not None and second.retry_after.honest
    assert second.retry_after.expected_s > first.retry_after.expected_s + 2 * config.promise_grace_s, (
        "1024 > 0.75 of 1024: d's window opens after c's closed"
    )
    assert fleet.controller.promise_counts.made == 2


def test_a_slot_the_share_cannot_hold_within_the_cap_is_no_promise_and_says_so() -> None:
    config = AdmissionConfig(
        max_queue_wait_s=0.0, promise_grace_s=1.0, promise_max_share=0.75, retry_after_cap_s=6.0
    )
    fleet, _ = full_fleet(config)
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None and first.retry_after.honest
    assert first.retry_after.expected_s + 2 * config.promise_grace_s > 6.0
    second = refused(fleet, freq(b"d"))
    assert second.retry_after is not None and not second.retry_after.honest
    assert second.retry_after.headers()["x-should-retry"] == "false"
    assert fleet.controller.promise_counts.made == 1


def test_a_request_that_cannot_be_recognised_coming_back_is_told_not_to_retry() -> None:
    fleet, _ = full_fleet()
    anonymous = refused(fleet, freq(b"c", retry=None))
    assert anonymous.retry_after is not None and not anonymous.retry_after.honest
    assert refused(fleet, freq(b"c")).retry_after.honest  # type: ignore[union-attr]


def test_a_full_queue_promises_nothing_and_says_so() -> None:
    config = AdmissionConfig(max_queue_wait_s=0.0, queue_max_requests=1, promise_max_share=1.0)
    fleet, _ = full_fleet(config)
    refused(fleet, freq(b"c"))
    full = refused(fleet, freq(b"d"))
    assert full.reason is RefusalReason.QUEUE_FULL
    assert full.retry_after is not None and not full.retry_after.honest


def test_the_forecast_error_is_when_the_room_was_there_less_the_time_promised() -> None:
    fleet, resident = full_fleet()
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None
    due_s = first.retry_after.expected_s
    fleet.release(resident[0].request_id)
    fleet.now_s = due_s - 0.5
    refused(fleet, freq(b"d"))  # a newcomer's decision finds the promise's room held
    fleet.now_s = due_s
    assert isinstance(fleet.admit(freq(b"c", retry=1)), Admit)
    errors = fleet.controller.promise_counts.errors
    assert errors.count == 1 and errors.sum_s == pytest.approx(-0.5)


def test_a_claimant_queued_is_kept_only_when_it_leaves_the_queue_for_a_replica() -> None:
    config = AdmissionConfig(max_queue_wait_s=10.0, promise_grace_s=1.0, promise_max_share=1.0)
    fleet, resident = full_fleet(config)
    hurried = AdmissionRequest("c1", Tenant("t"), CostEstimate(MODEL, 100, 400, 131072), 0.1, b"c", 0)
    first = refused(fleet, hurried)
    assert first.retry_after is not None
    fleet.now_s = first.retry_after.expected_s
    claimant = fleet.admit(freq(b"c", retry=1))
    counts = fleet.controller.promise_counts
    assert isinstance(claimant, Queue) and (counts.kept, counts.broken) == (0, 0)
    fleet.now_s += 0.25
    assert [d.ticket for d in fleet.release(resident[0].request_id)] == [claimant.ticket]
    assert (counts.kept, counts.broken) == (1, 0)
    assert counts.errors.sum_s == pytest.approx(0.25)


def test_a_claimant_whose_place_in_the_queue_runs_out_is_a_promise_broken() -> None:
    config = AdmissionConfig(max_queue_wait_s=10.0, promise_grace_s=1.0, promise_max_share=1.0)
    fleet, _ = full_fleet(config)
    hurried = AdmissionRequest("c1", Tenant("t"), CostEstimate(MODEL, 100, 400, 131072), 0.1, b"c", 0)
    first = refused(fleet, hurried)
    assert first.retry_after is not None
    fleet.now_s = first.retry_after.expected_s
    assert isinstance(fleet.admit(freq(b"c", retry=1)), Queue)
    fleet.now_s += 11.0
    expired = fleet.controller.expire(fleet.snapshot())
    assert len(expired) == 1
    counts = fleet.controller.promise_counts
    assert (counts.kept, counts.broken) == (0, 1)
