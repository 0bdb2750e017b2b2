"""The ledger's tables as SQLAlchemy Core ``Table`` objects, typed.

Accounting, reports and enforcement query with Core (bulk statements, GROUP BY in the
database), not the ORM; the models' ``__table__`` is typed loosely, so the cast lives here
once instead of in every module that queries.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Connection, Table
from sqlalchemy.dialects import postgresql, sqlite

from gmd.ledger_schema.models import (
    BalanceReset,
    Batch,
    Customer,
    CustomerLedger,
    CustomerLevel,
    CustomerResourceLedger,
    CustomerResourceRollup,
    CustomerRollup,
    EnforcementAction,
    FederationEvent,
    FederationStanding,
    Host,
    HostCapability,
    HostInterval,
    HostRollup,
    Interval,
    Organization,
    OrganizationLedger,
    OrganizationRollup,
    QuarantinedSample,
    QuotaOriginal,
    RollupPeriod,
    Sample,
    Vm,
)

organizations = cast(Table, Organization.__table__)
customers = cast(Table, Customer.__table__)
hosts = cast(Table, Host.__table__)
host_capabilities = cast(Table, HostCapability.__table__)
vms = cast(Table, Vm.__table__)
intervals = cast(Table, Interval.__table__)
batches = cast(Table, Batch.__table__)
host_intervals = cast(Table, HostInterval.__table__)
samples = cast(Table, Sample.__table__)
quarantined_samples = cast(Table, QuarantinedSample.__table__)
customer_ledger = cast(Table, CustomerLedger.__table__)
resource_ledger = cast(Table, CustomerResourceLedger.__table__)
organization_ledger = cast(Table, OrganizationLedger.__table__)
levels = cast(Table, CustomerLevel.__table__)
quota_originals = cast(Table, QuotaOriginal.__table__)
actions = cast(Table, EnforcementAction.__table__)
balance_resets = cast(Table, BalanceReset.__table__)
rollup_periods = cast(Table, RollupPeriod.__table__)
customer_rollups = cast(Table, CustomerRollup.__table__)
resource_rollups = cast(Table, CustomerResourceRollup.__table__)
host_rollups = cast(Table, HostRollup.__table__)
organization_rollups = cast(Table, OrganizationRollup.__table__)
federation_events = cast(Table, FederationEvent.__table__)
federation_standings = cast(Table, FederationStanding.__table__)


def upsert(conn: Connection, table: Table) -> Any:
    """The dialect's INSERT that can say ON CONFLICT (SQLite and PostgreSQL spell it alike)."""
    return dialect_insert(conn.dialect.name, table)


def dialect_insert(dialect_name: str, table: Table) -> Any:
    """:func:`upsert` for a dialect known by name (a statement built once per dialect)."""
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    return dialect.insert(table)
