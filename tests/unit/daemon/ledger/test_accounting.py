"""Accounting end to end: samples posted over HTTP for 3 hosts × several intervals give ledger
rows equal to what the engine computes on the same numbers, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import httpx
import numpy as np
import pytest
import sqlalchemy as sa

from gmd.daemon.config import Config
from gmd.daemon.ledger.accounting import account_due, compute_rows
from gmd.fairness.cloud import CloudInterval, cloud_greediness
from gmd.fairness.decay import decay_factor
from gmd.fairness.directcontr import DirectContrBalances, directcontr_update, normalized_work
from tests.support.daemon_support import (
    INTERVAL_S,
    HostSpec,
    aligned_past,
    auth,
    batch,
    make_config,
    random_vms,
    serving,
)

HOSTS = {
    "cmp-1": (HostSpec("cmp-1", cpu_cores=8, memory_bytes=32e9), "operator"),
    "cmp-2": (HostSpec("cmp-2", cpu_cores=16), "lab"),
    "cmp-3": (HostSpec("cmp-3", cpu_cores=4, memory_bytes=16e9), "operator"),
}
CUSTOMERS = ["proj-a", "proj-b", "proj-c", "proj-lab"]
N_INTERVALS = 5


def scenario(seed: int = 7) -> list[tuple[int, list[dict[str, Any]]]]:
    """Batches per interval. cmp-3 is down in interval 2; vm-5 moves cmp-1 → cmp-2 at 3;
    interval 4 has no samples at all (every agent down)."""
    rng = np.random.default_rng(seed)
    first = aligned_past(N_INTERVALS + 2)
    placement = {
        "cmp-1": ["vm-1", "vm-2", "vm-5"],
        "cmp-2": ["vm-3", "vm-4", "vm-6", "vm-7"],
        "cmp-3": ["vm-8", "vm-9"],
    }
    owner = {f"vm-{i}": CUSTOMERS[(i * 3) % 4] for i in range(1, 10)}
    out = []
    for k in range(N_INTERVALS):
        start = first + k * INTERVAL_S
        if k == 3:
            placement["cmp-1"].remove("vm-5")
            placement["cmp-2"].append("vm-5")
        batches = []
        for name, (spec, _owner) in HOSTS.items():
            if (k == 2 and name == "cmp-3") or k == 4:
                continue
            uuids = placement[name]
            batches.append(
                batch(spec, start, random_vms(rng, spec, uuids, [owner[u] for u in uuids]))
            )
        out.append((start, batches))
    return out


def config_for(url: str) -> Config:
    return make_config(
        url,
        {name: owner for name, (_spec, owner) in HOSTS.items()},
        organizations={"customers": {"lab": "proj-lab"}},
        accounting={"interval_s": INTERVAL_S, "grace_s": 0, "half_life_s": 3600, "gamma": 0.5},
    )


def expected(config: Config, plan: list[tuple[int, list[dict[str, Any]]]]) -> dict[int, Any]:
    """The engine on the posted numbers, computed here without the database."""
    acc = config.accounting
    accounts = [*CUSTOMERS, "operator"]  # lab shares proj-lab's account
    org_account = {"operator": 4, "lab": CUSTOMERS.index("proj-lab")}
    balance = np.zeros(len(CUSTOMERS))
    dc = DirectContrBalances.zeros(len(accounts), acc.utility)
    prev_start = None
    out = {}
    for start, batches in plan:
        if not batches:
            continue
        use, configured, host_of, cust_of, supply, provider = [], [], [], [], [], []
        for h, b in enumerate(batches):
            cap = b["capacity"]
            supply.append(
                [
                    cap[k] * INTERVAL_S
                    for k in (
                        "cpu_cores",
                        "memory_bytes",
                        "disk_bytes_per_s",
                        "network_bytes_per_s",
                    )
                ]
            )
            for v in b["vms"]:
                use.append(
                    [
                        v["cpu_s"],
                        v["memory_byte_s"],
                        v["disk_read_bytes"] + v["disk_write_bytes"],
                        v["network_rx_bytes"] + v["network_tx_bytes"],
                    ]
                )
                f = v["flavor"]
                configured.append(
                    [
                        f.get("vcpus", np.nan) * INTERVAL_S,
                        f.get("memory_bytes", np.nan) * INTERVAL_S,
                        np.nan,
                        np.nan,
                    ]
                )
                host_of.append(h)
                cust_of.append(CUSTOMERS.index(v["customer"]))
                provider.append(org_account[HOSTS[b["host"]][1]])
        result = cloud_greediness(
            CloudInterval(
                use=use,
                supply=supply,
                host_of_vm=host_of,
                customer_of_vm=cust_of,
                n_customers=len(CUSTOMERS),
                configured=configured,
            ),
            gamma=acc.gamma,
            endowment=acc.endowment,
        )
        elapsed = 0 if prev_start is None else start - prev_start
        balance = balance * decay_factor(elapsed, acc.half_life_s) + result.customer_greediness
        work = normalized_work(np.array(use), result.share)
        dc = directcontr_update(
            dc,
            work,
            cust_of,
            provider,
            interval_start_s=start,
            interval_s=elapsed,
            half_life_s=acc.half_life_s,
        )
        vms = np.bincount(cust_of, minlength=len(CUSTOMERS))
        out[start] = {
            "customers": {
                c: {
                    "greediness": result.customer_greediness[i],
                    "balance": balance[i],
                    "utility": dc.utility()[i],
                    "priority": dc.priority()[i],
                    "vms": vms[i],
                    "terms": dict(zip(acc.resources, result.customer_terms[i], strict=True)),
                }
                for i, c in enumerate(CUSTOMERS)
            },
            "organizations": {
                o: {"contribution": dc.contribution()[a], "priority": dc.priority()[a]}
                for o, a in org_account.items()
            },
        }
        prev_start = start
    return out


def ledger(engine: sa.Engine) -> dict[int, Any]:
    out: dict[int, Any] = defaultdict(lambda: {"customers": {}, "organizations": {}})
    with engine.connect() as conn:
        for r in conn.execute(
            sa.text(
                "SELECT i.start_s, c.name, l.greediness, l.balance, l.utility, l.priority, l.vms"
                " FROM customer_ledger l JOIN intervals i ON i.id = l.interval_id"
                " JOIN customers c ON c.id = l.customer_id"
            )
        ):
            out[r[0]]["customers"][r[1]] = dict(
                zip(("greediness", "balance", "utility", "priority", "vms"), r[2:], strict=True),
                terms={},
            )
        for r in conn.execute(
            sa.text(
                "SELECT i.start_s, c.name, t.resource, t.term FROM customer_resource_ledger t"
                " JOIN intervals i ON i.id = t.interval_id JOIN customers c ON c.id = t.customer_id"
            )
        ):
            out[r[0]]["customers"][r[1]]["terms"][r[2]] = r[3]
        for r in conn.execute(
            sa.text(
                "SELECT i.start_s, o.name, l.contribution, l.priority FROM organization_ledger l"
                " JOIN intervals i ON i.id = l.interval_id"
                " JOIN organizations o ON o.id = l.organization_id"
            )
        ):
            out[r[0]]["organizations"][r[1]] = {"contribution": r[2], "priority": r[3]}
    return dict(out)


def close(a: float, b: float) -> bool:
    return a == pytest.approx(b, rel=1e-12, abs=1e-15)


def test_ledger_rows_equal_the_engine_on_the_posted_numbers(database_url: str) -> None:
    config = config_for(database_url)
    plan = scenario()
    with serving(config) as d:
        for _start, batches in plan:
            for b in batches:
                r = httpx.post(f"{d.url}/v1/samples", json=b, headers=auth(b["host"]))
                assert r.status_code == 200, r.text
        # a retried batch changes nothing
        b = plan[1][1][0]
        assert (
            httpx.post(f"{d.url}/v1/samples", json=b, headers=auth(b["host"])).json()["status"]
            == "duplicate"
        )
        report = account_due(d.engine, config.accounting)
        assert report.accounted[:N_INTERVALS] == [s for s, _ in plan]
        got = ledger(d.engine)
        want = expected(config, plan)

        assert set(got) == set(want)  # the empty interval has no rows
        for start, w in want.items():
            g = got[start]
            assert set(g["customers"]) == set(w["customers"])
            for c, wc in w["customers"].items():
                gc = g["customers"][c]
                for key in ("greediness", "balance", "utility", "priority"):
                    assert close(gc[key], wc[key]), (start, c, key, gc[key], wc[key])
                assert gc["vms"] == wc["vms"]
                if wc["vms"]:
                    assert gc["terms"].keys() == wc["terms"].keys()
                    assert all(close(gc["terms"][r], wc["terms"][r]) for r in wc["terms"])
            for o, wo in w["organizations"].items():
                for key in ("contribution", "priority"):
                    assert close(g["organizations"][o][key], wo[key]), (start, o, key)

        # Someone was greedy and someone was credited, so the check above compared real numbers.
        last = want[plan[3][0]]["customers"]
        assert max(c["greediness"] for c in last.values()) > 0
        assert min(c["greediness"] for c in last.values()) < 0

        with d.engine.connect() as conn:
            states = conn.execute(
                sa.text("SELECT start_s, state, ledger_rows FROM intervals ORDER BY start_s")
            ).all()
        assert [(s, st) for s, st, _ in states][:N_INTERVALS] == [(s, "accounted") for s, _ in plan]
        assert states[4][2] == 0


def test_accounting_an_interval_again_gives_identical_rows(database_url: str) -> None:
    config = config_for(database_url)
    with serving(config) as d:
        for _start, batches in scenario(seed=11):
            for b in batches:
                httpx.post(f"{d.url}/v1/samples", json=b, headers=auth(b["host"]))
        account_due(d.engine, config.accounting)
        with d.engine.connect() as conn:
            ids = conn.execute(sa.text("SELECT id FROM intervals ORDER BY start_s")).scalars().all()
            for interval_id in ids:
                again = compute_rows(conn, interval_id, config.accounting)
                stored = [
                    dict(r._mapping)
                    for r in conn.execute(
                        sa.text(
                            "SELECT * FROM customer_ledger WHERE interval_id = :i"
                            " ORDER BY customer_id"
                        ),
                        {"i": interval_id},
                    )
                ]
                assert sorted(again.customers, key=lambda r: r["customer_id"]) == stored
                stored_orgs = [
                    dict(r._mapping)
                    for r in conn.execute(
                        sa.text(
                            "SELECT * FROM organization_ledger WHERE interval_id = :i"
                            " ORDER BY organization_id"
                        ),
                        {"i": interval_id},
                    )
                ]
                assert sorted(again.organizations, key=lambda r: r["organization_id"]) == (
                    stored_orgs
                )


def test_missed_intervals_are_accounted_when_the_daemon_comes_back(database_url: str) -> None:
    """Samples arrive while no accountant runs (daemon down, or an ingest-only daemon); the next
    daemon with an accountant accounts every interval in order, gaps included."""
    config = config_for(database_url)
    plan = scenario(seed=3)
    with serving(config, accountant=False) as d:
        for _start, batches in plan:
            for b in batches:
                httpx.post(f"{d.url}/v1/samples", json=b, headers=auth(b["host"]))
        with d.engine.connect() as conn:
            assert (
                conn.execute(
                    sa.text("SELECT count(*) FROM intervals WHERE state = 'accounted'")
                ).scalar_one()
                == 0
            )
    with serving(config, accountant=True) as d:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with d.engine.connect() as conn:
                pending = conn.execute(
                    sa.text(
                        "SELECT count(*) FROM intervals WHERE state != 'accounted'"
                        " AND start_s + length_s <= :now"
                    ),
                    {"now": time.time()},
                ).scalar_one()
                accounted = conn.execute(
                    sa.text("SELECT count(*) FROM intervals WHERE state = 'accounted'")
                ).scalar_one()
            if pending == 0 and accounted >= N_INTERVALS:
                break
            time.sleep(0.1)
        assert pending == 0 and accounted >= N_INTERVALS
        metrics = httpx.get(f"{d.url}/metrics").text
        assert f"gmd_accounting_intervals_total {float(accounted)}" in metrics
        got = ledger(d.engine)
    want = expected(config, plan)
    for start, w in want.items():
        for c, wc in w["customers"].items():
            assert close(got[start]["customers"][c]["balance"], wc["balance"])
