"""What a served request tells the gateway: tokens, latencies, and how far its estimates were off.

The relay (``kvgate.gateway.request_path.relay``) reports three moments of a response: its first token
(``first_token``), the tokens a stream produced so far (``produced``: the ledger's remaining-decode
bound shrinks with them) and its end (``finished``, with the replica's usage and the stream's
inter-token gaps). From them the ledger learns which prefill is done, the replica its smoothed TTFT
(a cold replica is slower), the admission controller the measured inter-token latency and prefill
rate (learned in ``kvgate.admission.rates``: its forecasts of queue waits and of a request's own prefill
against a TTFT objective run on them, not on constants), how prompt counts and output lengths
compare with its estimates and, with an ITL objective, each replica's latency against the
sequences it ran (``kvgate.admission.itl_guard``: the sequences resident there are sampled at a stream's
first token, at each produced report and at its end), and the metrics every latency once.
A whole (non-streamed) response from a replica arrives when its generation has ended, so the relay
reports it with ``answered_whole``, not ``first_token``: it releases the ledger's prefill and dates
the answer for the access log, but teaches nothing about time to first token (neither the TTFT
metrics, the replica's TTFT average nor the prefill rate would learn a whole generation as a
prefill). ``closed`` records a whole response's TTFT that never reached the metrics because sending it to
the client failed. A disaggregated request's time to first token and prompt tokens are its prefill
pool's (the phase that decides them), its inter-token latency and output tokens its decode pool's.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.admission.controller import AdmissionController
from kvgate.admission.rates import with_first_token, with_stream_itl
from kvgate.gateway.replicas.fleet import Fleet
from kvgate.gateway.state import GatewayState, ProxyRequest, ReplicaState
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.gateway.telemetry.objectives import Objectives


class Accounting:
    def __init__(
        self,
        state: GatewayState,
        controller: AdmissionController,
        fleet: Fleet,
        metrics: GatewayMetrics,
    ) -> None:
        self._ledger = state.ledger
        self._controller = controller
        self._itl_guard = controller.itl_guard
        self._fleet = fleet
        self._metrics = metrics
        self.objectives: Objectives = {}
        """Each model's latency objectives, counted against when a gateway binds them
        (``kvgate.gateway.telemetry.objectives``)."""

    def first_token(self, request: ProxyRequest, replica: ReplicaState, now_s: float) -> None:
        """The first token reached the client. A stream's TTFT is recorded now, so the ``/signals``
        window does not lag by the whole generation; a whole response's goes with its other
        measurements in ``finished`` (one metrics call)."""
        self._ledger.first_token(request.request_id)
        request.first_token_s = now_s
        ttft_s = now_s - request.arrived_s
        if request.stream:
            pool = replica.pool if request.prefill_replica is None else request.prefill_replica.pool
            self._metrics.observe_ttft(pool, request.model, ttft_s)
        else:
            request.ttft_s = ttft_s
        if request.prefill_replica is None:
            self._fleet.observe_ttft(replica, ttft_s)
        if self._itl_guard is not None and request.stream:
            self._sample_resident(request, replica.replica_id)
        admission = request.admission
        if admission is not None:
            objectives = self.objectives.get(request.model)
            if objectives is not None:
                slo_s = admission.tenant.ttft_slo_s or objectives[0]
                if slo_s is not None:
                    pool = replica.pool if request.prefill_replica is None else request.prefill_replica.pool
                    self._metrics.count_objective(pool, request.model, 0, ttft_s <= slo_s)
            controller = self._controller
            served_s = ttft_s - (request.queue_wait_s or 0.0)
            prompt_tokens = admission.cost.prompt_tokens
            controller.observe_rates(with_first_token(controller.rates, prompt_tokens, served_s))

    def answered_whole(self, request: ProxyRequest, now_s: float) -> None:
        """A whole response arrived: its prefill is over, but its arrival is no first token."""
        self._ledger.first_token(request.request_id)
        request.first_token_s = now_s

    def produced(self, request: ProxyRequest, tokens: int) -> None:
        self._ledger.produced(request.request_id, tokens)
        replica = request.replica
        if self._itl_guard is not None and replica is not None:
            self._sample_resident(request, replica.replica_id)

    def _sample_resident(self, request: ProxyRequest, replica_id: str) -> None:
        """Count the sequences resident on the request's replica now: the stream's mean over these
        samples is the load its mean inter-token gap was measured under."""
        load = self._ledger.loads.get(replica_id)
        if load is not None:
            request.resident_sequences_sum += load.resident_sequences
            request.resident_sequences_samples += 1

    def finished(
        self,
        request: ProxyRequest,
        replica: ReplicaState,
        itl_s: float | None,
        now_s: float,
        itl_gaps_s: Sequence[float] = (),
    ) -> None:
        """Record what a completed response said about tokens and latency: ``itl_s`` is the stream's
        mean inter-token gap (it feeds the admission rates), ``itl_gaps_s`` every gap."""
        controller = self._controller
        if itl_s is not None:
            controller.observe_rates(with_stream_itl(controller.rates, itl_s))
            objectives = self.objectives.get(request.model)
            if objectives is not None and objectives[1] is not None:
                self._metrics.count_objective(replica.pool, request.model, 1, itl_s <= objectives[1])
            guard = self._itl_guard
            if guard is not None:
                self._sample_resident(request, replica.replica_id)
                samples = request.resident_sequences_samples
                if samples:
                    sequences = request.resident_sequences_sum / samples
                    guard.observe(replica.replica_id, replica.models, sequences, itl_s)
        admission = request.admission
        prompt_tokens = request.prompt_tokens
        output_tokens = request.completion_tokens or 0
        estimated = None
        if prompt_tokens is not None and admission is not None:
            estimated = admission.cost.prompt_tokens
            controller.calibration.observe_prompt(request.model, estimated, prompt_tokens)
            controller.calibration.observe_output(request.model, output_tokens)
        ttft_s, request.ttft_s = request.ttft_s, None
        counted = prompt_tokens if admission is not None else None
        prefill = request.prefill_replica
        if prefill is not None:
            if ttft_s is not None:
                self._metrics.observe_ttft(prefill.pool, request.model, ttft_s)
                ttft_s = None
            if counted is not None:
                self._metrics.record_prefill(prefill.pool, request.model, counted, estimated)
                counted, estimated = 0, None
        self._metrics.record_response(
            replica.pool,
            request.model,
            ttft_s,
            now_s - request.arrived_s,
            itl_gaps_s,
            counted,
            output_tokens,
            estimated,
        )

    def closed(self, request: ProxyRequest, replica: ReplicaState) -> None:
        """The request is over: a whole response's TTFT not yet recorded (sending it failed) is."""
        if request.ttft_s is not None:
            self._metrics.observe_ttft(replica.pool, request.model, request.ttft_s)
