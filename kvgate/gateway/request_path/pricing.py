"""Price a request once: who sends it, what it asks for, and what it costs in tokens and KV.

``Pricer.price`` is the request path's first step after parsing. It identifies the tenant from the
bearer key, reads the work asked for (``max_tokens`` and the sequences, ``kvgate.admission.cost``), counts
the prompt's tokens (``kvgate.gateway.request_path.prompt``: inline, off the event loop, or by a replica of
the model), and estimates the cost, all from the one parsed body. What admission and routing read is set on
the request as two values computed here and nowhere else: ``request.admission`` (tenant, cost, the client's
deadline, its retry count) and ``request.routing`` (model, tokens, prefix block hashes). A request that cannot
be priced gets a ``Refusal``: 401 for an unknown key, 400 for invalid fields or a request over the context,
503 when a replica could not count its prompt. ``Pricer.price_now`` prices as a plain call, with no coroutine,
when the prompt is counted on the event loop (a local tokeniser and a small body: the common case); otherwise
it answers ``Uncounted`` and the proxy awaits ``Pricer.count``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from kvgate.admission import refusals
from kvgate.admission.cost import InvalidRequest, Requested, capped_body, estimate_cost, requested_work
from kvgate.admission.counting import batch_of
from kvgate.admission.deadline import client_timeout_s
from kvgate.admission.decision import AdmissionRequest, Refusal, RefusalReason
from kvgate.admission.promises import request_key, retry_count
from kvgate.admission.route_work import Work, work_view
from kvgate.admission.tenants import Tenant, TenantDirectory, bearer_key
from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.replicas.upstream import replica_headers
from kvgate.gateway.request_path.forwarding import forwarded_body
from kvgate.gateway.request_path.prompt import PromptEncoder, PromptTokens
from kvgate.gateway.request_path.surface import PROXIED
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.routing.request import RoutingRequest

log = logging.getLogger("kvgate.pricing")
_IDEMPOTENCY_KEY = b"idempotency-key"
_NO_PROMPT = PromptTokens(0, ())


@dataclass(slots=True)
class Uncounted:
    """A request priced but for its prompt's tokens, which are counted off the event loop or by a
    replica of its model (``Pricer.count``)."""

    tenant: Tenant
    work_kind: Work
    body: Mapping[str, Any]
    """The body as pricing reads it (``kvgate.admission.route_work.work_view``)."""
    chat: bool
    batch: list[str] | list[list[int]] | None
    work: Requested


class Pricer:
    def __init__(self, state: GatewayState, config: GatewayConfig, tenants: TenantDirectory) -> None:
        self._state = state
        self._config = config.admission
        self._tenants = tenants
        self._block_size_tokens = config.routing.block_size_tokens
        self.encoder = PromptEncoder(config.models, self._block_size_tokens)
        self.session: aiohttp.ClientSession | None = None
        """For counting by a replica's ``/tokenize``; set when the gateway starts."""

    async def price(self, request: ProxyRequest) -> Refusal | None:
        priced = self.price_now(request)
        if isinstance(priced, Uncounted):
            return await self.count(request, priced)
        return priced

    def price_now(self, request: ProxyRequest) -> Refusal | Uncounted | None:
        """``price``, as a plain call when the prompt is counted here on the event loop (no coroutine
        per request); ``Uncounted`` when it must be counted off the loop or by a replica
        (``await count(request, uncounted)``)."""
        tenant = self._tenants.identify(_bearer_key(request.headers))
        if tenant is None:
            return Refusal(401, RefusalReason.UNAUTHORIZED, "Incorrect API key provided.")
        request.tenant = tenant.name
        kind = PROXIED[request.endpoint]
        body: Mapping[str, Any] = request.body
        if kind is Work.CHAT:
            chat = True
        elif kind is Work.COMPLETION:
            chat = False
        else:
            view = work_view(kind, body)
            if isinstance(view, InvalidRequest):
                return _invalid(view)
            body, chat = view.body, view.chat
        batch: list[str] | list[list[int]] | None = None if chat else batch_of(body)
        work = requested_work(body, chat, len(batch) if batch else 1, self._config)
        if isinstance(work, InvalidRequest):
            return _invalid(work)
        if not kind.decodes:
            work = Requested(0, 1)
            if not kind.counts_prompt:
                return self._priced(request, tenant, kind, chat, work, _NO_PROMPT, 0)
        if batch is not None:
            return Uncounted(tenant, kind, body, chat, batch, work)
        prompt = self.encoder.encode_inline(request.model, body, len(request.raw_body))
        if prompt is None:
            return Uncounted(tenant, kind, body, chat, batch, work)
        return self._priced(request, tenant, kind, chat, work, prompt, prompt.count)

    async def count(self, request: ProxyRequest, uncounted: Uncounted) -> Refusal | None:
        """Price a request whose prompt ``price_now`` could not count on the event loop."""
        batch = uncounted.batch
        try:
            if batch is None:
                prompt = await self._encode(request, uncounted.body, len(request.raw_body))
                prompt_tokens: int | list[int] = prompt.count
            else:
                each = [
                    PromptTokens.of(p, self._block_size_tokens)
                    if isinstance(p, list)
                    else await self._encode(request, {"prompt": p}, len(p))
                    for p in batch
                ]
                prompt, prompt_tokens = each[0], [p.count for p in each]
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            log.warning("counting a prompt with a replica of %s failed: %r", request.model, exc)
            message = f"Cannot count the prompt's tokens with a replica of '{request.model}'."
            return refusals.no_replica(message, self._config.no_replica_retry_after_s, self._config)
        tenant, kind, chat, work = uncounted.tenant, uncounted.work_kind, uncounted.chat, uncounted.work
        return self._priced(request, tenant, kind, chat, work, prompt, prompt_tokens)

    def _priced(
        self,
        request: ProxyRequest,
        tenant: Tenant,
        kind: Work,
        chat: bool,
        work: Requested,
        prompt: PromptTokens,
        prompt_tokens: int | list[int],
    ) -> Refusal | None:
        """The request's cost from its counted prompt, and the two values set on it."""
        cost = estimate_cost(
            request.model,
            prompt_tokens,
            work.max_tokens,
            self._config,
            self._state.models[request.model],
            work.sequences_per_prompt,
        )
        if isinstance(cost, InvalidRequest):
            return _invalid(cost)
        forwarded = _capped(request.body, kind, cost.max_tokens)
        if forwarded is not None:
            request.body = forwarded
        if forwarded is not None or request.usage_injected:
            request.raw_body = forwarded_body(request.body)
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in request.headers
            if name.startswith(b"x-") or name == _IDEMPOTENCY_KEY
        }
        blocks = prompt.block_hashes
        request.admission = AdmissionRequest(
            request.request_id,
            tenant,
            cost,
            client_timeout_s(headers, self._config),
            request.raw_body,
            retry_count(headers),
            request_key(headers),
            blocks,
        )
        request.routing = RoutingRequest(
            request.model,
            cost.prompt_tokens,
            cost.max_output_tokens,
            blocks,
            cost.sequences,
            cost.kv_bytes_per_token,
        )
        return None

    async def _encode(self, request: ProxyRequest, body: Mapping[str, Any], size_bytes: int) -> PromptTokens:
        """``body``'s prompt (the request's, or one prompt of its batch) counted: inline when counted
        here and small, otherwise off the event loop or by a replica of the model."""
        prompt = self.encoder.encode_inline(request.model, body, size_bytes)
        if prompt is not None:
            return prompt
        assert self.session is not None, "gateway not started"
        url = ""
        headers = None
        if not self.encoder.is_local(request.model):
            serving = self._state.healthy_replicas(request.model)
            url = serving[0].url if serving else ""
            headers = replica_headers(serving[0]) if serving else None
        return await self.encoder.encode(request.model, body, size_bytes, self.session, url, headers)


def _capped(body: dict[str, Any], kind: Work, max_tokens: int) -> dict[str, Any] | None:
    """The body to forward so the replica's cap is the one priced (None: the client's as it is). A
    response's cap is ``max_output_tokens``; a route that decodes nothing has none."""
    if kind is Work.CHAT or kind is Work.COMPLETION:
        return capped_body(body, kind is Work.CHAT, max_tokens)
    if kind is Work.RESPONSES and body.get("max_output_tokens") != max_tokens:
        return {**body, "max_output_tokens": max_tokens}
    return None


def _bearer_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            return bearer_key(value.decode("latin-1"))
    return None


def _invalid(invalid: InvalidRequest) -> Refusal:
    return Refusal(400, RefusalReason.INVALID_REQUEST, invalid.message, param=invalid.param)
