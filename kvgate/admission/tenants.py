"""Who is asking, how much they count, and how many tokens and requests they may spend.

An API key (``auth.tenants``) maps to a tenant with a weight (its share of contended capacity, in
tokens), a priority class and an optional budget in tokens per minute (``admission.tenants``).
Budgets are token buckets refilled continuously from injected time; a bucket holds at most one
minute of budget, and a request larger than the whole bucket passes only when the bucket is full
(the tenant then owes the difference), so no request is refused forever by its own size. Unknown
keys fall to the anonymous tenant when auth is off and to ``None`` (the edge answers 401) when it
is on.

Besides tokens, a tenant may be held to requests per minute (a bucket of requests, on every
served route whatever it costs) and to requests at once (queued or served), checked when a
request is priced (``open_request``) and given back when it ends (``close_request``, exactly once
per request that was let in).

Behind one Service, N gateways each keep a bucket of 1/N of every budget (``share``), as a
distributed rate limiter's local buckets do: the Service spreads a tenant's requests over the
gateways, so together they hold it to its budget, not to N times it, without a round trip per request.
The same share holds requests per minute, and requests at once (rounded up, at least one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from kvgate.config.admission import AdmissionConfig
from kvgate.config.auth import AuthConfig
from kvgate.config.tenants import PriorityClass, TenantConfig


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    weight: float = 1.0
    priority: PriorityClass = PriorityClass.STANDARD
    tokens_per_min: int | None = None
    ttft_slo_s: float | None = None
    """The tenant's own time-to-first-token objective, in place of the model's
    (``kvgate.admission.deadline``)."""
    requests_per_min: int | None = None
    max_concurrent_requests: int | None = None

    @classmethod
    def from_config(cls, config: TenantConfig) -> Tenant:
        return cls(
            config.name,
            config.weight,
            config.priority,
            config.tokens_per_min,
            config.ttft_slo_s,
            config.requests_per_min,
            config.max_concurrent_requests,
        )

    @property
    def limits_requests(self) -> bool:
        return self.requests_per_min is not None or self.max_concurrent_requests is not None


@dataclass(frozen=True, slots=True)
class RequestLimit:
    """Why a tenant's request was not let in: its requests at once (``concurrent``) or per minute,
    and the seconds until one more would be."""

    concurrent: bool
    wait_s: float


class TokenBucket:
    def __init__(self, tokens_per_min: int, now_s: float) -> None:
        if tokens_per_min <= 0:
            raise ValueError(f"tokens_per_min must be > 0, got {tokens_per_min}")
        self.tokens_per_min = tokens_per_min
        self.capacity_tokens = float(tokens_per_min)
        self.rate_tokens_per_s = tokens_per_min / 60.0
        self.level_tokens = self.capacity_tokens
        self._at_s = now_s

    def rescale(self, fraction: float, now_s: float) -> None:
        """Hold ``fraction`` of the budget from now on (what was gained so far at the old rate stays,
        up to the new capacity)."""
        self._refill(now_s)
        self.capacity_tokens = self.tokens_per_min * fraction
        self.rate_tokens_per_s = self.capacity_tokens / 60.0
        self.level_tokens = min(self.level_tokens, self.capacity_tokens)

    def _refill(self, now_s: float) -> None:
        if now_s > self._at_s:
            gained = (now_s - self._at_s) * self.rate_tokens_per_s
            self.level_tokens = min(self.capacity_tokens, self.level_tokens + gained)
            self._at_s = now_s

    def wait_s(self, tokens: int, now_s: float) -> float:
        """Seconds until ``tokens`` may be taken; 0.0 when they may be taken now."""
        self._refill(now_s)
        needed = min(float(tokens), self.capacity_tokens)
        return max(0.0, (needed - self.level_tokens) / self.rate_tokens_per_s)

    def take(self, tokens: int, now_s: float) -> float:
        """Take ``tokens`` if allowed now and return 0.0; otherwise change nothing and return the wait."""
        wait = self.wait_s(tokens, now_s)
        if wait == 0.0:
            self.level_tokens -= tokens
        return wait

    def refund(self, tokens: int) -> None:
        self.level_tokens = min(self.capacity_tokens, self.level_tokens + tokens)


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` value (scheme in any case); None for any other
    form, a bare key included, which OpenAI refuses too."""
    if authorization is None or authorization[:7].lower() != "bearer ":
        return None
    return authorization[7:].strip() or None


