"""``[enforcement]`` and ``[enforcement.quota]`` of gmd.toml: what the daemon decides and does
about greedy customers, each key declared once (:mod:`gmd.common.settings`).

The thresholds and what each level does make a :class:`~gmd.fairness.policy.ThrottlePolicy`,
and the contention keys a :class:`~gmd.fairness.policy.ContentionPolicy`: the pure core's
classes, whose defaults these declarations repeat as TOML shows them and whose own checks
(levels that agree) refuse the table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from gmd.common.config import Reader
from gmd.common.options import Count, Kind, Number, Numbers, Text
from gmd.common.settings import composed, setting, subtable, table
from gmd.common.units import DAY_S, WEEK_S
from gmd.fairness.policy import CapResource, ContentionPolicy, DiskWeightFallback, ThrottlePolicy
from gmd.wire import PlanMode


class QuotaBackendKind(enum.StrEnum):
    """Where a cloud keeps its compute quotas."""

    nova = "nova"
    """Nova's legacy quota API (``os-quota-sets``, DbQuotaDriver)"""
    keystone_limits = "keystone-limits"
    """Unified limits: project limits in Keystone (Nova's UnifiedLimitsDriver)"""
    auto = "auto"
    """Find out from the cloud (registered limits, and whether a Nova write changes anything)"""


def _step(what: str) -> Number:
    return Number(0.25, f"each step removes this fraction of the original {what}", 0, 1)


@table("enforcement.quota")
@dataclass(frozen=True)
class QuotaConfig:
    """OpenStack compute quotas: each step removes ``step_*`` of the original quota (a
    fraction), never below ``floor_*``; the original is kept in the ledger and written back
    exactly when the customer's level drops below ``enforcement.quota_level``."""

    cloud: str = setting(
        Text(
            "",
            "the clouds.yaml entry gmd-daemon changes quotas with (an admin of the projects);"
            " empty: no quota changes",
        )
    )
    backend: QuotaBackendKind = setting(
        Kind(
            QuotaBackendKind.auto,
            "where the cloud keeps compute quotas: ``nova`` (Nova's quota API),"
            " ``keystone-limits`` (unified limits: Keystone project limits) or ``auto`` (found"
            " out from the cloud)",
        )
    )
    limits_cloud: str = setting(
        Text(
            "",
            "the clouds.yaml entry that writes Keystone limits, where that is another account"
            " than ``cloud``'s; empty: ``cloud``",
        )
    )
    step_cores: float = setting(_step("cores"))
    step_ram: float = setting(_step("RAM"))
    step_instances: float = setting(_step("instances"))
    floor_cores: int = setting(
        Count(1, "never fewer cores than this (-1: never lower them)", -1, 10**9)
    )
    floor_ram_mb: int = setting(
        Count(2048, "never less RAM than this (-1: never lower it)", -1, 10**12)
    )
    floor_instances: int = setting(
        Count(1, "never fewer instances than this (-1: never lower them)", -1, 10**9)
    )
    every_s: float = setting(
        Number(60.0, "how often quotas are brought in line with the levels", 1, DAY_S)
    )
    timeout_s: float = setting(Number(10.0, "each API request's timeout", 0.1, 600))
    retries: int = setting(Count(2, "retries of a request (timeouts and 5xx only)", 0, 20))
    names_every_s: float = setting(
        Number(
            3600.0,
            "how often customers' project names are read from Keystone (0: never; names then"
            " come from the Nova metadata)",
            0,
            WEEK_S,
        )
    )


@dataclass(frozen=True)
class Thresholds(Number):
    """``contended_above``: one fraction for every capped resource, or a table per resource
    (``{ cpu = 0.8, disk = 0.6 }``: a disk's configured bandwidth is often a rougher figure
    than its cores); read as each resource's."""

    def initial(self) -> Any:
        return dict.fromkeys(CapResource, self.default)

    def read(self, r: Reader) -> Any:
        if not isinstance(r.get(self.key, (int, float, dict), None), dict):
            return dict.fromkeys(CapResource, super().read(r))
        table = r.sub(self.key)
        above = {c: table.number(c.value, self.default, self.low, self.high) for c in CapResource}
        for key in table.table:
            if key not in above:
                raise table.fail(
                    key, f"caps exist for {' and '.join(CapResource)} only: no threshold for {key}"
                )
        return above


def _contention(
    contended_above: dict[CapResource, float], contention_intervals: int, others_above: float
) -> ContentionPolicy:
    return ContentionPolicy(
        contended_above[CapResource.cpu],
        contended_above[CapResource.disk],
        contention_intervals,
        others_above,
    )


