"""A report's columns: the key of each field, its header and how many digits a table shows.

The ledger's queries (:mod:`gmd.daemon.reports`) declare theirs, and every reader shows the
same fields under the same headers: gmd-admin's tables (:mod:`gmd.render`), the read API and
its web page. The simulator's tables use them too, which is why they live outside the
daemon: ``gmd.sim`` reaches nothing of ``gmd.daemon``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

Justify = Literal["default", "left", "center", "right", "full"]


class Unit(StrEnum):
    """What a column's numbers count, where a reader needs to be told: a table shows them in
    binary multiples with the unit in every cell (``1.5 GiB``), while CSV, JSON and YAML keep
    the raw number under a key that names the unit (``disk_bytes``, ``memory_byte_s``)."""

    bytes = "B"
    byte_seconds = "B·s"
    bytes_per_s = "B/s"


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    digits: int | None = 4
    justify: Justify = "right"
    unit: Unit | None = None


PROJECT = Column("name", "Project", None, "left")
"""A customer's project name beside its uuid (the key), where the ledger knows it."""
