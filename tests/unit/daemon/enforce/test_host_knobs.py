"""Issue 42, the daemon's side: a host tells what it can set (``PUT
/v1/hosts/{host}/capabilities``), the plans are made with it, and its reports keep each
knob's outcome. On the two hosts of tests/support/contention.py (cmp-idle: a disk of 1 MB/s
that a's VM reads at 90 %), with the levels' own disk caps off, so that what lands on the
disk is what stands in for the weight: at level 2 (weight factor 0.25) against two
neighbours of normal weight, a proportional scheduler would give a's VM 0.25 / (0.25 + 2) of
the disk when all three want it, and that is its limit where the host has no disk weight.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from gmd.daemon.config import load
from gmd.wire import HostCapabilities, HostPlan, Knob
from tests.support.contention import (
    BUSY,
    FIRST,
    IDLE,
    account,
    busy_vms,
    fetch,
    idle_vms,
    post,
    write_config,
)
from tests.support.daemon_support import INTERVAL_S, as_uuid, auth, cpu_only, serving

NO_BFQ = "no proportional I/O scheduler on nvme0n1 (running none): a disk weight would do nothing"


def capabilities(**unsupported: str) -> dict[str, Any]:
    return {
        "backend": "libvirt",
        "cgroup": "v2",
        "schedulers": {"nvme0n1": "none"},
        "knobs": [
            {
                "knob": k.value,
                "support": "unsupported" if k.value in unsupported else "supported",
                "via": "",
                "reason": unsupported.get(k.value, ""),
            }
            for k in Knob
        ],
        "probed_s": 1_800_000_000,
    }


def configured(tmp_path: Path, url: str, fallback: str | None = None) -> Any:
    path = write_config(tmp_path / "gmd.toml", url)
    text = path.read_text().replace(
        "disk_caps_bytes_per_s = [0, 200000, 200000]", "disk_caps_bytes_per_s = [0, 0, 0]"
    )
    if fallback is not None:
        text = text.replace(
            "[enforcement]\n", f'[enforcement]\ndisk_weight_fallback = "{fallback}"\n'
        )
    path.write_text(text)
    return load(path)


def crowded_idle_host() -> list[dict[str, Any]]:
    """cmp-idle with a's disk reader and two of b's VMs beside it."""
    return [*idle_vms(b_cpu_s=1.0), cpu_only("vm-b3", "b", 1.0, vcpus=1.0)]


def climb(d: Any, config: Any) -> None:
    for k in range(3):
        post(d, BUSY, FIRST + k * INTERVAL_S, busy_vms())
        post(d, IDLE, FIRST + k * INTERVAL_S, crowded_idle_host())
    account(d, config, FIRST + 3 * INTERVAL_S)


def put(d: Any, host: str, body: Any, as_host: str | None = None) -> httpx.Response:
    return httpx.put(
        f"{d.url}/v1/hosts/{host}/capabilities", json=body, headers=auth(as_host or host)
    )


def mine(plan: HostPlan) -> Any:
    (item,) = [v for v in plan.vms if v.uuid == as_uuid("vm-a2")]
    return item


def test_without_a_disk_weight_a_limit_of_the_weights_share_stands_in(
    database_url: str, tmp_path: Path
) -> None:
    config = configured(tmp_path, database_url)
    with serving(config) as d:
        climb(d, config)
        before = mine(fetch(d, IDLE))
        assert (before.level, before.io_weight, before.disk_read_bytes_per_s) == (2, 25, None)
        answer = put(d, IDLE.name, capabilities(disk_weight=NO_BFQ))
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"host": IDLE.name, "changed": True}
        assert put(d, IDLE.name, capabilities(disk_weight=NO_BFQ)).json()["changed"] is False
        plan = fetch(d, IDLE)
        busy = fetch(d, BUSY)  # said nothing: planned as before
    item = mine(plan)
    share = 0.25 / (0.25 + 2) * IDLE.disk_bytes_per_s
    assert item.io_weight == 100  # no weight asked where it would do nothing
    assert item.cpu_weight == 25
    assert item.disk_read_bytes_per_s == pytest.approx(share)
    assert item.disk_write_bytes_per_s == pytest.approx(share)
    stand_in = [c for c in plan.caps if c.resource == "disk_weight"]
    assert [(c.applied, c.reason) for c in stand_in] == [(True, "unsupported")]
    assert stand_in[0].why.startswith(f"disk weight unsupported on this host ({NO_BFQ})")
    assert "held by a disk limit of the weight's share" in stand_in[0].why
    assert [v.io_weight for v in busy.vms] == [25]
    assert all(c.resource != "disk_weight" for c in busy.caps)


def test_weights_only_says_disk_throttling_is_unavailable(
    database_url: str, tmp_path: Path
) -> None:
    config = configured(tmp_path, database_url, fallback="none")
    with serving(config) as d:
        climb(d, config)
        assert put(d, IDLE.name, capabilities(disk_weight=NO_BFQ)).status_code == 200
        plan = fetch(d, IDLE)
    item = mine(plan)
    assert (item.io_weight, item.disk_read_bytes_per_s, item.disk_write_bytes_per_s) == (
        100,
        None,
        None,
    )
    (stand_in,) = [c for c in plan.caps if c.resource == "disk_weight"]
    assert not stand_in.applied
    assert "disk throttling unavailable here (disk_weight_fallback = none)" in stand_in.why


def test_a_cap_the_host_cannot_set_is_withheld_and_said(database_url: str, tmp_path: Path) -> None:
    config = configured(tmp_path, database_url)
    with serving(config) as d:
        climb(d, config)
        assert put(d, BUSY.name, capabilities(cpu_cap="no cpu.max (cgroup v2)")).status_code == 200
        plan = fetch(d, BUSY)
    (item,) = plan.vms
    assert item.cpu_quota_cores is None and item.cpu_weight == 25
    cpu = next(c for c in plan.caps if c.resource == "cpu")
    assert (cpu.applied, cpu.reason) == (False, "unsupported")
    assert cpu.why == "not applied: cpu: this host cannot set the cap (no cpu.max (cgroup v2))"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({**capabilities(), "knobs": [{"knob": "cpu_speed", "support": "supported"}]}, "knob"),
        ({**capabilities(), "knobs": [{"knob": "cpu_cap", "support": "maybe"}]}, "support"),
        ({**capabilities(), "schedulers": {f"sd{k}": "none" for k in range(300)}}, "schedulers"),
        ({**capabilities(), "extra": 1}, "extra"),
        ({**capabilities(), "probed_s": -1}, "probed_s"),
        ([1, 2], ""),
    ],
)
def test_malformed_capabilities_are_refused_with_where(
    database_url: str, tmp_path: Path, body: Any, where: str
) -> None:
    config = configured(tmp_path, database_url)
    with serving(config) as d:
        answer = put(d, IDLE.name, body)
    assert answer.status_code == 422, answer.text
    assert where in answer.text


def test_a_host_speaks_only_for_itself(database_url: str, tmp_path: Path) -> None:
    config = configured(tmp_path, database_url)
    with serving(config) as d:
        answer = put(d, IDLE.name, capabilities(disk_weight=NO_BFQ), as_host=BUSY.name)
        not_json = httpx.put(
            f"{d.url}/v1/hosts/{IDLE.name}/capabilities",
            content=b"\xff{",
            headers={**auth(IDLE.name), "content-type": "application/json"},
        )
    assert answer.status_code == 403, answer.text
    assert 400 <= not_json.status_code < 500, not_json.text


def test_a_report_keeps_each_knobs_outcome(database_url: str, tmp_path: Path) -> None:
    config = configured(tmp_path, database_url)
    with serving(config) as d:
        climb(d, config)
        report = {
            "generated_s": FIRST,
            "results": [
                {
                    "uuid": as_uuid("vm-a2"),
                    "action": "apply",
                    "ok": True,
                    "before": {"cpu_shares": 1024},
                    "after": {"cpu_shares": 256},
                    "knobs": [
                        {"knob": "cpu_weight", "outcome": "applied", "detail": ""},
                        {"knob": "disk_weight", "outcome": "unsupported", "detail": NO_BFQ},
                    ],
                }
            ],
        }
        answer = httpx.post(
            f"{d.url}/v1/plan/{IDLE.name}/report", json=report, headers=auth(IDLE.name)
        )
        assert answer.status_code == 200, answer.text
        scraped = httpx.get(f"{d.url}/metrics").text
        with d.engine.connect() as c:
            row = c.execute(
                sa.text(
                    "SELECT status, knobs, reason FROM enforcement_actions"
                    " WHERE kind = 'host_apply' ORDER BY id DESC"
                )
            ).first()
        from gmd.daemon.reports.standings import standings

        with d.engine.connect() as c:
            rows = {r["customer"]: r for r in standings(c, enforcement=config.enforcement).rows}
    assert (rows["a"]["enforced"], rows["a"]["enforced_why"]) == (
        "applied",
        "1 of 2 running VM(s) reported throttled; disk weight unsupported on 1",
    )
    assert row is not None
    assert row.status == "ok"
    assert json.loads(row.knobs) == {
        "cpu_weight": ["applied", ""],
        "disk_weight": ["unsupported", NO_BFQ],
    }
    assert row.reason.startswith(f"disk weight not supported on this host: {NO_BFQ}")
    counted = 'gmd_enforcement_host_knobs_total{knob="%s",outcome="%s"} 1.0'
    assert counted % ("disk_weight", "unsupported") in scraped
    assert counted % ("cpu_weight", "applied") in scraped
    assert 'gmd_enforcement_host_knobs_total{knob="cpu_cap",outcome="failed"} 0.0' in scraped


def test_the_wire_model_reads_what_the_agent_sends() -> None:
    caps = HostCapabilities.model_validate(capabilities(disk_weight=NO_BFQ))
    assert caps.unsupported() == {Knob.disk_weight: NO_BFQ}
    assert HostCapabilities.model_validate_json(caps.model_dump_json()) == caps


def test_hosts_lists_each_hosts_knobs_for_operators(database_url: str, tmp_path: Path) -> None:
    import subprocess

    from gmd.daemon.reports.host_knobs import hosts
    from tests.support.daemon_support import GMD_ADMIN, gmd_admin

    config = configured(tmp_path, database_url)
    with serving(config) as d:
        climb(d, config)
        assert put(d, IDLE.name, capabilities(disk_weight=NO_BFQ)).status_code == 200
        assert put(d, "cmp-new", capabilities(), as_host=IDLE.name).status_code == 403
        with d.engine.connect() as c:
            rows = hosts(c)
    assert [r["host"] for r in rows] == [BUSY.name, IDLE.name]
    busy, idle = rows
    assert {k.value: busy[k.value] for k in Knob} == dict.fromkeys((k.value for k in Knob), "?")
    assert {k.value: idle[k.value] for k in Knob} == {
        "cpu_weight": "yes",
        "cpu_cap": "yes",
        "disk_weight": "no",
        "disk_limit": "yes",
        "network_limit": "yes",
    }
    assert idle["missing"] == f"disk_weight: {NO_BFQ}"
    assert idle["disks"] == "nvme0n1 [none]" and idle["owner"] == "operator"
    shown = gmd_admin(tmp_path / "gmd.toml", "hosts")
    assert [h["host"] for h in shown["hosts"]] == [BUSY.name, IDLE.name]
    assert shown["hosts"][1]["capabilities"]["knobs"][2]["reason"] == NO_BFQ
    assert shown["hosts"][0]["capabilities"] is None
    missing = subprocess.run(
        [str(GMD_ADMIN), "--config", str(tmp_path / "gmd.toml"), "hosts", "no-such-host"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 3, missing.stderr
    assert missing.stderr.strip().splitlines() == [
        "gmd-admin: error: no host 'no-such-host' in the ledger,"
        " and none by that name said its knobs"
    ]


def test_explain_says_where_a_host_has_no_disk_weight(database_url: str, tmp_path: Path) -> None:
    from gmd.daemon.reports.explain import explain
    from gmd.daemon.reports.explanation import summary_lines

    config = configured(tmp_path, database_url)
    with serving(config) as d:
        climb(d, config)
        assert put(d, IDLE.name, capabilities(disk_weight=NO_BFQ)).status_code == 200
        with d.engine.connect() as c:
            e = explain(c, config, "a")
    assert {c.host: c.disk_weight for c in e.caps} == {BUSY.name: True, IDLE.name: False}
    done = summary_lines(e)[2]
    assert done.startswith(
        f"On its hosts: CPU weights × 0.25 on {BUSY.name}, {IDLE.name}, I/O weights on {BUSY.name}"
    ), done
    assert f"no disk weight on {IDLE.name}, whose disks no proportional I/O scheduler runs" in done
