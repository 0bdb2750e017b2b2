"""What each host should do to its VMs now: the plan ``GET /v1/plan/{host}`` returns.

A VM is in its host's plan when its customer is above level 0; a VM not in the plan is to be
left (or put back) as it was. Weights are on the cgroup v2 / libvirt ``cpu_shares`` scale
(100 = normal, 1–10000); the CPU cap is in cores, from the VM's flavor vCPUs as last reported.
"""

from __future__ import annotations

from sqlalchemy import Connection, func, select

from gmd.daemon.config import EnforcementConfig
from gmd.daemon.ledger.tables import (
    customers as _customers,
    hosts as _hosts,
    levels as _levels,
    samples as _samples,
    vms as _vms,
)
from gmd.fairness.policy import cpu_cap_cores, weights_for
from gmd.wire import VmPlanItem


def host_plan(conn: Connection, host: str, config: EnforcementConfig) -> list[VmPlanItem]:
    """The throttled VMs last seen on ``host`` and what to set on each (empty when "off")."""
    if config.mode == "off":
        return []
    latest_sample = (
        select(_samples.c.vm_id, func.max(_samples.c.id).label("sample_id"))
        .group_by(_samples.c.vm_id)
        .subquery()
    )
    rows = conn.execute(
        select(_vms.c.uuid, _customers.c.name, _levels.c.level, _samples.c.flavor_vcpus)
        .join(_hosts, _hosts.c.id == _vms.c.host_id)
        .join(_levels, _levels.c.customer_id == _vms.c.customer_id)
        .join(_customers, _customers.c.id == _vms.c.customer_id)
        .outerjoin(latest_sample, latest_sample.c.vm_id == _vms.c.id)
        .outerjoin(_samples, _samples.c.id == latest_sample.c.sample_id)
        .where(_hosts.c.name == host, _levels.c.level > 0)
        .order_by(_vms.c.uuid)
    ).all()
    plans = []
    for uuid, customer, level, vcpus in rows:
        effect = config.policy.effect(level)
        weight = weights_for(effect.weight_factor)
        plans.append(
            VmPlanItem(
                uuid=uuid,
                customer=customer,
                level=level,
                cpu_weight=weight,
                io_weight=weight,
                cpu_quota_cores=cpu_cap_cores(effect.cpu_cap_fraction, vcpus),
                disk_read_bytes_per_s=effect.disk_bytes_per_s,
                disk_write_bytes_per_s=effect.disk_bytes_per_s,
            )
        )
    return plans
