"""An independent recomputation of gmd's ledger, for the soak harness.

The soak run's claim is that every accounted figure and balance equals an independent
recomputation to 1e-9. "Independent" is the point: this module imports nothing of gmd. It
reads the ledger's tables with plain SQL and recomputes, with plain Python floats, what
``docs/fairness-model.md`` (Sec. 2-4) says each interval gives, so that a bug shared by gmd's
engine and a check built on it cannot hide. Where the spec leaves a rule open, the rule is
gmd's (read in its accountant, written again here); where gmd departs from the spec, a comment
says "gmd:" and why the oracle follows it.

The recomputation chains from its *own* results (balances, DirectContr sums), never from the
ledger's previous rows: a figure tampered with in one interval is then reported once, in that
interval, and a wrong sample is reported where it went wrong and wherever it carried.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import text

NEGLIGIBLE = 1e-12
"""gmd forgets a customer's standing once its balance, utility sums and priority are all below
this (and it ran no VM): it then has no row, and the next interval starts it from zero."""

DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0

ENDOWMENTS = ("flavor", "equal")
CONSUMERS = ("vm", "customer")
UTILITIES = ("psi_double_prime", "psi", "psi_prime")
_UTILITY_ALIASES = {"ψ″": "psi_double_prime", "ψ": "psi", "ψ′": "psi_prime"}


@dataclass(frozen=True)
class _Resource:
    """One accounted resource and where its numbers are in the ledger."""

    name: str
    usage: tuple[str, ...]
    """``samples`` columns whose sum is the amount a VM used in the interval"""
    capacity: str
    """``host_intervals`` column: the host's amount per second"""
    flavor: str
    """``samples`` column: the VM's configured amount per second (NULL: none)"""


_COMBINED = (
    _Resource("cpu", ("cpu_s",), "cpu_cores", "flavor_vcpus"),
    _Resource("memory", ("memory_byte_s",), "memory_bytes", "flavor_memory_bytes"),
    _Resource(
        "disk",
        ("disk_read_bytes", "disk_write_bytes"),
        "disk_bytes_per_s",
        "flavor_disk_bytes_per_s",
    ),
    _Resource(
        "network",
        ("network_rx_bytes", "network_tx_bytes"),
        "network_bytes_per_s",
        "flavor_network_bytes_per_s",
    ),
)
# With split_io, the disk bandwidth bounds reads and writes each, the link speed received and
# sent bytes each (full duplex): each half gets the whole capacity and flavor.
_SPLIT = (
    *_COMBINED[:2],
    _Resource("disk_read", ("disk_read_bytes",), "disk_bytes_per_s", "flavor_disk_bytes_per_s"),
    _Resource("disk_write", ("disk_write_bytes",), "disk_bytes_per_s", "flavor_disk_bytes_per_s"),
    _Resource(
        "network_rx", ("network_rx_bytes",), "network_bytes_per_s", "flavor_network_bytes_per_s"
    ),
    _Resource(
        "network_tx", ("network_tx_bytes",), "network_bytes_per_s", "flavor_network_bytes_per_s"
    ),
)
_USAGE_COLUMNS = tuple(c for r in _COMBINED for c in r.usage)
_FLAVOR_COLUMNS = tuple(r.flavor for r in _COMBINED)
_CAPACITY_COLUMNS = tuple(r.capacity for r in _COMBINED)


