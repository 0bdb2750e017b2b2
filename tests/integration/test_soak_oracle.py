"""The soak harness's oracle (tests/support/soak_oracle.py) against a ledger gmd really wrote.

gmd's daemon ingests batches over HTTP for 3 hosts × 6 intervals (an agent restarted
mid-interval, a host down, a VM moved, an interval nobody reported, an idle VM that cedes, a
disk QoS flavor, a late batch, a balance reset) and its accountant accounts them; the oracle,
which shares no code with gmd's engine, must find every figure equal, under the default
settings and two others, on SQLite (and PostgreSQL with GMD_TEST_POSTGRES_URL). Then one
stored figure and one sample are altered, and the oracle must say exactly where.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import sqlalchemy as sa

from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.ledger.resets import reset_balance
from tests.support import soak_oracle
from tests.support.daemon_support import (
    INTERVAL_S,
    HostSpec,
    aligned_past,
    auth,
    batch,
    fresh_postgres_database,
    make_config,
    random_vms,
    serving,
)
from tests.support.soak_oracle import Accounting, Mismatch, recompute

HOSTS = {
    "cmp-1": (HostSpec("cmp-1", cpu_cores=8, memory_bytes=32e9), "operator"),
    "cmp-2": (HostSpec("cmp-2", cpu_cores=16), "lab"),
    "cmp-3": (HostSpec("cmp-3", cpu_cores=4, memory_bytes=16e9), "operator"),
}
CUSTOMERS = ["proj-a", "proj-b", "proj-c", "proj-lab"]
OWNER = {f"vm-{i}": CUSTOMERS[(i * 3) % 4] for i in range(1, 10)}
N_INTERVALS = 6
FIRST = aligned_past(N_INTERVALS + 2)
CREATED = {"vm-2": FIRST - 3600, "vm-5": FIRST + 30, "vm-7": FIRST - 86400}
"""when some VMs were created (ψ′ values work from there); the others did not say"""

SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "customer-consumers": {
        "gamma": 0.3,
        "consumer": "customer",
        "half_life_s": 3600,
        "utility": "psi",
        "weights": {"cpu": 2.0, "memory": 0.5, "network": 0.0},
    },
    "equal-split-io": {
        "gamma": 0.6,
        "endowment": "equal",
        "split_io": True,
        "half_life_s": "none",
        "utility": "psi_prime",
        "weights": {"disk_write": 3.0, "network_rx": 0.25},
    },
}


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh ledger: a SQLite file, or a new PostgreSQL database when the tests have a
    server (GMD_TEST_POSTGRES_URL; skipped otherwise). Named as conftest's fixture, so that
    the PostgreSQL case is marked ``postgres`` the same way."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    if not os.environ.get("GMD_TEST_POSTGRES_URL"):
        pytest.skip("GMD_TEST_POSTGRES_URL is not set")
    with fresh_postgres_database(request.getfixturevalue("postgres_server_url")) as url:
        yield url


def plan(seed: int = 5) -> list[list[dict[str, Any]]]:
    """Batches per interval. 1: cmp-1's agent restarted, vm-1 again with a larger flavor; 2:
    cmp-3 down; 3: vm-5 moves cmp-1 → cmp-2; 4: nobody reports. vm-9 on cmp-3 stays idle
    (its ceded share is credited only as far as vm-6 uses it); vm-3 has a disk QoS limit;
    the VMs of :data:`CREATED` say when they were created."""
    rng = np.random.default_rng(seed)
    placement = {
        "cmp-1": ["vm-1", "vm-2", "vm-5"],
        "cmp-2": ["vm-3", "vm-4", "vm-7", "vm-8"],
        "cmp-3": ["vm-6", "vm-9"],
    }
    out: list[list[dict[str, Any]]] = []
    for k in range(N_INTERVALS):
        start = FIRST + k * INTERVAL_S
        if k == 3:
            placement["cmp-1"].remove("vm-5")
            placement["cmp-2"].append("vm-5")
        batches = []
        for name, (spec, _owner) in HOSTS.items():
            if (k == 2 and name == "cmp-3") or k == 4:
                continue
            uuids = placement[name]
            vms = random_vms(rng, spec, uuids, [OWNER[u] for u in uuids])
            for vm in vms:
                if vm["uuid"] == "vm-9":
                    vm.update(dict.fromkeys(("cpu_s", "disk_read_bytes", "network_tx_bytes"), 0.0))
                    vm["memory_byte_s"] = 1e8 * INTERVAL_S
                    vm["flavor"] = {"vcpus": 2.0, "memory_bytes": 8e9}
                if vm["uuid"] == "vm-6":
                    vm["cpu_s"] = 3.5 * INTERVAL_S
                    vm["flavor"] = {"vcpus": 1.0, "memory_bytes": 2e9}
                if vm["uuid"] == "vm-3":
                    vm["flavor"] = {**vm["flavor"], "disk_bytes_per_s": 50e6}
                if vm["uuid"] in CREATED:
                    vm["created_s"] = CREATED[vm["uuid"]]
            batches.append(batch(spec, start, vms))
            if k == 1 and name == "cmp-1":
                again = random_vms(rng, spec, ["vm-1"], [OWNER["vm-1"]])
                again[0]["flavor"] = {"vcpus": 4.0, "memory_bytes": 16e9}
                batches.append(batch(spec, start, again, key=f"{name}:{start}:restarted"))
        out.append(batches)
    return out


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/samples", json=body, headers=auth(body["host"]))
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def build_ledger(url: str, accounting: dict[str, Any]) -> sa.Engine:
    """The scenario posted to a real daemon and accounted by gmd: intervals 0-2 first, then a
    reset of proj-a and a late batch for interval 2, then the rest. Returns an engine on it."""
    config = make_config(
        url,
        {name: owner for name, (_spec, owner) in HOSTS.items()},
        organizations={"customers": {"lab": "proj-lab"}},
        accounting={"interval_s": INTERVAL_S, "grace_s": 0, **accounting},
    )
    with serving(config) as d:
        for batches in plan():
            for body in batches:
                assert post(d.url, body)["late"] == 0
        first = account_due(d.engine, config.accounting, now_s=FIRST + 3 * INTERVAL_S)
        assert first.accounted == [FIRST + k * INTERVAL_S for k in range(3)]
        reset = reset_balance(d.engine, "proj-a", "soak oracle test", "pytest")
        assert reset.effective_start_s == FIRST + 3 * INTERVAL_S
        late = random_vms(np.random.default_rng(1), HOSTS["cmp-3"][0], ["vm-6"], ["proj-a"])
        body = batch(HOSTS["cmp-3"][0], FIRST + 2 * INTERVAL_S, late)
        assert post(d.url, body)["late"] == 1
        rest = account_due(d.engine, config.accounting)
        assert rest.accounted[: N_INTERVALS - 3] == [FIRST + k * INTERVAL_S for k in range(3, 6)]
    return sa.create_engine(url)


def ledger_figures(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT i.start_s, c.name, l.greediness, l.balance FROM customer_ledger l"
                    " JOIN intervals i ON i.id = l.interval_id"
                    " JOIN customers c ON c.id = l.customer_id ORDER BY i.start_s, c.name"
                )
            )
        )


@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_oracle_agrees_with_every_figure_gmd_wrote(database_url: str, name: str) -> None:
    accounting = SETTINGS[name]
    engine = build_ledger(database_url, accounting)
    try:
        rows = ledger_figures(engine)
        # The comparison is of real numbers: someone greedy, someone credited, a reset, a gap.
        assert max(r.greediness for r in rows) > 0
        assert min(r.greediness for r in rows) < 0
        assert {r.start_s for r in rows} == {FIRST + k * INTERVAL_S for k in (0, 1, 2, 3, 5)}
        checked, mismatches = recompute(engine, Accounting.from_config({"accounting": accounting}))
        assert mismatches == []
        assert checked > 200
    finally:
        engine.dispose()


def sample_of(conn: sa.Connection, start_s: int, uuid: str) -> tuple[int, int, int]:
    """(interval id, batch id, VM id) of the VM named ``uuid`` in the scenario."""
    from tests.support.daemon_support import as_uuid

    row = conn.execute(
        sa.text(
            "SELECT s.interval_id, s.batch_id, s.vm_id FROM samples s"
            " JOIN vms v ON v.id = s.vm_id JOIN intervals i ON i.id = s.interval_id"
            " WHERE v.uuid = :u AND i.start_s = :s"
        ),
        {"u": as_uuid(uuid), "s": start_s},
    ).one()
    return int(row[0]), int(row[1]), int(row[2])


def test_the_oracle_names_an_altered_balance_and_an_altered_sample(database_url: str) -> None:
    engine = build_ledger(database_url, {})
    settings = Accounting()
    at = FIRST + INTERVAL_S
    try:
        with engine.begin() as conn:
            interval_id, batch_id, vm_id = sample_of(conn, at, "vm-7")
            customer_id = conn.execute(
                sa.text("SELECT id FROM customers WHERE name = 'proj-b'")
            ).scalar_one()
            assert OWNER["vm-7"] == "proj-b"
            where = {"i": interval_id, "c": customer_id}
            original = conn.execute(
                sa.text(
                    "SELECT balance FROM customer_ledger WHERE interval_id = :i"
                    " AND customer_id = :c"
                ),
                where,
            ).scalar_one()
            conn.execute(
                sa.text(
                    "UPDATE customer_ledger SET balance = balance + 1e-6"
                    " WHERE interval_id = :i AND customer_id = :c"
                ),
                where,
            )
        _checked, mismatches = recompute(engine, settings)
        assert len(mismatches) == 1
        (found,) = mismatches
        assert (found.interval_start_s, found.what, found.key) == (at, "balance", "customer proj-b")
        assert found.ledger is not None and found.recomputed is not None
        assert found.ledger - found.recomputed == pytest.approx(1e-6, rel=1e-6)

        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE customer_ledger SET balance = :b WHERE interval_id = :i"
                    " AND customer_id = :c"
                ),
                {**where, "b": original},
            )
        assert recompute(engine, settings)[1] == []

        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                statement = (
                    "UPDATE sample_batches SET cpu_s[array_position(vm_id, :v)] ="
                    " cpu_s[array_position(vm_id, :v)] + 120"
                    " WHERE interval_id = :i AND batch_id = :b"
                )
            else:
                statement = (
                    "UPDATE samples SET cpu_s = cpu_s + 120"
                    " WHERE interval_id = :i AND batch_id = :b AND vm_id = :v"
                )
            assert (
                conn.execute(
                    sa.text(statement), {"i": interval_id, "b": batch_id, "v": vm_id}
                ).rowcount
                == 1
            )
        _checked, mismatches = recompute(engine, settings)
        off = {(m.interval_start_s, m.what, m.key) for m in mismatches}
        assert (at, "greediness", "customer proj-b") in off
        assert (at, "term", "customer proj-b cpu") in off
        # Nothing is reported before the altered interval.
        assert min(m.interval_start_s for m in mismatches) == at
        assert all(isinstance(m, Mismatch) for m in mismatches)
    finally:
        engine.dispose()


def test_the_oracle_imports_nothing_of_gmd() -> None:
    """Independent means sharing no code with the engine it checks."""
    tree = ast.parse(Path(soak_oracle.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert not [m for m in imported if m.split(".")[0] == "gmd"]


def test_settings_come_from_the_toml_document_with_gmds_defaults() -> None:
    assert Accounting.from_config({}) == Accounting()
    custom = Accounting.from_config(
        {"accounting": {"half_life_s": "none", "utility": "ψ", "weights": {"cpu": 2}}}
    )
    assert custom.half_life_s == float("inf") and custom.utility == "psi"
    assert custom.weight("cpu") == 2.0 and custom.weight("memory") == 1.0
    with pytest.raises(ValueError, match="consumer"):
        Accounting.from_config({"accounting": {"consumer": "host"}})
