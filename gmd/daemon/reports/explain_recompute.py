"""An interval accounted again, VM by VM, for ``gmd-admin explain``.

The ledger keeps each customer's greediness but not the per-VM arithmetic behind it, so the
interval is read and stepped here exactly as accounting does (the pure step, with the current
configuration), which gives every VM's use, endowment and offset and every host's over-use α,
unused share β and credit factor κ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection, select

from gmd.daemon.config import Config
from gmd.daemon.ledger.step_input import IntervalData, read_interval
from gmd.fairness.cloud import CloudGreediness
from gmd.ledger_schema.tables import (
    host_intervals as _host_intervals,
    hosts as _hosts,
    organizations as _orgs,
    vms as _vms,
)


@dataclass(frozen=True)
class ResourceUse:
    resource: str
    used: float
    endowment: float
    offset: float
    term: float
    """this VM's contribution to its customer's greediness from this resource"""


@dataclass(frozen=True)
class VmExplained:
    uuid: str
    greediness: float
    resources: list[ResourceUse]


@dataclass(frozen=True)
class HostResource:
    resource: str
    supply: float
    over: float
    """α: what all consumers on the host took above their endowments"""
    unused: float
    """β: what consumers left of their endowments"""
    credit: float
    """κ = min(1, α/β): the fraction of unused endowment others actually took"""


@dataclass(frozen=True)
class HostExplained:
    name: str
    organization: str
    consumers: int
    vms: list[VmExplained]
    resources: list[HostResource]

    @property
    def greediness(self) -> float:
        return sum(v.greediness for v in self.vms)


def recompute(
    conn: Connection, config: Config, interval_id: int, customer_id: int
) -> tuple[list[HostExplained], float, dict[str, float], int]:
    """The customer's hosts and VMs in the interval, its recomputed G, the share s_i and N:
    the interval read and stepped exactly as accounting does (:func:`read_interval`, then the
    pure step :func:`gmd.fairness.ledger_step.step_interval`), with the current
    configuration."""
    acc = config.accounting
    with np.errstate(over="ignore", invalid="ignore"):
        data = read_interval(conn, interval_id, acc)
        if data is None:
            return [], 0.0, {}, 0
        step = data.step(acc.interval_settings())
    result = step.result.greediness
    resources = acc.resources
    share = {r: float(result.share[k]) for k, r in enumerate(resources)}
    mine = step.accounts.account_of_customer.get(customer_id)
    if mine is None:
        return [], 0.0, share, result.active_customers
    names = _names(conn, interval_id, data)
    consumers_on = np.bincount(result.consumer_host, minlength=len(names.hosts))
    explained: list[HostExplained] = []
    for h in sorted(
        {int(result.consumer_host[j]) for j in np.flatnonzero(result.consumer_customer == mine)}
    ):
        ids = np.flatnonzero((result.consumer_customer == mine) & (result.consumer_host == h))
        host = names.hosts[h]
        explained.append(
            HostExplained(
                host.name,
                host.organization,
                int(consumers_on[h]),
                [_vm_explained(result, int(j), names.vm_uuids, resources) for j in ids],
                [
                    HostResource(
                        r,
                        float(data.sampled.supply[h, k]),
                        float(result.over[h, k]),
                        float(result.ceded[h, k]),
                        float(result.credit[h, k]),
                    )
                    for k, r in enumerate(resources)
                ],
            )
        )
    return explained, float(result.customer_greediness[mine]), share, result.active_customers


@dataclass(frozen=True)
class _Names:
    hosts: list[Any]
    """per host row: its ``name`` and its owner ``organization``'s name"""
    vm_uuids: list[str]
    """per VM row: its uuid"""


def _names(conn: Connection, interval_id: int, data: IntervalData) -> _Names:
    """The names behind the interval's host and VM rows."""
    uuids = dict(
        conn.execute(
            select(_vms.c.id, _vms.c.uuid).where(_vms.c.id.in_(np.unique(data.vm_ids).tolist()))
        ).all()
    )
    named = {
        int(h.id): h
        for h in conn.execute(
            select(_hosts.c.id, _hosts.c.name, _orgs.c.name.label("organization"))
            .join(_host_intervals, _host_intervals.c.host_id == _hosts.c.id)
            .join(_orgs, _orgs.c.id == _host_intervals.c.organization_id)
            .where(
                _host_intervals.c.interval_id == interval_id,
                _hosts.c.id.in_(data.host_ids.tolist()),
            )
        )
    }
    return _Names([named[int(h)] for h in data.host_ids], [str(uuids[int(v)]) for v in data.vm_ids])


def _vm_explained(
    result: CloudGreediness, consumer: int, vm_uuid: list[str], resources: Sequence[str]
) -> VmExplained:
    """One consumer (a VM, or the VMs the consumer mode makes one) term by term."""
    members = np.flatnonzero(result.consumer_of_vm == consumer)
    return VmExplained(
        ", ".join(vm_uuid[int(v)] for v in members),
        float(result.greediness[consumer]),
        [
            ResourceUse(
                r,
                float(result.use[consumer, k]),
                float(result.endowment[consumer, k]),
                float(result.offsets[consumer, k]),
                float(result.terms[consumer, k]),
            )
            for k, r in enumerate(resources)
        ],
    )
