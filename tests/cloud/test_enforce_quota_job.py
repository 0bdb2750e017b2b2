"""Quotas follow levels: lowered when a customer reaches the quota level, the exact original
written back when it leaves, read back every time, audited; dry-run writes nothing; a cloud
that ignores quota writes is recorded and left alone. Against the real Keystone and Nova of
tests/scripts/openstack.sh; the fake only for what they cannot be made to do (a 503)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openstack
import pytest
import sqlalchemy as sa

from gmd.daemon.enforce.quota_job import QuotaReconciler
from tests.support.daemon_support import (
    serving,
)
from tests.support.fake_openstack import FakeOpenStack, write_clouds_yaml
from tests.support.openstack_support import LEGACY, UNIFIED, RealCloud
from tests.support.quota_job import config_for, drive

pytest_plugins = ("tests.support.openstack_support",)
pytestmark = pytest.mark.filterwarnings("ignore::openstack.warnings._RemovedInSDKWarning")

DEFAULT = {"cores": 20, "ram": 51200, "instances": 10}


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenStack]:
    with FakeOpenStack() as fake:
        monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(write_clouds_yaml(tmp_path, fake)))
        yield fake


def actions(d: Any) -> list[tuple[Any, ...]]:
    with d.engine.connect() as conn:
        return [
            (r[0], r[1], bool(r[2]), None if r[3] is None else json.loads(r[3]), json.loads(r[4]))
            for r in conn.execute(
                sa.text(
                    "SELECT kind, status, dry_run, before, after FROM enforcement_actions"
                    " WHERE kind LIKE 'quota%' ORDER BY id"
                )
            )
        ]


def nova_quota(cloud: str, project: str) -> dict[str, int]:
    """The project's cores, ram and instances as the real Nova answers them."""
    conn = openstack.connect(cloud=cloud, api_timeout=30)
    try:
        quota = conn.compute.get(f"/os-quota-sets/{project}", microversion="2.57").json()
        return {k: int(quota["quota_set"][k]) for k in DEFAULT}
    finally:
        conn.close()


def test_lowered_at_the_quota_level_and_restored_exactly(
    tmp_path: Path, real_cloud: RealCloud
) -> None:
    greedy, modest = real_cloud.new_project("greedy"), real_cloud.new_project("modest")
    config = config_for(tmp_path, "on", LEGACY, "nova")
    with serving(config) as d:
        job = QuotaReconciler(d.engine, config.enforcement)
        # a takes 90 of 120 core-seconds, +0.125 an interval, halved every interval (60 s
        # half-life): balances 0.125, 0.1875, 0.219, 0.234 → levels 0, 1, 2, 2
        drive(config, d, [90.0] * 4, first_ago=20, a=greedy, b=modest)
        assert job.run().lowered == 1
        # one step of 25 %: 20 → 15 cores, 51200 → 38400 MB; instances 10 → 7 floored at 8
        assert nova_quota(LEGACY, greedy) == {"cores": 15, "ram": 38400, "instances": 8}
        assert job.run().lowered == 0  # nothing new to do: no second write

        # both take their share: a's balance halves, 0.117 < leave 0.15 → level 1, 0 steps
        drive(config, d, [60.0] * 4, first_ago=16, a=greedy, b=modest)
        assert job.run().restored == 1
        assert nova_quota(LEGACY, greedy) == DEFAULT
        with d.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT * FROM quota_originals")).all() == []
        job.close()
    assert actions(d) == [
        ("quota_lower", "ok", False, {**DEFAULT}, {"cores": 15, "ram": 38400, "instances": 8}),
        ("quota_restore", "ok", False, {"cores": 15, "ram": 38400, "instances": 8}, DEFAULT),
    ]
    assert nova_quota(LEGACY, modest) == DEFAULT


def test_dry_run_reads_and_records_but_writes_nothing(
    tmp_path: Path, real_cloud: RealCloud
) -> None:
    greedy, modest = real_cloud.new_project("greedy"), real_cloud.new_project("modest")
    config = config_for(tmp_path, "dry-run", LEGACY, "nova")
    with serving(config) as d:
        job = QuotaReconciler(d.engine, config.enforcement)
        drive(config, d, [90.0] * 4, first_ago=20, a=greedy, b=modest)
        assert job.run().would == 1
        assert job.run().would == 0  # recorded once, not every run
        job.close()
        assert actions(d) == [
            ("quota_lower", "would", True, DEFAULT, {"cores": 15, "ram": 38400, "instances": 8})
        ]
    assert nova_quota(LEGACY, greedy) == DEFAULT


def test_a_cloud_that_ignores_quota_writes_is_recorded_and_left_alone(
    tmp_path: Path, real_cloud: RealCloud
) -> None:
    """backend = "nova" on a Nova with unified limits: its quota API answers 200 and changes
    nothing, which only the read-back shows."""
    greedy, modest = real_cloud.new_project("greedy"), real_cloud.new_project("modest")
    config = config_for(tmp_path, "on", UNIFIED, "nova")
    with serving(config) as d:
        job = QuotaReconciler(d.engine, config.enforcement)
        drive(config, d, [90.0] * 4, first_ago=20, a=greedy, b=modest)
        assert job.run().failed == 1
        assert job.run().failed == 1  # still wanted, but the breaker is open: no new write
        job.close()
        logged = actions(d)
    assert [(k, s) for k, s, *_ in logged] == [("quota_lower", "failed")]
    assert nova_quota(UNIFIED, greedy) == DEFAULT
    with serving(config) as d, d.engine.connect() as conn:
        reason = conn.execute(
            sa.text("SELECT reason FROM enforcement_actions WHERE kind = 'quota_lower'")
        ).scalar_one()
    assert "not_applied" in reason


def test_an_unreachable_cloud_is_retried_at_the_next_run(
    tmp_path: Path, cloud: FakeOpenStack
) -> None:
    config = config_for(tmp_path, "on")
    with serving(config) as d:
        job = QuotaReconciler(d.engine, config.enforcement)
        drive(config, d, [90.0] * 4, first_ago=20)
        cloud.fail(503, times=None, path="")
        assert job.run().failed == 1
        cloud.heal()
        assert job.run().lowered == 1
        assert cloud.quota("proj-a")["cores"] == 15
        job.close()