@dataclass(frozen=True)
class Accounting:
    """The ``[accounting]`` settings the recomputation depends on, with gmd's defaults.

    The interval length is not one of them: each interval's supply is its capacity times the
    length the ledger recorded for it (``intervals.length_s``), as gmd accounts it."""

    gamma: float = 0.5
    half_life_s: float = DEFAULT_HALF_LIFE_S
    """``math.inf``: no decay (gmd.toml's ``"none"``)"""
    endowment: str = "flavor"
    consumer: str = "vm"
    utility: str = "psi_double_prime"
    split_io: bool = False
    weights: Mapping[str, float] = field(default_factory=dict)
    """by resource name as accounted; a resource not named weighs 1"""

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("endowment", self.endowment, ENDOWMENTS),
            ("consumer", self.consumer, CONSUMERS),
            ("utility", self.utility, UTILITIES),
        ):
            if value not in allowed:
                raise ValueError(f"accounting.{name} = {value!r}: one of {allowed}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"accounting.gamma = {self.gamma!r}: 0..1")
        if not self.half_life_s > 0:
            raise ValueError(f"accounting.half_life_s = {self.half_life_s!r}: > 0")

    @classmethod
    def from_config(cls, doc: Mapping[str, Any]) -> Accounting:
        """From the parsed TOML document of gmd.toml; a missing key takes gmd's default."""
        acc = dict(doc.get("accounting", {}))
        half = acc.get("half_life_s", DEFAULT_HALF_LIFE_S)
        utility = str(acc.get("utility", "psi_double_prime"))
        return cls(
            gamma=float(acc.get("gamma", 0.5)),
            half_life_s=math.inf if half == "none" else float(half),
            endowment=str(acc.get("endowment", "flavor")),
            consumer=str(acc.get("consumer", "vm")),
            utility=_UTILITY_ALIASES.get(utility, utility),
            split_io=bool(acc.get("split_io", False)),
            weights={str(k): float(v) for k, v in dict(acc.get("weights", {})).items()},
        )

    @property
    def resources(self) -> tuple[_Resource, ...]:
        return _SPLIT if self.split_io else _COMBINED

    def weight(self, resource: str) -> float:
        return float(self.weights.get(resource, 1.0))


@dataclass(frozen=True)
class Mismatch:
    """One ledger figure that differs from its recomputation (None: the row is missing on
    that side)."""

    interval_start_s: int
    what: str
    key: str
    ledger: float | None
    recomputed: float | None


# ---------------------------------------------------------------------------------------------
# What one interval holds (read from the ledger) and what it carries (recomputed).


@dataclass
class _Vm:
    """One VM on one host in the interval: its batches' rows made one."""

    host: int
    customer: int
    use: list[float]
    flavor: list[float]
    """per resource, for the interval (NaN: the flavor sets none)"""
    created_s: float | None
    last_batch: int


@dataclass(frozen=True)
class _Host:
    organization: int
    supply: list[float]
    """per resource, capacity × interval"""


@dataclass
class _Standing:
    """What carries from the last interval with rows: per customer (balance, utility work,
    utility moment), per organization (contribution work, moment)."""

    start_s: int | None = None
    customers: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    organizations: dict[int, tuple[float, float]] = field(default_factory=dict)


@dataclass
class _Rows:
    """One interval's recomputed ledger rows, keyed as the tables are, and for the ψ and ψ′
    utilities the magnitude each valued figure was computed from (see :func:`_close`)."""

    customers: dict[int, dict[str, float]] = field(default_factory=dict)
    terms: dict[tuple[int, str], float] = field(default_factory=dict)
    organizations: dict[int, dict[str, float]] = field(default_factory=dict)
    scale: dict[tuple[str, int], float] = field(default_factory=dict)


def _decay(elapsed_s: float, half_life_s: float) -> float:
    return 1.0 if math.isinf(half_life_s) else 2.0 ** (-elapsed_s / half_life_s)


def _account(
    start_s: int,
    length_s: int,
    vms: list[_Vm],
    hosts: Mapping[int, _Host],
    before: _Standing,
    settings: Accounting,
    customer_of_org: Mapping[int, int],
    reset: set[int],
) -> tuple[_Rows, _Standing]:
    """Sec. 2-4 of the spec for one interval with samples, from the standing ``before``."""
    resources = settings.resources
    m = len(resources)
    weights = [settings.weight(r.name) for r in resources]
    for vm in vms:
        if vm.host not in hosts:
            raise LookupError(f"interval {start_s}: a sample of host {vm.host} without capacity")

    # s_i = S_i / N: N the customers with a running VM (a sample) in the interval; S_i the
    # supply of the hosts accounted (gmd: those with an on-time batch still accepted).
    active = {vm.customer for vm in vms}
    share = [math.fsum(h.supply[i] for h in hosts.values()) / max(len(active), 1) for i in range(m)]
    per_unit = [weights[i] / (m * share[i]) for i in range(m)]

    on_host: dict[int, list[_Vm]] = defaultdict(list)
    for vm in vms:
        on_host[vm.host].append(vm)

    # Endowments per VM, flavor mode: e = v · min(1, r / Σv) on the host. gmd: a VM whose
    # flavor sets no amount of a resource (disk and network without a QoS limit, or no
    # flavor at all) has v = r / (number of VMs on the host), the equal split over *all* its
    # VMs, and that v is scaled down with the others when the host is oversold.
    endowed: dict[int, list[float]] = {}
    if settings.endowment == "flavor":
        for h, members in on_host.items():
            supply = hosts[h].supply
            columns = []
            for i in range(m):
                v = [
                    supply[i] / len(members) if math.isnan(vm.flavor[i]) else vm.flavor[i]
                    for vm in members
                ]
                total = math.fsum(v)
                scale = supply[i] / total if total > supply[i] else 1.0
                columns.append([x * scale for x in v])
            for k, vm in enumerate(members):
                endowed[id(vm)] = [columns[i][k] for i in range(m)]

    # Consumers: each VM, or (consumer = customer) a customer's VMs on a host together, their
    # use and flavor endowments summed; equal endowments split the host among the consumers.
    consumers: dict[int, dict[Any, tuple[int, list[float], list[float]]]] = {}
    for h, members in on_host.items():
        groups: dict[Any, list[_Vm]] = defaultdict(list)
        for vm in members:
            groups[id(vm) if settings.consumer == "vm" else vm.customer].append(vm)
        supply = hosts[h].supply
        consumers[h] = {}
        for key, group in groups.items():
            use = [math.fsum(vm.use[i] for vm in group) for i in range(m)]
            if settings.endowment == "equal":
                e = [supply[i] / len(groups) for i in range(m)]
            else:
                e = [math.fsum(endowed[id(vm)][i] for vm in group) for i in range(m)]
            consumers[h][key] = (group[0].customer, use, e)

    # Offsets per host: α, β, κ = min(1, α/β) (0 when β = 0); o = a − e when a ≥ e, else
    # γ·κ·(a − e); each resource's term w_i · o / (m · s_i).
    terms: dict[int, list[list[float]]] = defaultdict(lambda: [[] for _ in range(m)])
    for pool in consumers.values():
        for i in range(m):
            diffs = [(c, use[i] - e[i]) for c, use, e in pool.values()]
            over = math.fsum(max(0.0, d) for _, d in diffs)
            ceded = math.fsum(max(0.0, -d) for _, d in diffs)
            credit = min(1.0, over / ceded) if ceded > 0 else 0.0
            for c, d in diffs:
                offset = d if d >= 0 else settings.gamma * credit * d
                terms[c][i].append(offset * per_unit[i])

    # DirectContr work u_j = Σ_i w_i · a_ij / (m · s_i) per VM (the VM's own use, whatever the
    # consumers); its moment u·τ with τ the interval's start (ψ, ψ″) or, for ψ′, the time since
    # the VM was created (gmd: unknown creation counts as the interval's start).
    orgs = set(before.organizations) | {h.organization for h in hosts.values()}
    account_of_org = {
        o: ("c", customer_of_org[o]) if o in customer_of_org else ("o", o) for o in orgs
    }
    customers = (
        set(before.customers) | active | {customer_of_org[o] for o in orgs if o in customer_of_org}
    )
    work: dict[tuple[str, int], list[float]] = defaultdict(list)
    moment: dict[tuple[str, int], list[float]] = defaultdict(list)
    given: dict[tuple[str, int], list[float]] = defaultdict(list)
    given_moment: dict[tuple[str, int], list[float]] = defaultdict(list)
    vm_count: dict[int, int] = defaultdict(int)
    for vm in vms:
        u = math.fsum(vm.use[i] * per_unit[i] for i in range(m))
        if settings.utility == "psi_prime" and vm.created_s is not None:
            tau = float(start_s) - vm.created_s
        elif settings.utility == "psi_prime":
            tau = 0.0
        else:
            tau = float(start_s)
        work[("c", vm.customer)].append(u)
        moment[("c", vm.customer)].append(u * tau)
        provider = account_of_org[hosts[vm.host].organization]
        given[provider].append(u)
        given_moment[provider].append(u * tau)
        vm_count[vm.customer] += 1

    # Everything carried decays by the time since the last interval with rows (gmd: the
    # spec's Δt is that elapsed time, so an interval nobody reported decays the balances as
    # if zeros had been written). gmd: the DirectContr sums decay with the same half-life,
    # where the spec writes U += and C += without decay. A reset starts the balance (only)
    # from 0.
    d = 1.0 if before.start_s is None else _decay(start_s - before.start_s, settings.half_life_s)
    end_s = float(start_s + length_s)

    def valued(w: float, mo: float) -> tuple[float, float]:
        """A utility or contribution from its sums, and the magnitude it was computed from."""
        if settings.utility == "psi_double_prime":
            return w, abs(w)
        return end_s * w - mo, abs(end_s * w) + abs(mo)

    contribution_sums: dict[tuple[str, int], tuple[float, float]] = {}
    for o in sorted(orgs):
        a = account_of_org[o]
        cw, cm = before.organizations.get(o, (0.0, 0.0))
        contribution_sums[a] = (cw, cm)  # gmd: orgs sharing an account carry the same sums
    for a, (cw, cm) in list(contribution_sums.items()):
        contribution_sums[a] = (
            cw * d + math.fsum(given.get(a, ())),
            cm * d + math.fsum(given_moment.get(a, ())),
        )

    rows = _Rows()
    after = _Standing(start_s)
    utility_of: dict[tuple[str, int], tuple[float, float]] = {}
    for c in sorted(customers):
        balance, uw, um = before.customers.get(c, (0.0, 0.0, 0.0))
        if c in reset:
            balance = 0.0
        greediness = math.fsum(t for column in terms.get(c, [[]] * m) for t in column)
        balance = balance * d + greediness
        uw = uw * d + math.fsum(work.get(("c", c), ()))
        um = um * d + math.fsum(moment.get(("c", c), ()))
        utility, u_scale = valued(uw, um)
        utility_of[("c", c)] = (utility, u_scale)
        cw, cm = contribution_sums.get(("c", c), (0.0, 0.0))
        contribution, c_scale = valued(cw, cm)
        priority = contribution - utility
        n = vm_count.get(c, 0)
        standing = (balance, uw, um, priority)
        if n == 0 and all(abs(v) < NEGLIGIBLE for v in standing):
            continue
        rows.customers[c] = {
            "greediness": greediness,
            "balance": balance,
            "utility_work": uw,
            "utility_moment": um,
            "utility": utility,
            "priority": priority,
            "vms": float(n),
        }
        rows.scale[("c", c)] = u_scale + c_scale
        after.customers[c] = (balance, uw, um)
        if n:
            for i, r in enumerate(resources):
                rows.terms[(c, r.name)] = math.fsum(terms[c][i])
    for o in sorted(orgs):
        a = account_of_org[o]
        cw, cm = contribution_sums[a]
        contribution, c_scale = valued(cw, cm)
        utility, u_scale = utility_of.get(a, (0.0, 0.0))
        rows.organizations[o] = {
            "contribution_work": cw,
            "contribution_moment": cm,
            "contribution": contribution,
            "utility": utility,
            "priority": contribution - utility,
        }
        rows.scale[("o", o)] = c_scale + u_scale
        after.organizations[o] = (cw, cm)
    return rows, after


# ---------------------------------------------------------------------------------------------
# Reading the ledger.


def _read_vms(
    conn: sa.Connection, interval_id: int, length_s: int, settings: Accounting
) -> list[_Vm]:
    """The interval's counted samples, a row per VM and host: on time, of an on-time batch
    still accepted. gmd: a VM with rows from several batches of its host (an agent restarted
    mid-interval) has their use added up and its owner and flavor from the latest batch."""
    columns = ", ".join(f"s.{c}" for c in (*_USAGE_COLUMNS, *_FLAVOR_COLUMNS))
    found = conn.execute(
        text(
            f"SELECT s.host_id, s.vm_id, s.customer_id, s.batch_id, {columns}, v.created_s"
            " FROM samples s"  # on PostgreSQL a view of sample_batches, same columns
            " JOIN batches b ON b.id = s.batch_id AND b.interval_id = s.interval_id"
            " LEFT JOIN vms v ON v.id = s.vm_id"
            " WHERE s.interval_id = :i AND s.late = :no AND b.late = :no"
            " AND b.state = 'accepted'"
            " ORDER BY s.host_id, s.vm_id, s.batch_id"
        ),
        {"i": interval_id, "no": False},
    ).all()
    resources = settings.resources
    merged: dict[tuple[int, int], _Vm] = {}
    for row in found:
        host, vm_id, customer, batch_id = (int(x) for x in row[:4])
        fields = dict(zip(_USAGE_COLUMNS + _FLAVOR_COLUMNS, row[4:-1], strict=True))
        use = [math.fsum(float(fields[c]) for c in r.usage) for r in resources]
        flavor = [
            math.nan if fields[r.flavor] is None else float(fields[r.flavor]) * length_s
            for r in resources
        ]
        created = None if row[-1] is None else float(row[-1])
        seen = merged.get((host, vm_id))
        if seen is None:
            merged[(host, vm_id)] = _Vm(host, customer, use, flavor, created, batch_id)
            continue
        seen.use = [a + b for a, b in zip(seen.use, use, strict=True)]
        if batch_id >= seen.last_batch:
            seen.customer, seen.flavor, seen.last_batch = customer, flavor, batch_id
    return list(merged.values())


def _read_hosts(
    conn: sa.Connection, interval_id: int, length_s: int, settings: Accounting
) -> dict[int, _Host]:
    """The hosts the interval is accounted with: those with an on-time batch still accepted,
    with the capacity and owner recorded for the interval (gmd: ``host_intervals``'
    organization, the owner then, not ``hosts``' current one)."""
    columns = ", ".join(_CAPACITY_COLUMNS)
    found = conn.execute(
        text(
            f"SELECT host_id, organization_id, {columns} FROM host_intervals"
            " WHERE interval_id = :i AND host_id IN (SELECT host_id FROM batches"
            " WHERE interval_id = :i AND late = :no AND state = 'accepted')"
        ),
        {"i": interval_id, "no": False},
    ).all()
    hosts = {}
    for row in found:
        capacity = dict(zip(_CAPACITY_COLUMNS, row[2:], strict=True))
        supply = [float(capacity[r.capacity]) * length_s for r in settings.resources]
        hosts[int(row[0])] = _Host(int(row[1]), supply)
    return hosts


def _ledger(conn: sa.Connection, interval_id: int) -> _Rows:
    rows = _Rows()
    for r in conn.execute(
        text(
            "SELECT customer_id, greediness, balance, utility_work, utility_moment, utility,"
            " priority, vms FROM customer_ledger WHERE interval_id = :i"
        ),
        {"i": interval_id},
    ).mappings():
        rows.customers[int(r["customer_id"])] = {
            k: float(v) for k, v in r.items() if k != "customer_id"
        }
    for c, resource, term in conn.execute(
        text(
            "SELECT customer_id, resource, term FROM customer_resource_ledger"
            " WHERE interval_id = :i"
        ),
        {"i": interval_id},
    ):
        rows.terms[(int(c), str(resource))] = float(term)
    for r in conn.execute(
        text(
            "SELECT organization_id, contribution_work, contribution_moment, contribution,"
            " utility, priority FROM organization_ledger WHERE interval_id = :i"
        ),
        {"i": interval_id},
    ).mappings():
        rows.organizations[int(r["organization_id"])] = {
            k: float(v) for k, v in r.items() if k != "organization_id"
        }
    return rows


# ---------------------------------------------------------------------------------------------
# Comparing.


def _close(a: float, b: float, tolerance: float, scale: float = 0.0) -> bool:
    """|a − b| ≤ tolerance · max(1, |a|, |b|, scale). ``scale`` is for ψ and ψ′ values, which
    are differences of two sums near 1e9 × work (the interval's end in Unix seconds times the
    work, less the moment): float64 holds those only to ~1e-7, whatever computes them."""
    return abs(a - b) <= tolerance * max(1.0, abs(a), abs(b), scale)


_SCALED = frozenset({"utility", "contribution", "priority"})


class _Checker:
    def __init__(self, tolerance: float) -> None:
        self.tolerance = tolerance
        self.checked = 0
        self.mismatches: list[Mismatch] = []

    def rows(
        self,
        start_s: int,
        name: str,
        ledger: Mapping[Any, float | Mapping[str, float]],
        recomputed: Mapping[Any, float | Mapping[str, float]],
        key_of: Any,
        scale: Mapping[Any, float] | None = None,
    ) -> None:
        """Compare two row sets keyed alike: a row on one side only is a mismatch (``what``
        ``row``, the other side None), then each figure of the rows both have."""
        for k in sorted(set(ledger) | set(recomputed), key=str):
            key = key_of(k)
            theirs, ours = ledger.get(k), recomputed.get(k)
            if theirs is None or ours is None:
                self.mismatches.append(Mismatch(start_s, name, key, _first(theirs), _first(ours)))
                continue
            if isinstance(theirs, Mapping) and isinstance(ours, Mapping):
                extra = 0.0 if scale is None else scale.get(k, 0.0)
                for what, value in ours.items():
                    self.figure(start_s, what, key, theirs[what], value, extra * (what in _SCALED))
            else:
                assert isinstance(theirs, float) and isinstance(ours, float)
                self.figure(start_s, name, key, theirs, ours)

    def figure(
        self, start_s: int, what: str, key: str, ledger: float, ours: float, scale: float = 0.0
    ) -> None:
        self.checked += 1
        if not _close(ledger, ours, self.tolerance, scale):
            self.mismatches.append(Mismatch(start_s, what, key, ledger, ours))


def _first(row: float | Mapping[str, float] | None) -> float | None:
    """What a one-sided row shows in its mismatch: a term, or a customer's balance, or an
    organization's contribution."""
    if row is None or isinstance(row, float):
        return row
    return row.get("balance", row.get("contribution"))


def recompute(
    engine: sa.Engine, settings: Accounting, tolerance: float = 1e-9
) -> tuple[int, list[Mismatch]]:
    """Every accounted interval (``intervals.state == 'accounted'``), in order: recompute each
    customer's interval greediness, its per-resource terms, its balance (decayed from the
    previous accounted interval's, and resets), utility, and each organization's
    contribution/utility/priority; compare with the ledger's rows (relative-or-absolute
    tolerance: |a − b| ≤ tolerance · max(1, |a|, |b|)); return (figures checked, mismatches).
    A customer row the ledger lacks or has extra is a mismatch too."""
    check = _Checker(tolerance)
    with engine.connect() as conn:
        customer_name = {
            int(i): str(n) for i, n in conn.execute(text("SELECT id, name FROM customers"))
        }
        org_name: dict[int, str] = {}
        customer_of_org: dict[int, int] = {}
        for i, n, c in conn.execute(text("SELECT id, name, customer_id FROM organizations")):
            org_name[int(i)] = str(n)
            if c is not None:
                customer_of_org[int(i)] = int(c)
        resets = [
            (int(c), int(e))
            for c, e in conn.execute(
                text("SELECT customer_id, effective_start_s FROM balance_resets")
            )
        ]
        intervals = conn.execute(
            text(
                "SELECT id, start_s, length_s, ledger_rows FROM intervals"
                " WHERE state = 'accounted' ORDER BY start_s"
            )
        ).all()
        standing = _Standing()
        for interval_id, start, length, ledger_rows in intervals:
            start_s, length_s = int(start), int(length)
            vms = _read_vms(conn, interval_id, length_s, settings)
            if vms:
                # A reset recorded for the interval starting at E counts in the first interval
                # accounted from a standing before E: P < E ≤ start.
                prior = standing.start_s
                reset = set() if prior is None else {c for c, e in resets if prior < e <= start_s}
                hosts = _read_hosts(conn, interval_id, length_s, settings)
                ours, standing = _account(
                    start_s, length_s, vms, hosts, standing, settings, customer_of_org, reset
                )
            else:
                # No samples at all: no rows, and the standing carries over untouched.
                ours = _Rows()
            theirs = _ledger(conn, interval_id)

            def customer(c: int) -> str:
                return f"customer {customer_name.get(c, c)}"

            check.rows(
                start_s,
                "row",
                theirs.customers,
                ours.customers,
                customer,
                {c: s for (kind, c), s in ours.scale.items() if kind == "c"},
            )
            check.rows(
                start_s,
                "term",
                theirs.terms,
                ours.terms,
                lambda k: f"{customer(k[0])} {k[1]}",
            )
            check.rows(
                start_s,
                "organization row",
                theirs.organizations,
                ours.organizations,
                lambda o: f"organization {org_name.get(o, o)}",
                {o: s for (kind, o), s in ours.scale.items() if kind == "o"},
            )
            check.figure(
                start_s, "ledger_rows", "interval", float(ledger_rows or 0), len(ours.customers)
            )
    return check.checked, check.mismatches
