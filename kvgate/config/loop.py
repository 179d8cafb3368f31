"""What ``kvgate autoscale``, the recommendation loop, reads of a kvgate config file.

The loop takes the file ``kvgate serve`` takes, through the same loader (YAML, then ``KVGATE_*``
overrides with ``__`` nesting, then the old keys moved), so the policy it runs is the one the
gateways publish as ``kvgate_autoscaler_desired_replicas`` and its admin token is the gateways'
own key. It reads two things: the ``autoscaler`` section and ``auth.admin_token`` (the sim
actuator's bearer on ``/admin/*``). The rest of a gateway config is the gateway's and is left
unchecked here (``kvgate config check`` checks it), so a file holding only an ``autoscaler:``
section is a whole config for the loop; a key the gateway does not know is still an error.

Two older forms are read for one release, each with a warning: a file that is the autoscaler
section itself (``interval_s``, ``policy``, ``pools`` at the top, as ``--config`` took it before),
and the variable ``KVGATE_ADMIN_TOKEN``, read as ``KVGATE_AUTH__ADMIN_TOKEN``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from kvgate.config.auth import AdminAccess
from kvgate.config.autoscaler import AutoscalerConfig
from kvgate.config.base import Frozen
from kvgate.config.loader import (
    NOT_SHOWN,
    ConfigError,
    ConfigProblem,
    Warn,
    parse_as,
    read_document,
    source_of,
)
from kvgate.config.renames import variable

OLD_TOKEN_VARIABLE = "KVGATE_ADMIN_TOKEN"
TOKEN_VARIABLE = variable("auth.admin_token")
_POLICY_KEYS = frozenset({"interval_s", "signals_window_s", "policy"})
"""Top-level keys of a file that is the autoscaler section itself: none is a gateway config's."""


class LoopConfig(Frozen):
    autoscaler: AutoscalerConfig = Field(
        default_factory=AutoscalerConfig,
        description="The policy of every pool (see kvgate/config/autoscaler.py). Default: its defaults.",
    )
    auth: AdminAccess = Field(
        default_factory=AdminAccess,
        description="The admin token the sim actuator sends to the gateways' /admin/*. Default none.",
    )


def load_loop_config(path: str | Path | None, environ: Mapping[str, str], warn: Warn) -> LoopConfig:
    """The loop's part of the config in ``path`` (none: an empty one) under ``environ``."""
    document = read_document(path)
    if _is_bare_policy(document):
        warn(
            f"{path}: a file that is the autoscaler section itself is read for one more release: "
            "nest it under 'autoscaler:', as in the gateway's config (the same file then serves both)"
        )
        document = {"autoscaler": document}
    return parse_as(LoopConfig, document, _old_token_variable(environ, warn), source_of(path), warn)


def _is_bare_policy(document: Mapping[str, Any]) -> bool:
    """A gateway config's ``pools`` is a list; the autoscaler section's is a mapping by pool name."""
    if "autoscaler" in document:
        return False
    return bool(_POLICY_KEYS & set(document)) or isinstance(document.get("pools"), Mapping)


def _old_token_variable(environ: Mapping[str, str], warn: Warn) -> Mapping[str, str]:
    """``environ`` with ``KVGATE_ADMIN_TOKEN``, when set, as ``KVGATE_AUTH__ADMIN_TOKEN``."""
    old = environ.get(OLD_TOKEN_VARIABLE)
    if not old:
        return environ
    warn(
        f"{OLD_TOKEN_VARIABLE} is read for one more release: set {TOKEN_VARIABLE} instead, "
        "the variable kvgate serve reads too"
    )
    new = environ.get(TOKEN_VARIABLE)
    if new is not None and new != old:
        message = (
            f"{OLD_TOKEN_VARIABLE} and {TOKEN_VARIABLE} are both set, with different values: "
            f"set {TOKEN_VARIABLE} alone"
        )
        raise ConfigError("<environment>", [ConfigProblem("", NOT_SHOWN, message, None)])
    return {**environ, TOKEN_VARIABLE: old}
