"""How the weigher reaches gmd: its ``[gmd]`` options in nova.conf and a fetch of gmd's
``GET /v1/hosts/utilization`` over a keystoneauth adapter, configured as Nova configures its
own clients (``[placement]``): the catalog's ``fairness`` endpoint with a service user's
token, or ``endpoint_override`` alone for a gmd whose read API needs no token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

from gmd import GmdError
from gmd.fairness.placement import Strategy

GROUP = "gmd"
ROUTE = "/v1/hosts/utilization"
SERVICE_TYPE = "fairness"
"""gmd's service type in the Keystone catalog"""
AGGREGATE_KEY = "gmd_weight_multiplier"
"""The host aggregate metadata key that overrides ``[gmd] weight_multiplier``."""

OPTS = [
    cfg.FloatOpt(
        "weight_multiplier",
        default=1.0,
        help="How much gmd's ranking weighs beside Nova's other weighers (0: not at all). A"
        f" host aggregate's {AGGREGATE_KEY!r} metadata overrides it for its hosts (the"
        " smallest, for a host in several).",
    ),
    cfg.StrOpt(
        "strategy",
        default=Strategy.falb3.value,
        choices=[s.value for s in Strategy],
        help="Which criteria rank the hosts: falb-3 (mean utilisation, utilisation gap and"
        " the cluster's deviation, by TOPSIS), falb-2 (the first two), mean-utilization"
        " (alone), or balanced (Kubernetes' 1 - std of a host's resource fractions).",
    ),
    cfg.IntOpt(
        "intervals",
        default=3,
        min=1,
        max=60,
        help="How many of gmd's latest accounted intervals a host's measured use is summed over.",
    ),
    cfg.FloatOpt(
        "answer_timeout",
        default=1.0,
        min=0.01,
        help="Seconds a request waits for gmd at most (in all: connecting, a slow answer);"
        " past it the request is weighed neutrally and the answer, when it comes, serves the"
        " next ones.",
    ),
    cfg.FloatOpt(
        "cache_time",
        default=30.0,
        min=0,
        help="Seconds gmd's answer is used for (it changes once an accounting interval).",
    ),
    cfg.FloatOpt(
        "retry_time",
        default=10.0,
        min=0,
        help="Seconds after a failed fetch before gmd is asked again (requests in between"
        " are weighed neutrally at once).",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    """``[gmd]``: the options above, and keystoneauth's session, auth and adapter options (as
    Nova's own ``[placement]``): ``auth_type``/``auth_url``/… for a Keystone-guarded gmd, or
    ``endpoint_override`` alone for one with ``[read_api] auth = "local"``."""
    group = cfg.OptGroup(GROUP, title="gmd's fairness-aware weigher")
    conf.register_group(group)
    conf.register_opts(OPTS, group=group)
    ks_loading.register_session_conf_options(conf, GROUP)
    ks_loading.register_auth_conf_options(conf, GROUP)
    ks_loading.register_adapter_conf_options(conf, GROUP, include_deprecated=False)
    conf.set_default("service_type", SERVICE_TYPE, group=GROUP)
    conf.set_default("valid_interfaces", ["internal", "public"], group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """For oslo-config-generator (the ``oslo.config.opts`` entry point)."""
    return [(GROUP, OPTS)]


def _adapter(conf: cfg.ConfigOpts) -> Any:
    auth = ks_loading.load_auth_from_conf_options(conf, GROUP)
    session = ks_loading.load_session_from_conf_options(conf, GROUP, auth=auth)
    return ks_loading.load_adapter_from_conf_options(conf, GROUP, session=session, auth=auth)


class GmdRefused(GmdError, RuntimeError):
    """gmd answered, but not with the document (its status and detail)."""


def fetcher(conf: cfg.ConfigOpts) -> Callable[[str, bool], object]:
    """A fetch of gmd's route for a project, over the ``[gmd]`` keystoneauth adapter: the
    JSON answer, or :class:`GmdRefused` (keystoneauth's own errors for no answer at all)."""
    adapter = _adapter(conf)
    intervals = conf[GROUP].intervals

    def fetch(project_id: str, hosts: bool = True) -> object:
        params = {"intervals": intervals, "project": project_id}
        if not hosts:
            params["hosts"] = "false"
        response = adapter.get(ROUTE, params=params, raise_exc=False)
        if response.status_code != 200:
            raise GmdRefused(f"GET {ROUTE}: {response.status_code} {response.text[:200]}")
        return response.json()

    return fetch
