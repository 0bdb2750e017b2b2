"""Usage reports, like Slurm's ``sreport`` and CloudKitty's summaries: what the ledger says
about a range of time, grouped by customer, organization, host, resource, day or week.

Every number is a sum, count or last value of ledger rows, so that an operator who doubts a
report can get the same number with one SQL query. The definitions:

- **The range** ``[from, to)`` selects the intervals whose *start* is in it; an interval that
  ends after ``to`` counts in full.
- **Accounted intervals** are those of the range that accounting has gone past, with or
  without samples. The ledger is dense (:mod:`gmd.daemon.ledger.accounting`): every customer with a
  standing has a row in every accounted interval that had samples, and intervals without
  any samples have no rows at all. ``gm_mean`` divides ``gm_sum`` by the number of accounted
  intervals, so intervals without a row count as 0.
- **At the end** (balance, utility, priority, contribution) means the rows of the last
  accounted interval with rows that starts before ``to`` (normally inside the range; when the
  range holds only intervals without samples, the standing carried over them), as stored: not
  decayed over later intervals without samples. A customer without a row there has a
  negligible standing: 0. A balance reset (``gmd-admin reset``) taking effect after that
  interval and before ``to`` shows the balance as 0 (as ``gmd-admin standings`` does), and a
  note names the customer.
- **Throttled seconds**: levels change only at interval ends (:mod:`gmd.daemon.enforce.levels`), so
  the level in force during an interval is the one decided last at or before its start — by
  a level action in the range or before it. ``throttled_s`` is the total length of the
  accounted intervals that began at level ≥ 1. Dry-run decisions count as throttling;
  ``throttle_mode`` says what was applied in those intervals, from the hosts' reports
  (:mod:`gmd.daemon.reports.enforced`): ``applied`` (a host throttled one of the customer's
  VMs during the interval), ``dry-run``, ``not applied`` (decided with mode "on", but no
  host applied it), or several joined by ``+``.
- **Quota changes** are ``quota_lower``/``quota_restore`` actions (applied, or decided in
  dry-run; failed attempts excluded) recorded at a time in the range: quota actions belong to
  no interval.
- **Late samples** arrived after their interval closed: they are stored, counted in
  ``late_samples`` and never in the ledger, so a report marks the rows that have some.

Columns (keys of the rows), by grouping:

- ``customer``: gm_sum, gm_mean, balance, gm_<resource> (Σ of that resource's terms; they
  add up to gm_sum), utility, priority, contribution (an organization's that is this
  customer; else 0), throttled_s, throttle_mode, quota_changes, late_samples.
- ``organization``: customer (the customer it is, if any), contribution, utility, priority,
  hosts, customers (served by on-time samples on its hosts), cpu_supplied_core_s (cores ×
  interval length), cpu_used_core_s, late_samples — hosts counted for the organization that
  owned them in each interval.
- ``host``: organization (owner now), vms, customers, samples, cpu_core_s, memory_byte_s,
  disk_bytes (read + written), network_bytes (received + sent), all of on-time samples;
  late_samples.
- ``resource``: gm_sum (Σ terms), over (Σ positive terms: use beyond the endowment), under
  (Σ negative terms: ceded and credited), customers_over (customers with a positive term
  of that resource in at least one interval).
- ``day`` and ``week`` (UTC, weeks from Monday; the key is the period's first day):
  intervals (accounted), empty_intervals (without samples), active_customers (with a VM),
  gm_positive (Σ positive interval greediness), greediest and greediest_gm (the largest GM
  sum of the period), throttled_customers, actions (level decisions by their interval,
  other actions by when they were recorded), late_samples. With one customer: customer,
  intervals, gm_sum, gm_mean, balance (at the period's end), throttled_s, throttle_mode,
  late_samples.

Cost: aggregation is done by the database (GROUP BY). On 2,000 customers × 1,440 intervals
PostgreSQL answers every grouping in under 5 s; SQLite, which sorts every GROUP BY, takes
4-7 s, except for the per-resource terms (four rows per customer and interval) that the
customer and resource groupings sum: ~20 s for all customers. The customer grouping with
``top`` sums them only for the customers kept (~5 s).

The package holds :func:`report`, which checks the options, reads the range and sorts and
trims the rows, and :class:`Report`; as Slurm's sreport splits its report families, each
grouping's queries are a module of their own (:mod:`.customers`, :mod:`.organizations`,
:mod:`.hosts`, :mod:`.resources`, :mod:`.periods`) and what they share is :mod:`.common`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sqlalchemy import Connection

from gmd import OptionError
from gmd.columns import Column
from gmd.common.timespec import iso
from gmd.daemon.ledger import lookup
from gmd.daemon.reports.usage.common import Progress, Steps, load_range, sort_rows, sql_int
from gmd.daemon.reports.usage.customers import by_customer
from gmd.daemon.reports.usage.hosts import HOST_COLUMNS, by_host
from gmd.daemon.reports.usage.organizations import by_organization
from gmd.daemon.reports.usage.periods import by_period
from gmd.daemon.reports.usage.resources import by_resource

__all__ = ["GROUPS", "HOST_COLUMNS", "LATE_NOTE", "Progress", "Report", "report"]

GROUPS: tuple[str, ...] = ("customer", "organization", "host", "resource", "day", "week")
LATE_NOTE = "* late samples are stored but not counted (accounting reads on-time samples only)"


@dataclass(frozen=True)
class Report:
    """A report: rows (plain numbers and names, ready for JSON) and the columns to show."""

    group_by: str
    from_s: float
    to_s: float
    columns: tuple[Column, ...]
    rows: list[dict[str, object]]
    notes: list[str] = field(default_factory=list)
    label: str = ""
    """the key of the column that names a row (marked with * in tables when it has late samples)"""
    accounted: int = 0
    """accounted intervals in the range (0: the range is empty)"""

    def emptiness(self) -> str | None:
        """Why there are no rows, for a message; None when there are some."""
        if self.rows:
            return None
        if not self.accounted:
            return self.notes[0]
        return "nothing in the range matched"

    def document(self) -> dict[str, object]:
        return {
            "from": iso(self.from_s),
            "to": iso(self.to_s),
            "group_by": self.group_by,
            "rows": self.rows,
            "notes": self.notes,
        }

    def table_rows(self) -> list[dict[str, object]]:
        """The rows as a table shows them: names of rows with late samples marked with *."""
        shown = []
        for row in self.rows:
            late = row.get("late_samples", 0)
            if self.label and isinstance(late, int) and late > 0:
                row = {**row, self.label: f"{row[self.label]} *"}
            shown.append(row)
        return shown

    def caption(self) -> str:
        return "\n".join(self.notes)


_STEPS = {"customer": 7, "organization": 3, "host": 2, "resource": 1, "day": 4, "week": 4}
_DEFAULT_SORT = {
    "customer": "gm_sum",
    "organization": "contribution",
    "host": "cpu_core_s",
    "resource": None,
    "day": None,
    "week": None,
}


def report(
    conn: Connection,
    group_by: str,
    from_s: float,
    to_s: float,
    *,
    customer: str | None = None,
    sort: str | None = None,
    top: int | None = None,
    progress: Progress | None = None,
) -> Report:
    """The report of the intervals starting in ``[from_s, to_s)``, grouped by ``group_by``.

    Rows are sorted by ``sort`` (numbers greatest first, names A→Z) or by default: customers
    by GM sum, organizations by contribution, hosts by CPU core-seconds, resources in the
    configuration's order, days and weeks chronologically; ``top`` keeps the first rows.
    ValueError for an unknown grouping or sort column, or a ``customer`` with a grouping it
    does not apply to; UnknownCustomer for a customer the ledger has never seen.

    Intervals start on whole seconds, so the range is taken as ``[⌈from_s⌉, ⌈to_s⌉)`` and the
    report (its ``from_s``/``to_s``, document and notes) shows that one range: a title, a
    heading and a note cannot show two different "now"s for one ``--to now``.
    """
    if group_by not in GROUPS:
        raise OptionError(f"cannot group by {group_by!r}; choose one of {', '.join(GROUPS)}")
    if to_s <= from_s:
        raise OptionError(f"--from {iso(from_s)} is not before --to {iso(to_s)}")
    if customer is not None and group_by == "organization":
        raise OptionError("--customer applies to customer, host, resource, day and week reports")
    if top is not None and top < 1:
        raise OptionError("--top must be at least 1")
    periodic = group_by in ("day", "week")
    steps = Steps(1 + _STEPS[group_by] - (periodic and customer is not None), progress)
    steps("intervals of the range")
    customer_id = None if customer is None else lookup.customer_id(conn, customer)
    from_s, to_s = math.ceil(from_s), math.ceil(to_s)
    rng = load_range(conn, from_s, to_s)
    if group_by == "customer":
        columns, rows, notes = by_customer(conn, rng, steps, customer_id, sort, top)
    elif group_by == "organization":
        columns, rows, notes = by_organization(conn, rng, steps)
    elif group_by == "host":
        columns, rows, notes = by_host(conn, rng, steps, customer_id)
    elif group_by == "resource":
        columns, rows, notes = by_resource(conn, rng, steps, customer_id)
    else:
        columns, rows, notes = by_period(conn, rng, steps, group_by, customer_id)
    steps.finish()
    if not rng.accounted:
        notes.insert(0, f"no accounted interval starts in [{iso(from_s)}, {iso(to_s)})")
    key = sort if sort is not None else _DEFAULT_SORT[group_by]
    if key is not None:
        sort_rows(rows, columns, key)
    if top is not None:
        del rows[top:]
    if any(sql_int(r.get("late_samples")) > 0 for r in rows):
        notes.append(LATE_NOTE)
    return Report(group_by, from_s, to_s, columns, rows, notes, group_by, rng.accounted)
