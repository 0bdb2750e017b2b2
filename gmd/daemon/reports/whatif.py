"""What-if: the ledger's own recorded intervals replayed under other settings, in memory.

"Who would have been throttled, when, had γ, the thresholds, the half-life or the endowment
been otherwise?" gmd keeps every interval's raw samples for ``retention.raw_days`` and every
level it decided: a what-if replays those intervals through the same pure step accounting
takes (:func:`gmd.fairness.ledger_step.step_interval`, balances and levels alike, fed by
:func:`read_raw_interval` and :func:`gmd.daemon.ledger.step_input.interval_data` exactly as
accounting is), and compares with what was recorded. It never writes the ledger, so it can run
beside the daemon and again with the same answer.

The replay starts from the standing the ledger recorded before ``--from`` (balances, DirectContr
sums and the levels then in force): "had these settings applied from then on". With no
override it reproduces the recorded balances, greediness and levels interval by interval.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import json
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import Connection, func, select

from gmd import GmdError, OptionError
from gmd.columns import PROJECT, Column
from gmd.common.config import ConfigError
from gmd.common.timespec import iso
from gmd.daemon.config import Config, parse
from gmd.daemon.ledger import reset_window
from gmd.daemon.ledger.accounting import LedgerRows, ledger_rows
from gmd.daemon.ledger.interval_samples import organization_customers, read_raw_interval
from gmd.daemon.ledger.step_input import interval_data, previous_standing, read_standing
from gmd.fairness.contended import contended_use
from gmd.fairness.ledger_step import (
    CustomerStanding,
    IntervalStep,
    LedgerStanding,
    LevelHeld,
    finite_balances,
)
from gmd.ledger_schema.kinds import ActionKind, IntervalState
from gmd.ledger_schema.tables import (
    actions as _actions,
    customer_ledger as _ledger,
    customers as _customers,
    intervals as _intervals,
    samples as _samples,
)
from gmd.wire import PlanMode

CHANGEABLE: Mapping[str, tuple[str, ...]] = {
    "accounting": ("gamma", "endowment", "consumer", "half_life_s", "utility", "weights"),
    "enforcement": (
        "enter",
        "leave",
        "dwell_s",
        "max_step",
        "priority_weight",
        "cap_level",
        "cpu_cap_fractions",
        "contended_above",
    ),
}
"""What a what-if may change: the settings an interval's accounting and level decision depend
on, and the CPU caps and contention that the moderate customers' share is estimated with. The
interval length, retention, hosts and the rest shape what was recorded, not how it is
judged."""

TABLES = ("weights", "contended_above")
"""Changeable keys that are tables too: ``accounting.weights.cpu=2``,
``enforcement.contended_above.cpu=0.5``."""

COLUMNS = (
    Column("customer", "Customer", None, "left"),
    PROJECT,
    Column("throttle_hours", "Throttled h", 2),
    Column("recorded_throttle_hours", "Recorded h", 2),
    Column("max_level", "Max level", None),
    Column("recorded_max_level", "Recorded max", None),
    Column("changes", "Changes", None),
    Column("recorded_changes", "Recorded changes", None),
    Column("first_action", "First change", None, "left"),
    Column("last_action", "Last change", None, "left"),
    Column("balance", "Balance", 4),
    Column("recorded_balance", "Recorded balance", 4),
    Column("added", "Added", None, "left"),
    Column("removed", "Removed", None, "left"),
    Column("earlier", "Earlier", None, "left"),
    Column("later", "Later", None, "left"),
    Column("timeline", "Level timeline", None, "left"),
    Column("recorded_timeline", "Recorded timeline", None, "left"),
)
"""Per customer: replayed beside recorded; level changes as before→after and the interval
after which they were decided; the timelines as before→after and when each level came into
force (last: a narrow terminal drops them first, JSON and CSV keep them)."""

MAX_SETS = 20
"""At most this many ``--set`` (the read API's bound on one request)."""

MAX_INTERVALS = 100_000
"""A replay's bound: about 70 days of 60 s intervals, two years of 15-minute ones."""


class WhatIfRefused(OptionError):
    """A what-if that cannot be run as asked; the message says what and where (exit 2, 400)."""


class WhatIfStopped(GmdError):
    """A what-if stopped before its end (its time budget spent, its client gone): 503."""


MAX_VALUE_CHARS = 1000
"""The longest ``--set`` value: a list of levels is a few dozen characters; a value nested
thousands deep would make the TOML reader recurse past Python's stack."""


def with_overrides(config: Config, sets: Sequence[str]) -> Config:
    """``config`` with each ``KEY=VALUE`` of ``sets`` applied (``accounting.gamma=0.3``,
    ``enforcement.enter=[1, 3, 6]``, ``accounting.endowment=equal``): its document changed
    and parsed again, so that the same parser checks the changes as the file itself."""
    if len(sets) > MAX_SETS:
        raise WhatIfRefused(f"{len(sets)} changes; a what-if takes at most {MAX_SETS}")
    source, path = config.source, config.path
    doc = copy.deepcopy(config.document)
    for item in sets:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise WhatIfRefused(f"--set {item!r}: give KEY=VALUE, e.g. accounting.gamma=0.3")
        parts = key.split(".")
        allowed = CHANGEABLE.get(parts[0], ())
        if (
            len(parts) < 2
            or parts[1] not in allowed
            or (len(parts) > 2 and (parts[1] not in TABLES or len(parts) > 3))
        ):
            choices = ", ".join(f"{s}.{k}" for s, keys in CHANGEABLE.items() for k in keys)
            raise WhatIfRefused(f"--set {key}: a what-if can change {choices}")
        table: dict[str, Any] = doc
        for part in parts[:-1]:
            inner = table.setdefault(part, {})
            if not isinstance(inner, dict):
                raise WhatIfRefused(f"--set {key}: {part} is not a table in {source}")
            table = inner
        table[parts[-1]] = _value(value.strip(), key)
    named = " ".join(f"--set {s}" for s in sets)
    try:
        return parse(doc, f"{source} with {named}" if sets else source, path)
    except ConfigError as exc:
        raise WhatIfRefused(str(exc)) from None


def _value(text: str, key: str) -> Any:
    """A TOML value (0.3, [1, 3, 6], "equal", none), or the text itself as a string."""
    if len(text) > MAX_VALUE_CHARS:
        raise WhatIfRefused(
            f"--set {key}: a value of {len(text)} characters; at most {MAX_VALUE_CHARS} characters"
        )
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise WhatIfRefused(f"--set {key}: the value is nested too deep") from None


@dataclass(frozen=True)
class TimedLevelChange:
    """A level decided after the interval starting at ``start_s`` (in force from its end)."""

    start_s: int
    end_s: int
    before: int
    after: int


@dataclass
class CustomerWhatIf:
    """One customer's replay beside its record."""

    customer: str
    name: str | None
    replayed: list[TimedLevelChange] = field(default_factory=list)
    recorded: list[TimedLevelChange] = field(default_factory=list)
    throttled_s: float = 0.0
    recorded_throttled_s: float = 0.0
    balance: float = 0.0
    recorded_balance: float = 0.0
    max_level: int = 0
    recorded_max_level: int = 0


@dataclass
class WhatIf:
    """A replay: per customer, per interval, and what differs from the record."""

    from_s: int
    to_s: int
    intervals: int
    sets: tuple[str, ...]
    customers: dict[int, CustomerWhatIf]
    balances: dict[int, dict[int, float]]
    """interval start → customer id → balance after it, replayed"""
    greediness: dict[int, dict[int, float]]
    levels: dict[int, dict[int, int]]
    """interval start → customer id → level in force during it, replayed"""
    recorded_balances: dict[int, dict[int, float]] = field(default_factory=dict)
    """interval start → customer id → balance after it, as the ledger holds it (filled by
    :func:`read_recorded_balances`, for a plot)"""
    recorded_levels: dict[int, dict[int, int]] = field(default_factory=dict)
    """interval start → customer id → level in force during it, as recorded"""
    contended_cpu: dict[int, float] = field(default_factory=dict)
    """customer id → its CPU use on contended hosts over the range, measured (core-seconds)"""
    contended_cpu_capped: dict[int, float] = field(default_factory=dict)
    """the same bounded by the replay's CPU caps (:mod:`gmd.fairness.contended`)"""
    contended_cpu_recorded_capped: dict[int, float] = field(default_factory=dict)
    """the same bounded by the caps of the levels the record had in force: what the record
    gives with caps applied, as the replay's figure does (its own figure, where its levels
    were decided in dry-run, is of use no cap held)"""
    rows: dict[int, LedgerRows] = field(default_factory=dict)
    """interval start → the rows accounting would have written (``keep_rows`` only)"""
    recorded_modes: frozenset[PlanMode] = frozenset()
    """the modes the range's recorded level changes were decided in: caps were in force in
    the record only where they were decided "on" (its contended CPU is as measured)"""


def replay(
    conn: Connection,
    config: Config,
    from_s: float,
    to_s: float,
    sets: Sequence[str] = (),
    *,
    keep_rows: bool = False,
    max_intervals: int = MAX_INTERVALS,
    stop: Callable[[], str | None] | None = None,
) -> WhatIf:
    """The accounted intervals starting in [``from_s``, ``to_s``) replayed under ``config``;
    with ``keep_rows`` each interval's ledger rows as accounting would write them too (every
    column: what a check of the ledger against its own replay compares). At most
    ``max_intervals`` (more: :class:`WhatIfRefused`); ``stop()``, asked before each interval,
    says why the replay must end now (:class:`WhatIfStopped`). Settings whose balances are not
    finite numbers (weights that overflow) are refused, not reported."""
    rows = _intervals_in(conn, from_s, to_s, max_intervals)
    _check_raw(conn, config, rows[0].start_s)
    first_s = int(rows[0].start_s)
    recorded = _recorded_levels(conn)
    standing = _standing_before(conn, first_s, recorded)
    out = WhatIf(int(from_s), int(to_s), len(rows), tuple(sets), {}, {}, {}, {})
    run = _Replay(
        conn,
        config,
        out,
        keep_rows,
        # Read once for the whole range: which organizations are customers, and the resets.
        organization_customers(conn),
        reset_window.resets(
            conn, first_s if standing.start_s is None else standing.start_s, int(rows[-1].start_s)
        ),
        cap_fractions(config),
        _RecordedInForce(recorded),
    )
    for done, interval in enumerate(rows):
        why = None if stop is None else stop()
        if why is not None:
            raise WhatIfStopped(
                f"the what-if stopped after {done} of its {len(rows)} intervals: {why}"
            )
        standing = run.interval(interval, standing)
    _compare(conn, out, rows, recorded)
    out.recorded_modes = _recorded_modes(conn, first_s, int(to_s))
    return out


def _intervals_in(conn: Connection, from_s: float, to_s: float, max_intervals: int) -> list[Any]:
    """The accounted intervals starting in the range, oldest first (refused: none, too many)."""
    rows = conn.execute(
        select(_intervals.c.id, _intervals.c.start_s, _intervals.c.length_s)
        .where(
            _intervals.c.start_s >= from_s,
            _intervals.c.start_s < to_s,
            _intervals.c.state == IntervalState.accounted,
        )
        .order_by(_intervals.c.start_s)
    ).all()
    if not rows:
        raise WhatIfRefused(f"no accounted interval starts in [{iso(from_s)}, {iso(to_s)})")
    if len(rows) > max_intervals:
        raise WhatIfRefused(
            f"[{iso(from_s)}, {iso(to_s)}) holds {len(rows)} intervals; a what-if replays at"
            f" most {max_intervals} ([read_api] whatif_max_intervals): give a shorter range"
        )
    return list(rows)


def _standing_before(
    conn: Connection, first_s: int, recorded: Mapping[int, Sequence[tuple[int, int, int, int]]]
) -> LedgerStanding:
    """The standing the ledger recorded before ``first_s``, with the levels then in force:
    each customer's last recorded change before it (a customer once above 0 keeps its row,
    as customer_levels does)."""
    levels: dict[int, LevelHeld] = {}
    for c, changes in recorded.items():
        earlier = [x for x in changes if x[0] < first_s]
        if earlier:
            levels[c] = LevelHeld(earlier[-1][3], float(earlier[-1][1]))
    prev = previous_standing(conn, first_s)
    if prev is None:
        return LedgerStanding.nothing(levels)
    return read_standing(conn, int(prev.id), int(prev.start_s), levels)


class _RecordedInForce:
    """The recorded levels in force, advanced interval by interval over the record's changes
    (a change is in force from the interval after the one it was decided after)."""

    def __init__(self, recorded: Mapping[int, Sequence[tuple[int, int, int, int]]]) -> None:
        self.events = sorted(
            (in_force, c, after)
            for c, changes in recorded.items()
            for _, in_force, _, after in changes
        )
        self.now: dict[int, int] = {}
        self.next = 0

    def at(self, start_s: int) -> dict[int, int]:
        """The levels in force in the interval starting at ``start_s`` (called in order)."""
        while self.next < len(self.events) and self.events[self.next][0] <= start_s:
            _, c, after = self.events[self.next]
            self.now[c] = after
            self.next += 1
        return self.now


@dataclass
class _Replay:
    """What a replay reads once and fills interval by interval."""

    conn: Connection
    config: Config
    out: WhatIf
    keep_rows: bool
    org_customer: dict[int, int]
    resets: list[tuple[int, int]]
    caps: np.ndarray
    recorded: _RecordedInForce

    def interval(self, interval: Any, standing: LedgerStanding) -> LedgerStanding:
        """One interval stepped from ``standing`` (the pure step accounting takes, levels and
        all); returns the standing after it."""
        acc, out = self.config.accounting, self.out
        start_s, length_s = int(interval.start_s), int(interval.length_s)
        out.levels[start_s] = {c: h.level for c, h in standing.levels.items() if h.level > 0}
        raw = read_raw_interval(
            self.conn,
            interval.id,
            acc,
            span=(start_s, length_s),
            customer_of_organization=self.org_customer,
        )
        if raw is None:
            return standing
        reset = (
            set()
            if standing.start_s is None
            else reset_window.customers_within(self.resets, standing.start_s, start_s)
        )
        enforcement = self.config.enforcement
        policy = None if enforcement.mode == PlanMode.off else enforcement.policy
        with np.errstate(over="ignore", invalid="ignore"):
            step = interval_data(raw, acc, standing, reset).step(acc.interval_settings(), policy)
        in_force = self.recorded.at(start_s)
        _add_contended(
            out, step, acc.resources, self.config, self.caps, out.levels[start_s], in_force
        )
        written = ledger_rows(interval.id, step, acc.resources)
        if self.keep_rows:
            out.rows[start_s] = written
        if not step.customers:
            return standing
        _finite(step.customers, start_s, out.sets)
        out.balances[start_s] = {c: s.balance for c, s in step.customers.items()}
        out.greediness[start_s] = {
            int(r["customer_id"]): float(r["greediness"]) for r in written.customers
        }
        for change in () if step.levels is None else step.levels.changes:
            _customer(out, self.conn, change.customer_id).replayed.append(
                TimedLevelChange(start_s, start_s + length_s, change.before, change.after)
            )
        return step.after


def _recorded_modes(conn: Connection, from_s: int, to_s: int) -> frozenset[PlanMode]:
    """The modes the level changes of intervals starting in [from_s, to_s) were decided in."""
    flags = conn.execute(
        select(_actions.c.dry_run)
        .distinct()
        .join(_intervals, _intervals.c.id == _actions.c.interval_id)
        .where(
            _actions.c.kind == ActionKind.level.value,
            _intervals.c.start_s >= from_s,
            _intervals.c.start_s < to_s,
        )
    ).scalars()
    return frozenset(PlanMode.dry_run if dry else PlanMode.on for dry in flags)


def _finite(customers: Mapping[int, CustomerStanding], start_s: int, sets: Sequence[str]) -> None:
    """:class:`WhatIfRefused` when a replayed balance is not a finite number: such settings
    say nothing (a NaN would read as throttled for ever)."""
    if not finite_balances(customers):
        changed = " ".join(f"--set {s}" for s in sets) or "the settings"
        raise WhatIfRefused(
            f"{changed}: balances are not finite numbers from the interval at"
            f" {iso(start_s)} on (a weight or amount overflows): nothing to report"
        )


def cap_fractions(config: Config) -> np.ndarray:
    """Per level (0 … the policy's levels), the CPU cap its VMs get as a fraction of their
    vCPUs, NaN where it has none."""
    policy = config.enforcement.policy
    caps = [policy.effect(level).cpu_cap_fraction for level in range(policy.levels + 1)]
    return np.array([np.nan if f is None else f for f in caps])


def _add_contended(
    out: WhatIf,
    step: IntervalStep,
    resources: Sequence[str],
    config: Config,
    caps: np.ndarray,
    levels: Mapping[int, int],
    recorded_levels: Mapping[int, int],
) -> None:
    """Add the interval's CPU use on contended hosts to each customer's sums: as measured, and
    bounded by the cap (``caps``: :func:`cap_fractions`) of the level the replay has in force
    (``levels``; a level recorded under settings with more levels counts as the highest), and
    by that of the level the record had in force (``recorded_levels``)."""
    if "cpu" not in resources:
        return
    customers = step.accounts.customers
    column = list(resources).index("cpu")
    threshold = config.enforcement.contention.cpu_above

    def bounded(by: Mapping[int, int]) -> Any:
        level = np.minimum([by.get(c, 0) for c in customers], len(caps) - 1)
        return contended_use(
            step.use, column, threshold, caps[level] if len(customers) else np.zeros(0)
        )

    found, record = bounded(levels), bounded(recorded_levels)
    sums = (
        (out.contended_cpu, found.measured),
        (out.contended_cpu_capped, found.capped),
        (out.contended_cpu_recorded_capped, record.capped),
    )
    for i in np.flatnonzero(found.measured):
        c = customers[i]
        for total, values in sums:
            total[c] = total.get(c, 0.0) + float(values[i])


def _check_raw(conn: Connection, config: Config, first_s: int) -> None:
    """Refuse a range that starts before the oldest interval whose raw samples are kept (an
    interval's id is its start: the oldest is the samples' index's first entry, no scan)."""
    oldest = conn.execute(select(func.min(_samples.c.interval_id))).scalar()
    if oldest is None or first_s < oldest:
        kept = "none" if oldest is None else f"from the interval of {iso(oldest)}"
        raise WhatIfRefused(
            f"the interval of {iso(first_s)} is past raw retention (retention.raw_days ="
            f" {config.retention.raw_days:g}): raw samples are kept {kept}; give --from at or"
            " after it"
        )


def _recorded_levels(conn: Connection) -> dict[int, list[tuple[int, int, int, int]]]:
    """Customer id → its recorded level changes: (interval start, in force from, before, after),
    oldest first."""
    out: dict[int, list[tuple[int, int, int, int]]] = {}
    query = (
        select(
            _actions.c.customer_id,
            _intervals.c.start_s,
            _intervals.c.length_s,
            _actions.c.before,
            _actions.c.after,
        )
        .join(_intervals, _intervals.c.id == _actions.c.interval_id)
        .where(_actions.c.kind == ActionKind.level.value)
        .order_by(_intervals.c.start_s, _actions.c.id)
    )
    for cid, start, length, before, after in conn.execute(query):
        out.setdefault(int(cid), []).append(
            (int(start), int(start + length), _level(before), _level(after))
        )
    return out


def _level(document: str | None) -> int:
    try:
        return int(json.loads(document or "{}").get("level", 0))
    except (ValueError, TypeError, AttributeError):
        return 0


def _customer(out: WhatIf, conn: Connection, customer_id: int) -> CustomerWhatIf:
    found = out.customers.get(customer_id)
    if found is None:
        name, display = conn.execute(
            select(_customers.c.name, _customers.c.display_name).where(
                _customers.c.id == customer_id
            )
        ).one()
        found = out.customers[customer_id] = CustomerWhatIf(str(name), display)
    return found


def _compare(
    conn: Connection,
    out: WhatIf,
    rows: Sequence[Any],
    recorded: dict[int, list[tuple[int, int, int, int]]],
) -> None:
    """Each customer's throttle time and level changes, replayed and recorded: one pass over
    the replayed levels in force, and each customer's recorded changes as spans of intervals
    (prefix sums of their lengths), never customers × intervals."""
    starts = [int(r.start_s) for r in rows]
    lengths = {int(r.start_s): int(r.length_s) for r in rows}
    prefix = [0, *itertools.accumulate(int(r.length_s) for r in rows)]
    last = starts[-1]
    final = out.balances.get(max(out.balances)) if out.balances else {}
    recorded_final = dict(
        conn.execute(
            select(_ledger.c.customer_id, _ledger.c.balance)
            .join(_intervals, _intervals.c.id == _ledger.c.interval_id)
            .where(
                _intervals.c.start_s
                == select(func.max(_intervals.c.start_s))
                .join(_ledger, _ledger.c.interval_id == _intervals.c.id)
                .where(_intervals.c.start_s <= last)
                .scalar_subquery()
            )
        ).all()
    )
    throttled: dict[int, int] = {}
    highest: dict[int, int] = {}
    for s, in_force in out.levels.items():
        for c, level in in_force.items():
            throttled[c] = throttled.get(c, 0) + lengths[s]
            highest[c] = max(highest.get(c, 0), level)
    for c in set(recorded) | set(final or {}) | set(throttled):
        changes = [x for x in recorded.get(c, []) if starts[0] <= x[0] <= last]
        level_before = [x for x in recorded.get(c, []) if x[0] < starts[0]]
        entry = _customer(out, conn, c)
        entry.recorded = [TimedLevelChange(s, e, b, a) for s, e, b, a in changes]
        entry.throttled_s = throttled.get(c, 0)
        entry.max_level = highest.get(c, 0)
        # A level holds from interval k through the one after which the next change was
        # decided (that change is in force from the interval after it).
        level, k = (level_before[-1][3] if level_before else 0), 0
        for upto in [bisect.bisect_right(starts, x[0]) for x in changes] + [len(starts)]:
            if upto > k:
                entry.recorded_max_level = max(entry.recorded_max_level, level)
                if level > 0:
                    entry.recorded_throttled_s += prefix[upto] - prefix[k]
                    for s in starts[k:upto]:
                        out.recorded_levels.setdefault(s, {})[c] = level
                k = upto
            if changes:
                level = changes.pop(0)[3]
        entry.balance = float((final or {}).get(c, 0.0))
        entry.recorded_balance = float(recorded_final.get(c, 0.0))
    # Customers with neither levels nor a balance in the range are not worth a row.
    for c in [
        c
        for c, e in out.customers.items()
        if not (e.replayed or e.recorded or e.balance or e.recorded_balance)
    ]:
        del out.customers[c]


def read_recorded_balances(conn: Connection, out: WhatIf) -> None:
    """Fill ``out.recorded_balances`` from the ledger (every customer's row of every interval
    in the range: the recorded side of a plot; a table needs only the final balances)."""
    starts = sorted(out.levels)
    if not starts:
        return
    for cid, start, balance in conn.execute(
        select(_ledger.c.customer_id, _intervals.c.start_s, _ledger.c.balance)
        .join(_intervals, _intervals.c.id == _ledger.c.interval_id)
        .where(_intervals.c.start_s >= starts[0], _intervals.c.start_s <= starts[-1])
    ):
        out.recorded_balances.setdefault(int(start), {})[int(cid)] = float(balance)


def differences(entry: CustomerWhatIf) -> dict[str, list[str]]:
    """The level changes added, removed, earlier or later than recorded (same transition)."""
    left = list(entry.recorded)
    out: dict[str, list[str]] = {"added": [], "removed": [], "earlier": [], "later": []}
    for change in entry.replayed:
        match = next(
            (r for r in left if (r.before, r.after) == (change.before, change.after)), None
        )
        words = f"{change.before}→{change.after} after {iso(change.start_s)}"
        if match is None:
            out["added"].append(words)
            continue
        left.remove(match)
        if change.start_s < match.start_s:
            out["earlier"].append(f"{words} (recorded after {iso(match.start_s)})")
        elif change.start_s > match.start_s:
            out["later"].append(f"{words} (recorded after {iso(match.start_s)})")
    out["removed"] = [f"{r.before}→{r.after} after {iso(r.start_s)}" for r in left]
    return out


def timeline(changes: Sequence[TimedLevelChange]) -> str:
    """Level changes in words: "0→1 from 2026-11-20T10:15:00Z; 1→0 from …"."""
    return "; ".join(f"{c.before}→{c.after} from {iso(c.end_s)}" for c in changes)


def rows_of(result: WhatIf) -> list[dict[str, object]]:
    """One row per customer, as the report shows it (table, CSV, JSON)."""
    out: list[dict[str, object]] = []
    for entry in sorted(result.customers.values(), key=lambda e: (-e.throttled_s, e.customer)):
        diff = differences(entry)
        first = entry.replayed[0].end_s if entry.replayed else None
        last = entry.replayed[-1].end_s if entry.replayed else None
        out.append(
            {
                "customer": entry.customer,
                "name": entry.name,
                "throttle_hours": round(entry.throttled_s / 3600, 4),
                "recorded_throttle_hours": round(entry.recorded_throttled_s / 3600, 4),
                "max_level": entry.max_level,
                "recorded_max_level": entry.recorded_max_level,
                "changes": len(entry.replayed),
                "recorded_changes": len(entry.recorded),
                "first_action": None if first is None else iso(first),
                "last_action": None if last is None else iso(last),
                "balance": round(entry.balance, 6),
                "recorded_balance": round(entry.recorded_balance, 6),
                **{k: "; ".join(v) for k, v in diff.items()},
                "timeline": timeline(entry.replayed),
                "recorded_timeline": timeline(entry.recorded),
            }
        )
    return out


def moderate_share(result: WhatIf) -> tuple[float | None, float | None]:
    """The moderate customers' share of the CPU used on contended hosts, like with like:
    replayed (a throttled customer's use bounded by the caps of the replay's levels) and
    recorded (bounded by the caps of the record's levels: in a record decided in dry-run no
    cap held its use, and comparing that with a capped replay showed a difference that was
    only the caps). With no change the two are equal. Moderate: at level 0 throughout, in
    the replay and in the record, so that both shares are of the same customers. None where
    no host was contended."""
    throttled = {
        c for c, e in result.customers.items() if e.throttled_s > 0 or e.recorded_throttled_s > 0
    }
    moderate = sum(v for c, v in result.contended_cpu.items() if c not in throttled)
    replayed = sum(result.contended_cpu_capped.values())
    recorded = sum(result.contended_cpu_recorded_capped.values())
    return (
        moderate / replayed if replayed > 0 else None,
        moderate / recorded if recorded > 0 else None,
    )


def measured_share(result: WhatIf) -> float | None:
    """The moderate customers' share of the contended CPU as measured, no cap applied by the
    replay: what they got in fact (beside :func:`moderate_share`'s, what caps would give)."""
    throttled = {
        c for c, e in result.customers.items() if e.throttled_s > 0 or e.recorded_throttled_s > 0
    }
    moderate = sum(v for c, v in result.contended_cpu.items() if c not in throttled)
    measured = sum(result.contended_cpu.values())
    return moderate / measured if measured > 0 else None


def indicators(result: WhatIf) -> dict[str, object]:
    """Cloud-wide: customers throttled, throttle-hours, the spread of final balances, the
    moderate customers' share of contended CPU (:func:`moderate_share`)."""
    entries = list(result.customers.values())
    final = [e.balance for e in entries]
    recorded = [e.recorded_balance for e in entries]
    share, recorded_share = moderate_share(result)
    return {
        "intervals": result.intervals,
        "customers_throttled": sum(1 for e in entries if e.throttled_s > 0),
        "recorded_customers_throttled": sum(1 for e in entries if e.recorded_throttled_s > 0),
        "throttle_hours": round(sum(e.throttled_s for e in entries) / 3600, 4),
        "recorded_throttle_hours": round(sum(e.recorded_throttled_s for e in entries) / 3600, 4),
        "balance_spread": round(float(np.std(final)), 6) if final else 0.0,
        "recorded_balance_spread": round(float(np.std(recorded)), 6) if recorded else 0.0,
        "moderate_share_of_contended_cpu": None if share is None else round(share, 6),
        "recorded_moderate_share_of_contended_cpu": (
            None if recorded_share is None else round(recorded_share, 6)
        ),
        "measured_moderate_share_of_contended_cpu": (
            None if (measured := measured_share(result)) is None else round(measured, 6)
        ),
        "recorded_modes": sorted(m.value for m in result.recorded_modes),
    }


def _caps_then(modes: frozenset[PlanMode]) -> str:
    """Whether the record's caps held in fact (decided "on") or only on paper (dry-run)."""
    if modes == {PlanMode.dry_run}:
        return "the record was decided in dry-run: its caps did not hold in fact"
    if modes == {PlanMode.on}:
        return "the record's caps held in fact"
    if modes:
        return "the record's caps held in fact only where it was decided on"
    return "no level changed in the record"


def _share(x: object) -> str:
    return f"{100 * x:.1f} %" if isinstance(x, float) else "-"


def summary_lines(result: WhatIf) -> list[str]:
    """The replay in sentences, replayed beside recorded: what gmd-admin whatif prints above
    its table and the web page above its own."""
    s = indicators(result)
    sets = " ".join(f"--set {x}" for x in result.sets)
    first = min(result.levels) if result.levels else result.from_s
    return [
        f"{result.intervals} interval(s) from {iso(first)} replayed with "
        + (sets if sets else "the configuration as it is"),
        f"customers throttled {s['customers_throttled']} (recorded"
        f" {s['recorded_customers_throttled']}), throttle-hours {s['throttle_hours']:g}"
        f" (recorded {s['recorded_throttle_hours']:g}), spread of balances"
        f" {s['balance_spread']:.4g} (recorded {s['recorded_balance_spread']:.4g})",
        "moderate customers' share of the CPU used on contended hosts"
        f" {_share(s['moderate_share_of_contended_cpu'])} (recorded"
        f" {_share(s['recorded_moderate_share_of_contended_cpu'])}), each with its levels'"
        " caps holding the capped VMs, nobody's use raised; as measured"
        f" {_share(s['measured_moderate_share_of_contended_cpu'])}"
        f" ({_caps_then(result.recorded_modes)})",
    ]


def document(result: WhatIf, customers: list[dict[str, object]] | None = None) -> dict[str, object]:
    """The what-if as JSON: its range and changes, the indicators, a row per customer (the
    read API's answer and ``gmd-admin whatif -f json``)."""
    return {
        "from": iso(result.from_s),
        "to": iso(result.to_s),
        "sets": list(result.sets),
        "indicators": indicators(result),
        "summary": summary_lines(result),
        "customers": rows_of(result) if customers is None else customers,
    }
