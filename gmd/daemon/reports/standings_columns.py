"""What the standings show and sort by: their columns and sort keys.

Apart from the report (:mod:`gmd.daemon.reports.standings`, which reads the ledger) so that a
command line that only offers the keys (``gmd-admin standings --sort``) and the read API's
parameters name them without importing SQLAlchemy.
"""

from __future__ import annotations

from enum import StrEnum

from gmd.columns import PROJECT, Column

COLUMNS = (
    Column("customer", "Customer", None, "left"),
    PROJECT,
    Column("balance", "Balance", 4),
    Column("greediness", "GM (last)", 4),
    Column("utility", "Utility", 4),
    Column("priority", "Priority", 4),
    Column("vms", "VMs", None),
    Column("level", "Level", None),
    Column("enforced", "Enforced", None, "left"),
    Column("enforced_why", "Why", None, "left"),
)
SORT_KEYS: tuple[str, ...] = tuple(
    c.key for c in COLUMNS if c.key not in ("enforced", "enforced_why")
)


class SortKey(StrEnum):
    """What the standings sort by: numbers greatest first, names A→Z (:data:`SORT_KEYS`)."""

    balance = "balance"
    greediness = "greediness"
    utility = "utility"
    priority = "priority"
    vms = "vms"
    level = "level"
    customer = "customer"
    name = "name"
