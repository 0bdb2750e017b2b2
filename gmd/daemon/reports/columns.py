"""A report's columns: the key of each field, its header and how many digits a table shows.

They belong with the queries (:mod:`gmd.daemon.reports`), which every reader of the ledger
shares: gmd-admin's tables (:mod:`gmd.admin.render`), the read API and its web page show the
same fields under the same headers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Justify = Literal["default", "left", "center", "right", "full"]


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    digits: int | None = 4
    justify: Justify = "right"


PROJECT = Column("name", "Project", None, "left")
"""A customer's project name beside its uuid (the key), where the ledger knows it."""