_POLICY = ThrottlePolicy()
_CONTENTION = ContentionPolicy()


@table("enforcement")
@dataclass(frozen=True)
class EnforcementConfig:
    """What the daemon decides and does about greedy customers: levels with hysteresis, what
    each level does, and on which hosts its hard caps apply. The defaults are
    :class:`~gmd.fairness.policy.ThrottlePolicy`'s and
    :class:`~gmd.fairness.policy.ContentionPolicy`'s; the lists hold one value per level."""

    mode: PlanMode = setting(
        Kind(
            PlanMode.dry_run,
            "``off``: decide nothing; ``dry-run``: decide levels, plans and quota changes and"
            " record them as what gmd would do, applying nothing; ``on``: also apply them",
        )
    )
    policy: ThrottlePolicy = composed(
        ThrottlePolicy,
        enter=Numbers(
            _POLICY.enter,
            "level k is entered when a customer's score (its balance, less ``priority_weight``"
            " × its DirectContr priority) reaches ``enter[k-1]``; increasing",
        ),
        leave=Numbers(
            _POLICY.leave,
            "and left only when the score falls below ``leave[k-1]`` (< ``enter[k-1]``:"
            " hysteresis)",
        ),
        dwell_s=Number(
            _POLICY.dwell_s, "seconds a level is held before it may change", 0, 30 * DAY_S
        ),
        max_step=Count(_POLICY.max_step, "at most this many levels per decision", 1, 100),
        priority_weight=Number(
            _POLICY.priority_weight,
            "how much a customer's DirectContr priority (contribution − utility) lowers its"
            " score; 0: the balance alone decides",
            0,
        ),
        weight_factors=Numbers(
            _POLICY.weight_factors,
            "per level, the factor on a VM's CPU and I/O scheduling weights (work conserving:"
            " they only bite on contended hosts); in (0, 1], not growing with the level",
        ),
        weight_floor=Number(_POLICY.weight_floor, "no weight factor below this", 0, 1),
        cap_level=Count(
            _POLICY.cap_level,
            "from this level on, hard caps: CPU and disk (levels + 1: never)",
            1,
            100,
        ),
        cpu_cap_fractions=Numbers(
            _POLICY.cpu_cap_fractions,
            "per level, a VM's CPU cap as a fraction of its vCPUs; in (0, 1]",
        ),
        cap_floor=Number(_POLICY.cap_floor, "no CPU cap fraction below this", 0, 1),
        disk_caps_bytes_per_s=Numbers(
            tuple(c or 0.0 for c in _POLICY.disk_caps_bytes_per_s),
            "per level, a VM's disk cap in bytes/s (0: none)",
            zero_is_none=True,
        ),
        quota_level=Count(
            _POLICY.quota_level,
            "from this level on, the customer's OpenStack quota is lowered by one step per"
            " level (levels + 1: never)",
            1,
            100,
        ),
    )
    contention: ContentionPolicy = composed(
        _contention,
        contended_above=Thresholds(
            _CONTENTION.cpu_above,
            "a level's caps apply only on a host whose VMs together used at least this"
            " fraction of its capacity over its last ``contention_intervals``; one fraction for"
            " both, or one per resource: ``{ cpu = 0.8, disk = 0.6 }``; 0: on every host",
            0,
            1,
        ),
        contention_intervals=Count(
            _CONTENTION.intervals,
            "how many of a host's last accounted intervals ``contended_above`` looks at",
            1,
            1440,
            whole=True,
            unit="intervals",
        ),
        others_above=Number(
            _CONTENTION.others_above,
            "a customer's caps apply on a contended host only where the other customers' VMs"
            " used at least this fraction of it (per resource, over the same intervals): caps"
            " protect others, and a customer alone on a host it keeps busy loses to a cap only"
            " what nobody else wanted; 0: wherever the host is contended",
            0,
            1,
        ),
    )
    disk_weight_fallback: DiskWeightFallback = setting(
        Kind(
            DiskWeightFallback.limit,
            "on a host whose agent says it has no disk weight (no BFQ on its disks: most NVMe"
            " and virtio hosts), ``limit``: a throttled VM's disk is held instead to a bytes/s"
            " limit of the share its weight would give it, where the host's disk is contended"
            " (``contended_above``); ``none``: weights only, and the host's plan says disk"
            " throttling is unavailable there",
        )
    )
    quota: QuotaConfig = subtable(QuotaConfig)
