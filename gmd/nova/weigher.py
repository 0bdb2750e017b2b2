"""gmd's Nova scheduler weigher: FALB's fairness-aware placement over the hosts' *measured*
utilisation (docs/nova.md says how to install and configure it, and how it fails).

List it in nova.conf's ``[filter_scheduler] weight_classes`` (beside Nova's own weighers or
alone) as ``gmd.nova.weigher.FairnessWeigher``; its options are in ``[gmd]``
(:func:`register_opts`). Per request it reads gmd's ``GET /v1/hosts/utilization`` through
:class:`~gmd.nova.source.Source` (once, cached, behind a hard timeout), ranks the candidates
by :func:`gmd.nova.ranking.rank` and returns each one's closeness in [0, 1]. ``minval = 0`` and
``maxval = 1`` keep Nova from stretching the candidates' closeness to 0..1 (two hosts 0.51 and
0.49 apart stay that close); the weight is then multiplied by ``[gmd] weight_multiplier``, or
by the ``gmd_weight_multiplier`` of the host's aggregates (the smallest of them, Nova's rule).

**It fails open.** When gmd is down, slow, refuses or answers nonsense, every candidate weighs
the same (0): the placement is what Nova's other weighers make it. Each such request is
counted and logged as a warning, never an error, and never raises into the scheduler.
"""

from __future__ import annotations

import logging
from typing import Any

from nova import conf as nova_conf
from nova.scheduler import utils as scheduler_utils, weights

from gmd.fairness.placement import Strategy
from gmd.nova.client import AGGREGATE_KEY, GROUP, fetcher, register_opts
from gmd.nova.ranking import Candidate, Ranked, Request, rank
from gmd.nova.source import Source

LOG = logging.getLogger(__name__)
CONF = nova_conf.CONF
register_opts(CONF)


def candidate(host_state: Any) -> Candidate:
    """Nova's view of a host, for one gmd has not measured."""
    return Candidate(
        host=str(host_state.host),
        nodename=getattr(host_state, "nodename", None),
        vcpus_total=float(getattr(host_state, "vcpus_total", 0) or 0),
        vcpus_used=float(getattr(host_state, "vcpus_used", 0) or 0),
        memory_mb_total=float(getattr(host_state, "total_usable_ram_mb", 0) or 0),
        memory_mb_free=float(getattr(host_state, "free_ram_mb", 0) or 0),
    )


class FairnessWeigher(weights.BaseHostWeigher):
    """FALB's closeness of each candidate host, from gmd's measured utilisation."""

    minval = 0.0
    maxval = 1.0

    def __init__(self) -> None:
        settings = CONF[GROUP]
        self.strategy = Strategy(settings.strategy)
        self.source = Source(
            fetcher(CONF),
            timeout_s=settings.answer_timeout,
            cache_s=settings.cache_time,
            retry_s=settings.retry_time,
        )

    def weight_multiplier(self, host_state: Any) -> float:
        return float(
            scheduler_utils.get_weight_multiplier(
                host_state, AGGREGATE_KEY, CONF[GROUP].weight_multiplier
            )
        )

    def _weigh_object(self, host_state: Any, weight_properties: Any) -> float:
        """Unused: :meth:`weigh_objects` weighs all candidates at once (the deviation needs
        them all); a caller weighing one host alone gets the neutral weight."""
        return 0.0

    def weigh_objects(self, weighed_obj_list: list[Any], weight_properties: Any) -> list[float]:
        neutral = [0.0] * len(weighed_obj_list)
        counters = self.source.counters
        try:
            project_id = str(getattr(weight_properties, "project_id", "") or "")
            flavor = weight_properties.flavor
            request = Request(float(flavor.vcpus), float(flavor.memory_mb))
            view = self.source.view(project_id)
            if view is None:
                counters.neutral += 1
                LOG.warning(
                    "gmd's ranking is not available: %d host(s) weighed neutrally"
                    " (%d request(s) so since the scheduler started)",
                    len(weighed_obj_list),
                    counters.neutral,
                )
                return neutral
            hosts = [candidate(w.obj) for w in weighed_obj_list]
            ranked = rank(view.cluster, hosts, request, view.project, self.strategy)
        except Exception:  # never fail a boot for a ranking: weigh neutrally instead
            counters.neutral += 1
            LOG.exception("gmd's weigher failed: %d host(s) weighed neutrally", len(neutral))
            return neutral
        counters.ranked += 1
        log_ranking(hosts, ranked, view.project.id, view.project.level)
        return ranked.weights


def log_ranking(hosts: list[Candidate], ranked: Ranked, project: str, level: int) -> None:
    """Per host what it was weighed by, at debug level as Nova logs its weighers' weights."""
    if not LOG.isEnabledFor(logging.DEBUG):
        return
    LOG.debug(
        "FairnessWeigher: project %s (level %d) expected to use %.2f cores and %.0f MiB",
        project,
        level,
        ranked.expected[0],
        ranked.expected[1] / (1 << 20),
    )
    c, t = ranked.criteria, ranked.topsis
    for k, position in enumerate(ranked.ranked):
        h = hosts[position]
        detail = ""
        if c is not None:
            detail = (
                f" mean utilization {c.mean_utilization[k]:.4f}, gap {c.utilization_gap[k]:.4f},"
                f" deviation {c.deviation[k]:.4f}"
            )
        if t is not None:
            detail += f", D+ {t.d_best[k]:.4f}, D- {t.d_worst[k]:.4f}"
        LOG.debug(
            "FairnessWeigher: (%s, %s) %s:%s, closeness %.4f",
            h.host,
            h.nodename,
            "measured" if ranked.measured[position] else "allocated",
            detail,
            ranked.weights[position],
        )
    placed = set(ranked.ranked)
    for position, h in enumerate(hosts):
        if position not in placed:
            LOG.debug("FairnessWeigher: (%s, %s) not ranked: no size known", h.host, h.nodename)
