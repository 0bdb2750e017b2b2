"""Project names beside the uuids: from the Nova metadata an agent read, until Keystone's (read
by the daemon, tests/cloud/test_openstack_names.py) replace them; shown by every gmd-admin view and
accepted wherever a customer is named. The uuid stays the key of JSON and CSV."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from gmd.admin.explain_text import render_text
from gmd.daemon.config import Config
from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.ledger.lookup import UnknownCustomer, customer_id
from gmd.daemon.project_names import store_names
from gmd.daemon.reports.explain import explain
from gmd.daemon.reports.series import collect
from gmd.daemon.reports.usage import report
from tests.support.daemon_support import (
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
)

ADMIN = Path(sys.executable).with_name("gmd-admin")
HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
ACME = "7f3e1c2b9a8d4e5f6a7b8c9d0e1f2a3b"
INITECH = "11112222333344445555666677778888"
NAMELESS = "99990000999900009999000099990000"


def post(d: Any, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name))


def named_batch(start: int, names: dict[str, str]) -> dict[str, Any]:
    vms = [
        cpu_only("vm-a", ACME, 90.0),
        cpu_only("vm-i", INITECH, 20.0),
        cpu_only("vm-n", NAMELESS, 10.0),
    ]
    return {**batch(HOST, start, vms), "customer_names": names}


def shown(d: Any) -> dict[str, tuple[str | None, str | None]]:
    with d.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT name, display_name, display_source FROM customers"))
        return {r[0]: (r[1], r[2]) for r in rows}


@pytest.fixture
def config(database_url: str) -> Config:
    return make_config(database_url, {HOST.name: "operator"}, accounting={"endowment": "equal"})


def test_names_from_the_nova_metadata_until_keystone_names_them(config: Config) -> None:
    first = aligned_past(4)
    with serving(config) as d:
        assert post(d, named_batch(first, {ACME: "acme", INITECH: "initech"})).is_success
        assert shown(d) == {
            ACME: ("acme", "nova"),
            INITECH: ("initech", "nova"),
            NAMELESS: (None, None),
        }
        # Keystone's name wins, and a later metadata name never takes it back.
        assert store_names(d.engine, {ACME: "acme-corp"}) == 1
    with serving(config) as d:  # a new daemon looks every customer up again
        assert post(d, named_batch(first + 60, {ACME: "acme", INITECH: "initech-2"})).is_success
        assert shown(d)[ACME] == ("acme-corp", "keystone")
        assert shown(d)[INITECH] == ("initech-2", "nova")  # renamed in Nova, not in Keystone


def test_a_name_for_a_customer_without_a_vm_in_the_batch_is_refused(config: Config) -> None:
    with serving(config) as d:
        body = named_batch(aligned_past(3), {"someone-else": "x"})
        response = post(d, body)
        assert response.status_code == 422, response.text
        assert "'someone-else', which owns no VM of this batch" in response.text
        hidden = post(d, named_batch(aligned_past(3), {ACME: "acme\u202egnp"}))
        assert hidden.status_code == 422
        assert "U+202E" in hidden.text
        assert shown(d) == {}  # nothing stored from either


@pytest.fixture
def ledger(config: Config, tmp_path: Path) -> tuple[Config, Path]:
    first = aligned_past(4)
    with serving(config) as d:
        for k in range(2):
            body = named_batch(first + 60 * k, {ACME: "acme", INITECH: "initech"})
            assert post(d, body).is_success
        account_due(d.engine, config.accounting, now_s=first + 120)
    path = tmp_path / "gmd.toml"
    path.write_text(f'[database]\nurl = "{config.database_url}"\n')
    return config, path


def test_every_view_shows_the_name_beside_the_uuid(ledger: tuple[Config, Path]) -> None:
    config, _ = ledger
    engine = sa.create_engine(config.database_url)
    # the reports' end, taken now: a module-level one was taken when pytest collected the
    # module, which a long parallel session can leave before the ledger's intervals
    end = aligned_past(-10)
    with engine.connect() as conn:
        rows = {r["customer"]: r for r in report(conn, "customer", 0, end).rows}
        assert (rows[ACME]["name"], rows[NAMELESS]["name"]) == ("acme", None)
        daily = report(conn, "day", 0, end, customer="initech").rows
        assert {(r["customer"], r["name"]) for r in daily} == {(INITECH, "initech")}

        why = explain(conn, config, "acme")
        assert (why.customer, why.name) == (ACME, "acme")  # the uuid, however it was named
        assert why.document()["customer"] == ACME
        text = render_text(why, "equal").splitlines()
        assert text[0].startswith(f"Customer {ACME} (acme) is ")  # the summary's first line
        assert text[6].startswith(f"Customer {ACME} (acme), interval")  # then the detail

        series = collect(conn, customers=["acme", NAMELESS])
        assert [series.label(c) for c in series.customers] == ["acme", NAMELESS]
    engine.dispose()


def test_the_report_table_has_a_project_column_and_csv_keeps_the_uuid(
    ledger: tuple[Config, Path],
) -> None:
    _, path = ledger

    def run(*args: str) -> str:
        done = subprocess.run(
            [str(ADMIN), "--config", str(path), "report", "--from", "now-1d", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "Project" in run() and "initech" in run()
    csv = run("--format", "csv").splitlines()
    assert csv[0].startswith("customer,name,")
    assert any(line.startswith(f"{ACME},acme,") for line in csv)
    doc = json.loads(run("--customer", "acme", "--format", "json"))
    assert [r["customer"] for r in doc["rows"]] == [ACME]


def test_a_project_name_two_customers_share_is_refused_naming_both(
    ledger: tuple[Config, Path],
) -> None:
    config, _ = ledger
    engine = sa.create_engine(config.database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE customers SET display_name = 'twin'"))
    with engine.connect() as conn:
        with pytest.raises(UnknownCustomer) as caught:
            customer_id(conn, "twin")
        assert "names 3 customers" in str(caught.value) and ACME in str(caught.value)
        # A uuid is never ambiguous, whatever the names.
        assert customer_id(conn, ACME) == customer_id(conn, ACME)
        with pytest.raises(UnknownCustomer, match="'nobody' is not in the ledger"):
            customer_id(conn, "nobody")
    engine.dispose()


def test_a_project_id_spelled_otherwise_is_the_same_customer_everywhere(config: Config) -> None:
    """A host (or a user) spelling a project id with dashes or capitals names the customer
    Keystone's spelling names: stored once, found by either spelling."""
    dashed = "7F3E1C2B-9A8D-4E5F-6A7B-8C9D0E1F2A3B"
    with serving(config) as d:
        spelled = batch(HOST, aligned_past(2), [cpu_only("vm-a", dashed, 9.0)])
        spelled["customer_names"] = {dashed: "acme"}
        assert post(d, spelled).is_success
        body = batch(HOST, aligned_past(1), [cpu_only("vm-a", ACME, 9.0)])
        assert post(d, body).is_success
        assert shown(d) == {ACME: ("acme", "nova")}
        with d.engine.connect() as conn:
            assert customer_id(conn, dashed) == customer_id(conn, ACME.upper())
            assert customer_id(conn, dashed) == customer_id(conn, ACME)
