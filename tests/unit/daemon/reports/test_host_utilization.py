"""Each host's measured utilisation over the latest accounted intervals, and a project's level
(GET /v1/hosts/utilization, for fairness-aware placement): figures worked by hand from the
batches posted, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from gmd.ledger_schema.tables import customers, levels
from tests.support.daemon_support import (
    INTERVAL_S,
    HostSpec,
    aligned_past,
    auth,
    batch,
    make_config,
    serving,
)

A = HostSpec("cmp-a", cpu_cores=4, memory_bytes=8e9, disk_bytes_per_s=1e8, network_bytes_per_s=1e9)
B = HostSpec("cmp-b", cpu_cores=2, memory_bytes=4e9, disk_bytes_per_s=1e8, network_bytes_per_s=1e9)


def vm(name: str, customer: str, cpu_cores: float, memory: float, io: float) -> dict[str, Any]:
    """A VM that kept ``cpu_cores`` busy and ``memory`` bytes resident all interval long, and
    read, wrote, received and sent ``io`` bytes per second each."""
    return {
        "uuid": name,
        "customer": customer,
        "cpu_s": cpu_cores * INTERVAL_S,
        "memory_byte_s": memory * INTERVAL_S,
        "disk_read_bytes": io * INTERVAL_S,
        "disk_write_bytes": io * INTERVAL_S,
        "network_rx_bytes": io * INTERVAL_S,
        "network_tx_bytes": io * INTERVAL_S,
    }


def test_utilisation_is_what_the_vms_used_over_what_the_hosts_offered(database_url: str) -> None:
    config = make_config(
        database_url,
        {A.name: "operator", B.name: "operator"},
        enforcement={"mode": "dry-run", "enter": [0.2, 0.4, 0.8], "leave": [0.1, 0.3, 0.6]},
        read_api={"auth": "local"},
        daemon={"bind": "127.0.0.1"},
    )
    # Oldest interval: A idle, B's two cores busy. The two newer ones: A half busy, B a quarter.
    plan = {
        3: ([vm("a1", "acme", 0.0, 2e9, 5e6)], [vm("b1", "initech", 2.0, 1e9, 0.0)]),
        2: ([vm("a1", "acme", 2.0, 2e9, 5e6)], [vm("b1", "initech", 0.5, 1e9, 0.0)]),
        1: ([vm("a1", "acme", 2.0, 2e9, 5e6)], [vm("b1", "initech", 0.5, 1e9, 0.0)]),
    }
    starts = {k: aligned_past(k + 1) for k in plan}  # once: the clock may pass a boundary
    with serving(config) as d:
        for k, (on_a, on_b) in plan.items():
            for host, vms in ((A, on_a), (B, on_b)):
                body = batch(host, starts[k], vms)
                posted = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(host.name))
                assert posted.status_code == 200, posted.text
        account_due(d.engine, config.accounting, after=after_interval(config.enforcement))
        two = httpx.get(f"{d.url}/v1/hosts/utilization", params={"intervals": 2}).json()
        three = httpx.get(
            f"{d.url}/v1/hosts/utilization", params={"intervals": 3, "project": "acme"}
        ).json()
        stranger = httpx.get(f"{d.url}/v1/hosts/utilization", params={"project": "nobody"})
        standings = httpx.get(f"{d.url}/v1/standings").json()
        odd = [
            httpx.get(f"{d.url}/v1/hosts/utilization", params=p)
            for p in ({"intervals": 0}, {"intervals": 61}, {"project": "a\x00b"})
        ]
    assert two["resources"] == ["cpu", "memory", "disk", "network"]
    assert two["intervals"] == [starts[1], starts[2]]
    assert set(two["hosts"]) == {A.name, B.name}
    assert two["hosts"][A.name]["capacity"] == A.capacity
    a, b = two["hosts"][A.name]["utilization"], two["hosts"][B.name]["utilization"]
    # A: 2 of 4 cores, 2 of 8 GB, 10 MB/s of 100 MB/s disk (read + written), 10 of 1000 network
    assert a == pytest.approx({"cpu": 0.5, "memory": 0.25, "disk": 0.1, "network": 0.01})
    assert b == pytest.approx({"cpu": 0.25, "memory": 0.25, "disk": 0.0, "network": 0.0})
    assert "project" not in two
    # Over three intervals: A (0 + 2 + 2) / (3 × 4) cores, B (2 + 0.5 + 0.5) / (3 × 2).
    assert three["hosts"][A.name]["utilization"]["cpu"] == pytest.approx(1 / 3)
    assert three["hosts"][B.name]["utilization"]["cpu"] == pytest.approx(0.5)
    level = {r["customer"]: r["level"] for r in standings["customers"]}["acme"]
    # dry-run: nothing is capped, so no cap is given
    assert three["project"] == {"id": "acme", "level": level, "cpu_cap_fraction": None}
    assert stranger.json()["project"] == {"id": "nobody", "level": 0, "cpu_cap_fraction": None}
    assert [r.status_code for r in odd] == [422, 422, 200]
    # no batch names it
    assert odd[2].json()["project"] == {"id": "a\x00b", "level": 0, "cpu_cap_fraction": None}


def test_nothing_accounted_lists_no_host(database_url: str) -> None:
    config = make_config(
        database_url,
        {A.name: "operator"},
        read_api={"auth": "local"},
        daemon={"bind": "127.0.0.1"},
    )
    with serving(config) as d:
        answer = httpx.get(f"{d.url}/v1/hosts/utilization").json()
    assert answer == {
        "resources": ["cpu", "memory", "disk", "network"],
        "intervals": [],
        "hosts": {},
    }


def test_with_enforcement_on_a_capped_projects_cap_is_given_with_its_level(
    database_url: str,
) -> None:
    """A placement expects a capped project's new VM to use at most its cap of its vCPUs: the
    route gives the cap the project's level puts on it, only when caps are applied."""
    config = make_config(
        database_url,
        {A.name: "operator"},
        enforcement={"mode": "on", "cap_level": 2, "cpu_cap_fractions": [1.0, 0.6, 0.3]},
        read_api={"auth": "local"},
        daemon={"bind": "127.0.0.1"},
    )
    with serving(config) as d:
        start = aligned_past(2)
        body = batch(A, start, [vm("a1", "acme", 1.0, 1e9, 0.0)])
        posted = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(A.name))
        assert posted.status_code == 200, posted.text
        answers = {}
        for level in (1, 2, 3):
            with d.engine.begin() as conn:
                cid = conn.execute(
                    sa.select(customers.c.id).where(customers.c.name == "acme")
                ).scalar_one()
                conn.execute(sa.delete(levels).where(levels.c.customer_id == cid))
                conn.execute(
                    sa.insert(levels).values(
                        customer_id=cid, level=level, since_s=start, score=1.0, interval_id=start
                    )
                )
            got = httpx.get(f"{d.url}/v1/hosts/utilization", params={"project": "acme"})
            answers[level] = got.json()["project"]["cpu_cap_fraction"]
    # level 1 is below cap_level: not capped; then the policy's fractions
    assert answers == {1: None, 2: 0.6, 3: 0.3}
