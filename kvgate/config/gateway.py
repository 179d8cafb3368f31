"""The whole configuration: every section under one root, and the checks that span sections.

A config is read once at start-up (``kvgate.config.loader``) and handed out section by section;
nothing mutates it afterwards. Each section lives in its own module, which the root only gathers;
what is checked here is what no one section can see: unique model and pool names, pools naming
configured models, every disaggregated model served by both halves of a prefill/decode pair,
every tenant admission prices identified by some key of auth's, and every entry keyed by a model
(``admission.models``) or a pool (``autoscaler.pools``) naming one that is configured: a misspelt
key would otherwise leave its model or pool on the defaults without a word.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from kvgate.config.admission import AdmissionConfig
from kvgate.config.auth import AuthConfig
from kvgate.config.autoscaler import AutoscalerConfig
from kvgate.config.base import Frozen
from kvgate.config.coordination import Coordination
from kvgate.config.health import Health
from kvgate.config.models import Model
from kvgate.config.observability import AccessLog, Metrics, Tracing
from kvgate.config.pools import Pool
from kvgate.config.routing import RoutingConfig
from kvgate.config.server import Server


class GatewayConfig(Frozen):
    server: Server = Field(default_factory=Server, description="Listener, limits and upstream timeouts.")
    auth: AuthConfig = Field(
        default_factory=AuthConfig,
        description="Client keys, the admin and observability tokens, credential forwarding.",
    )
    health: Health = Field(default_factory=Health, description="Replica health probing.")
    coordination: Coordination | None = Field(
        default=None,
        description="Share reservations with other gateway replicas through Redis. Default none.",
    )
    models: tuple[Model, ...] = Field(description="Models the gateway serves (at least one).")
    pools: tuple[Pool, ...] = Field(description="Replica pools (at least one).")
    admission: AdmissionConfig = Field(
        default_factory=AdmissionConfig,
        description="Admit / queue / reject rules (see kvgate/config/admission.py).",
    )
    routing: RoutingConfig = Field(
        default_factory=lambda: RoutingConfig.model_validate({}),
        description="Replica choice (see kvgate/config/routing.py).",
    )
    autoscaler: AutoscalerConfig | None = Field(
        default=None,
        description=(
            "Desired-replica policy per pool (see kvgate/config/autoscaler.py); when given, the gateway "
            "publishes desired replicas on /metrics and /signals. Default none."
        ),
    )
    access_log: AccessLog = Field(
        default_factory=AccessLog,
        description="One line per completion request on stderr: format and sampling.",
    )
    metrics: Metrics = Field(
        default_factory=Metrics,
        description="What /metrics labels its per-request series with: the optional tenant label.",
    )
    tracing: Tracing = Field(
        default_factory=Tracing,
        description="OpenTelemetry tracing of the completion routes (the otel extra). Default off.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> GatewayConfig:
        problems = []
        if not self.models:
            problems.append("models: at least one model is required")
        if not self.pools:
            problems.append("pools: at least one pool is required")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            problems.append(f"models: duplicate model names in {names}")
        aliases = [alias for m in self.models for alias in m.aliases]
        public = [*names, *aliases]
        clashing = sorted({alias for alias in aliases if public.count(alias) > 1})
        if clashing:
            problems.append(f"models: aliases {clashing} name more than one model, or a model itself")
        pool_names = [p.name for p in self.pools]
        if len(set(pool_names)) != len(pool_names):
            problems.append(f"pools: duplicate pool names in {pool_names}")
        for pool in self.pools:
            unknown = [m for m in pool.models if m not in names]
            if unknown:
                problems.append(f"pools.{pool.name}.models: {unknown} are not configured models {names}")
        for name in names:
            problems.extend(_incomplete_pair(name, self.serving(name)))
        for model in self.admission.models:
            if model not in names:
                problems.append(
                    f"admission.models.{model}: not a configured model {names}, so these rules "
                    "would apply to no request"
                )
        if self.autoscaler is not None:
            for pool_name in self.autoscaler.pools:
                if pool_name not in pool_names:
                    problems.append(
                        f"autoscaler.pools.{pool_name}: not a configured pool {pool_names}, so this "
                        "policy would scale nothing"
                    )
        keyed = {tenant.name for tenant in self.auth.tenants}
        for tenant in self.admission.tenants:
            if tenant.name not in keyed:
                problems.append(
                    f"admission.tenants.{tenant.name}: no auth.tenants entry of that name gives it a key, "
                    "so no request is ever this tenant's"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def serving(self, model: str) -> dict[str, tuple[str, ...]]:
        """The pools serving ``model``, by role (``mixed``, ``prefill``, ``decode``), in config order."""
        roles: dict[str, list[str]] = {"mixed": [], "prefill": [], "decode": []}
        for pool in self.pools:
            if not pool.models or model in pool.models:
                roles[pool.role].append(pool.name)
        return {role: tuple(pools) for role, pools in roles.items()}

    def disaggregated(self, model: str) -> bool:
        """``model`` has a prefill+decode pair: its requests may go through prefill, then decode."""
        serving = self.serving(model)
        return bool(serving["prefill"]) and bool(serving["decode"])

    def model(self, name: str) -> Model | None:
        for model in self.models:
            if model.name == name:
                return model
        return None


def _incomplete_pair(model: str, serving: dict[str, tuple[str, ...]]) -> list[str]:
    """Why a model's pools cannot serve it whole: half a prefill/decode pair."""
    prefill, decode = serving["prefill"], serving["decode"]
    if prefill and not decode:
        return [
            f"models.{model}: prefill pool(s) {list(prefill)} serve it but no decode pool does; a "
            "prefill replica computes only the prompt's KV and hands it to a decode replica, so add "
            f"a pool with role decode serving '{model}' (or make {list(prefill)} mixed)"
        ]
    if decode and not prefill:
        return [
            f"models.{model}: decode pool(s) {list(decode)} serve it but no prefill pool does; a "
            "decode replica takes requests only by hand-off from a prefill replica, so add a pool "
            f"with role prefill serving '{model}' (or make {list(decode)} mixed)"
        ]
    return []