class TenantDirectory:
    """Keys to tenants: which keys are a tenant is ``auth``'s, what it may spend ``admission``'s
    (a tenant ``admission`` does not list gets the defaults)."""

    def __init__(self, admission: AdmissionConfig, auth: AuthConfig) -> None:
        self.auth_enabled = auth.enabled
        self.anonymous = Tenant.from_config(admission.anonymous_tenant)
        policies = {tenant.name: tenant for tenant in admission.tenants}
        self._by_key: dict[str, Tenant] = {}
        for keys in auth.tenants:
            tenant = Tenant.from_config(policies.get(keys.name, TenantConfig(name=keys.name)))
            for key in keys.api_keys:
                self._by_key[key.get_secret_value()] = tenant
        self._buckets: dict[str, TokenBucket] = {}
        self._request_buckets: dict[str, TokenBucket] = {}
        self.in_flight: dict[str, int] = {}
        """Requests of each request-limited tenant let in and not yet closed."""
        self._fraction = 1.0
        """This gateway's share of every budget: 1/N of N gateways (``share``)."""

    def share(self, gateways: int, now_s: float) -> None:
        """This gateway is one of ``gateways`` behind one Service: hold 1/``gateways`` of each budget."""
        fraction = 1.0 / max(1, gateways)
        if fraction == self._fraction:
            return
        self._fraction = fraction
        for bucket in (*self._buckets.values(), *self._request_buckets.values()):
            bucket.rescale(fraction, now_s)

    def identify(self, api_key: str | None) -> Tenant | None:
        """The key's tenant; the anonymous tenant when auth is off; None (401) when it is on."""
        tenant = self._by_key.get(api_key) if api_key else None
        if tenant is not None:
            return tenant
        return None if self.auth_enabled else self.anonymous

    def take(self, tenant: Tenant, tokens: int, now_s: float) -> float:
        """Charge ``tokens`` to the tenant's budget: 0.0 when taken, else seconds until it can be."""
        bucket = self._bucket(tenant, now_s)
        return 0.0 if bucket is None else bucket.take(tokens, now_s)

    def refund(self, tenant: Tenant, tokens: int) -> None:
        """Give back tokens charged for work that did not happen (left the queue, stopped early)."""
        bucket = self._buckets.get(tenant.name)
        if bucket is not None and tokens > 0:
            bucket.refund(tokens)

    def open_request(self, tenant: Tenant, now_s: float) -> RequestLimit | None:
        """Let one request of ``tenant`` in (None), or say which limit holds it back and for how
        long; a tenant without request limits costs one attribute read."""
        if not tenant.limits_requests:
            return None
        name = tenant.name
        at_once = self.in_flight.get(name, 0)
        concurrent = tenant.max_concurrent_requests
        if concurrent is not None and at_once >= max(1, math.ceil(concurrent * self._fraction)):
            return RequestLimit(True, 1.0)
        if tenant.requests_per_min is not None:
            bucket = self._request_buckets.get(name)
            if bucket is None:
                bucket = self._request_buckets[name] = TokenBucket(tenant.requests_per_min, now_s)
                if self._fraction != 1.0:
                    bucket.rescale(self._fraction, now_s)
            wait_s = bucket.take(1, now_s)
            if wait_s > 0.0:
                return RequestLimit(False, wait_s)
        self.in_flight[name] = at_once + 1
        return None

    def close_request(self, tenant: Tenant) -> None:
        """A request ``open_request`` let in has ended."""
        if tenant.limits_requests:
            left = self.in_flight.get(tenant.name, 0) - 1
            if left > 0:
                self.in_flight[tenant.name] = left
            else:
                self.in_flight.pop(tenant.name, None)

    def tenants(self) -> Iterable[Tenant]:
        return {t.name: t for t in (self.anonymous, *self._by_key.values())}.values()

    def _bucket(self, tenant: Tenant, now_s: float) -> TokenBucket | None:
        if tenant.tokens_per_min is None:
            return None
        bucket = self._buckets.get(tenant.name)
        if bucket is None:
            bucket = self._buckets[tenant.name] = TokenBucket(tenant.tokens_per_min, now_s)
            if self._fraction != 1.0:
                bucket.rescale(self._fraction, now_s)
        return bucket
