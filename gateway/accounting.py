"""What a served request tells the gateway: tokens, latencies, and how far its estimates were off.

The relay (``gateway.relay``) reports three moments of a response: its first token
(``first_token``), the tokens a stream produced so far (``produced``: the ledger's remaining-decode
bound shrinks with them) and its end (``finished``, with the replica's usage and the stream's
inter-token gaps). From them the ledger learns which prefill is done, the replica its smoothed TTFT
(a cold replica is slower), the admission controller the measured inter-token latency and prefill
rate (its forecasts of queue waits and of a request's own prefill against a TTFT objective run on
them, not on constants) and how prompt counts and output lengths compare with its estimates, and the
metrics every latency once. ``closed`` records a whole response's TTFT that never reached the
metrics because sending it to the client failed.
"""

from __future__ import annotations

from collections.abc import Sequence

from admission.controller import AdmissionController
from admission.retry_after import ServiceRates
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics
from gateway.state import GatewayState, ProxyRequest, ReplicaState

_ITL_EWMA_WEIGHT = 0.05
_PREFILL_EWMA_WEIGHT = 0.1
PREFILL_SAMPLE_MIN_TOKENS = 256
"""A prompt shorter than this says more about round trips than about prefill speed: not sampled."""


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
        self._fleet = fleet
        self._metrics = metrics
        self._itl_s = controller.config.default_inter_token_s
        self._prefill_tokens_per_s = controller.config.default_prefill_tokens_per_s

    def first_token(self, request: ProxyRequest, replica: ReplicaState, now_s: float) -> None:
        """The first token reached the client. A stream's TTFT is recorded now, so the ``/signals``
        window does not lag by the whole generation; a whole response's goes with its other
        measurements in ``finished`` (one metrics call)."""
        self._ledger.first_token(request.request_id)
        request.first_token_s = now_s
        ttft_s = now_s - request.arrived_s
        if request.stream:
            self._metrics.observe_ttft(replica.pool, request.model, ttft_s)
        else:
            request.ttft_s = ttft_s
        self._fleet.observe_ttft(replica, ttft_s)
        self._observe_prefill(request, ttft_s)

    def _observe_prefill(self, request: ProxyRequest, ttft_s: float) -> None:
        """The prefill rate the admission forecasts use, learned from what the replicas deliver:
        the prompt's tokens over the time from leaving the queue to the first token. It includes
        the replica's own queueing, so it errs on the slow side, which is the side a queue-wait
        forecast may err on."""
        admission = request.admission
        if admission is None or admission.cost.prompt_tokens < PREFILL_SAMPLE_MIN_TOKENS:
            return
        served_s = ttft_s - (request.queue_wait_s or 0.0)
        if served_s <= 0.0:
            return
        sample = admission.cost.prompt_tokens / served_s
        self._prefill_tokens_per_s += _PREFILL_EWMA_WEIGHT * (sample - self._prefill_tokens_per_s)
        self._controller.observe_rates(ServiceRates(self._itl_s, self._prefill_tokens_per_s))

    def produced(self, request: ProxyRequest, tokens: int) -> None:
        self._ledger.produced(request.request_id, tokens)

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
            self._itl_s += _ITL_EWMA_WEIGHT * (itl_s - self._itl_s)
            controller.observe_rates(ServiceRates(self._itl_s, self._prefill_tokens_per_s))
        admission = request.admission
        prompt_tokens = request.prompt_tokens
        output_tokens = request.completion_tokens or 0
        estimated = None
        if prompt_tokens is not None and admission is not None:
            estimated = admission.cost.prompt_tokens
            controller.calibration.observe_prompt(request.model, estimated, prompt_tokens)
            controller.calibration.observe_output(request.model, output_tokens)
        ttft_s, request.ttft_s = request.ttft_s, None
        self._metrics.record_response(
            replica.pool,
            request.model,
            ttft_s,
            now_s - request.arrived_s,
            itl_gaps_s,
            prompt_tokens if admission is not None else None,
            output_tokens,
            estimated,
        )

    def closed(self, request: ProxyRequest, replica: ReplicaState) -> None:
        """The request is over: a whole response's TTFT not yet recorded (sending it failed) is."""
        if request.ttft_s is not None:
            self._metrics.observe_ttft(replica.pool, request.model, request.ttft_s)
