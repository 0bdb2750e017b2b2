"""The usage report grouped by host, kept apart from the other groupings as Slurm's sreport keeps
its report families: per host its owner now, the most VMs and customers in one interval, and
the CPU, memory, disk and network its on-time samples used.

With ``--customer`` it reads that customer's samples only (a customer's share of a host is not
rolled up). The columns are defined in :mod:`gmd.daemon.reports.usage`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Connection, distinct, func, literal, select

from gmd.columns import Column, Unit
from gmd.daemon.reports.coverage import Coverage
from gmd.daemon.reports.usage.common import (
    Range,
    Steps,
    late_by,
    raw_and_rolled,
    sql_float,
    sql_int,
)
from gmd.ledger_schema.tables import (
    host_rollups as _host_rollups,
    hosts as _hosts,
    organizations as _organizations,
    samples as _samples,
)

HOST_COLUMNS = (
    Column("host", "Host", None, "left"),
    Column("organization", "Organization", None, "left"),
    Column("vms", "VMs", None),
    Column("customers", "Customers", None),
    Column("samples", "Samples", None),
    Column("cpu_core_s", "CPU core-s", 1),
    Column("memory_byte_s", "Memory", 0, unit=Unit.byte_seconds),
    Column("disk_bytes", "Disk read+written", 0, unit=Unit.bytes),
    Column("network_bytes", "Network in+out", 0, unit=Unit.bytes),
    Column("late_samples", "Late samples", None),
)


def by_host(
    conn: Connection, rng: Range, step: Steps, customer_id: int | None
) -> tuple[tuple[Column, ...], list[dict[str, object]], list[str]]:
    step("samples per host")
    # A customer's share of a host is not rolled up: its report reads the samples.
    cover = rng.cover if customer_id is None else Coverage(rng.lo, rng.hi, (), ((rng.lo, rng.hi),))
    found = _use_by_host(conn, cover, customer_id)
    step("peaks and late samples")
    peaks = _peaks_by_host(conn, cover, customer_id)
    late = late_by(conn, rng, _samples.c.host_id, customer_id)
    step("names")
    hosts = {
        int(r.id): (str(r.name), str(r.org))
        for r in conn.execute(
            select(_hosts.c.id, _hosts.c.name, _organizations.c.name.label("org")).join(
                _organizations, _organizations.c.id == _hosts.c.organization_id
            )
        )
    }
    rows = []
    for hid in set(found) | set(late):
        r = found.get(hid)
        name, org = hosts.get(hid, (str(hid), ""))
        vms, customers = peaks.get(hid, (0, 0))
        rows.append(
            {
                "host": name,
                "organization": org,
                "vms": vms,
                "customers": customers,
                "samples": 0 if r is None else sql_int(r.samples),
                "cpu_core_s": 0.0 if r is None else sql_float(r.cpu),
                "memory_byte_s": 0.0 if r is None else sql_float(r.memory),
                "disk_bytes": 0.0 if r is None else sql_float(r.disk),
                "network_bytes": 0.0 if r is None else sql_float(r.network),
                "late_samples": late.get(hid, 0),
            }
        )
    notes = [
        "on-time samples of the intervals starting in the range (late ones counted apart);"
        " disk = read + written, network = received + sent; vms and customers: the most in"
        " one interval; organization: the owner now"
    ]
    return HOST_COLUMNS, rows, notes


def _use_by_host(conn: Connection, cover: Coverage, customer_id: int | None) -> dict[int, Any]:
    """Per host, its on-time samples and what they used (raw samples and rollups)."""
    s_ = _samples.c
    mine = [] if customer_id is None else [s_.customer_id == customer_id]
    raw = select(
        s_.host_id.label("host"),
        literal(1, BigInteger).label("samples"),
        s_.cpu_s.label("cpu"),
        s_.memory_byte_s.label("memory"),
        (s_.disk_read_bytes + s_.disk_write_bytes).label("disk"),
        (s_.network_rx_bytes + s_.network_tx_bytes).label("network"),
    ).where(cover.raw_where(s_.interval_id), s_.late.is_(False), *mine)
    hr = _host_rollups.c
    rolled = select(
        hr.host_id, hr.samples, hr.cpu_s, hr.memory_byte_s, hr.disk_bytes, hr.network_bytes
    ).where(cover.rolled_where(_host_rollups))
    sums = dict.fromkeys(("samples", "cpu", "memory", "disk", "network"), func.sum)
    return {int(r.host): r for r in raw_and_rolled(conn, (raw, rolled), ("host",), **sums)}


def _peaks_by_host(
    conn: Connection, cover: Coverage, customer_id: int | None
) -> dict[int, tuple[int, int]]:
    """Per host, the most VMs and customers it ran in one interval."""
    s_ = _samples.c
    mine = [] if customer_id is None else [s_.customer_id == customer_id]
    per_interval = (
        select(
            s_.host_id.label("host"),
            func.count(distinct(s_.vm_id)).label("vms"),
            func.count(distinct(s_.customer_id)).label("customers"),
        )
        .where(cover.raw_where(s_.interval_id), s_.late.is_(False), *mine)
        .group_by(s_.interval_id, s_.host_id)
    )
    hr = _host_rollups.c
    rolled = select(hr.host_id, hr.vms_max, hr.customers_max).where(
        cover.rolled_where(_host_rollups)
    )
    return {
        int(r.host): (int(r.vms), int(r.customers))
        for r in raw_and_rolled(
            conn, (per_interval, rolled), ("host",), vms=func.max, customers=func.max
        )
    }
