"""Quota enforcement against the real Keystone, Nova and Placement of tests/scripts/openstack.sh.

Two Nova APIs share one Keystone: ``legacy`` (RegionOne, the database quota driver) and
``unified`` (RegionTwo, ``UnifiedLimitsDriver``: limits in Keystone). Every test makes its own
projects, so their quotas and limits start from the cloud's defaults.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gmd.daemon.config import Config
from gmd.daemon.enforce.keystone_limits import KeystoneLimits
from gmd.daemon.enforce.nova_quotas import NovaQuotas
from gmd.daemon.enforce.quota_backends import AutoQuotas, build_backend
from gmd.daemon.enforce.quota_job import QuotaReconciler
from gmd.daemon.enforce.quotas import (
    QuotaError,
    QuotaNotApplied,
    QuotaOriginal,
    QuotaSet,
    QuotaStep,
    lowered,
)
from gmd.daemon.enforce.settings import QuotaBackendKind
from gmd.ledger_schema.migrate import upgrade
from gmd.openstack.client import OpenStackError
from tests.support.daemon_support import make_config
from tests.support.openstack_support import LEGACY, MEMBER, UNIFIED, UNIFIED_SYSTEM, RealCloud

pytest_plugins = ("tests.support.openstack_support",)
pytestmark = pytest.mark.filterwarnings("ignore::openstack.warnings._RemovedInSDKWarning")

DEFAULTS = QuotaSet(cores=20, ram_mb=51200, instances=10)
NO_FLOOR = QuotaSet(0, 0, 0)
STEP = QuotaStep(cores=0.25, ram=0.25, instances=0.25)


# One retry, as gmd makes in production (it makes two): a CI run once saw the real Keystone
# answer one PATCH of a limit with gunicorn's bare 500. A refusal (4xx) is never retried, so
# the tests of refusals are unchanged; a failing test shows what the services logged.
RETRIES = 1


def nova(cloud: str = LEGACY) -> NovaQuotas:
    return NovaQuotas(cloud, timeout_s=30, retries=RETRIES, backoff_s=0.5)


def limits() -> KeystoneLimits:
    return KeystoneLimits(
        UNIFIED, limits_cloud=UNIFIED_SYSTEM, timeout_s=30, retries=RETRIES, backoff_s=0.5
    )


def usage(cloud: RealCloud, name: str, project: str) -> dict[str, Any]:
    """Nova's ``/detail``: limit and in_use per key, as Nova itself sees them."""
    conn = cloud.connect(name)
    try:
        response = conn.compute.get(f"/os-quota-sets/{project}/detail", microversion="2.57")
        assert response.status_code == 200, response.text
        return dict(response.json()["quota_set"])
    finally:
        conn.close()


# --- legacy quotas ------------------------------------------------------------------------


def test_greedy_project_is_lowered_below_its_usage_step_by_step_and_restored(
    real_cloud: RealCloud,
) -> None:
    project = real_cloud.new_project("greedy")
    real_cloud.add_servers("nova-legacy", project, count=4, vcpus=2, ram_mb=4096)
    with nova() as quotas:
        original = quotas.original(project)
        assert original == QuotaOriginal(DEFAULTS)
        assert quotas.microversion() == "2.57"
        for steps, cores in ((1, 15), (2, 10), (3, 5), (4, 0)):
            target = lowered(original.quota, steps, STEP, NO_FLOOR)
            assert target.cores == cores
            write = quotas.apply(project, target)
            assert write.ok and write.written and write.after == target
            detail = usage(real_cloud, LEGACY, project)
            # Nova itself holds the lowered limit, below what the project uses.
            assert detail["cores"]["limit"] == cores
            assert detail["cores"]["in_use"] == 8
            assert detail["ram"]["in_use"] == 16384
        back = quotas.restore(project, original)
        assert back.ok and back.after == DEFAULTS
    assert usage(real_cloud, LEGACY, project)["cores"] == {"limit": 20, "in_use": 8, "reserved": 0}


def test_writing_what_is_there_writes_nothing_and_one_connection_serves_every_call(
    real_cloud: RealCloud,
) -> None:
    import openstack

    project = real_cloud.new_project()
    made: list[str] = []

    def factory(**kw: Any) -> Any:
        made.append(kw["cloud"])
        return openstack.connect(**kw)

    with NovaQuotas(LEGACY, timeout_s=30, retries=0, connection_factory=factory) as quotas:
        same = quotas.apply(project, DEFAULTS)
        assert same.ok and not same.written and same.before == same.after == DEFAULTS
        assert quotas.apply(project, QuotaSet(5, 12800, 2)).written
        assert quotas.restore(project, QuotaOriginal(DEFAULTS)).after == DEFAULTS
    assert made == [LEGACY]


def test_a_quota_of_the_operators_own_is_restored_exactly(real_cloud: RealCloud) -> None:
    project = real_cloud.new_project()
    real_cloud.add_servers("nova-legacy", project, count=3, vcpus=4, ram_mb=8192)
    with nova() as quotas:
        mine = QuotaSet(cores=64, ram_mb=131072, instances=30)
        assert quotas.apply(project, mine).ok
        original = quotas.original(project)
        assert original.quota == mine
        assert quotas.apply(project, lowered(mine, 3, STEP, NO_FLOOR)).after == QuotaSet(
            16, 32768, 7
        )
        assert quotas.restore(project, original).after == mine
        assert quotas.get(project) == mine


def test_without_force_real_nova_refuses_to_go_below_usage(
    real_cloud: RealCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why every write carries ``force``: what Nova answers when it does not."""
    project = real_cloud.new_project("greedy")
    real_cloud.add_servers("nova-legacy", project, count=4, vcpus=2, ram_mb=2048)
    monkeypatch.setattr(NovaQuotas, "force", False)
    with nova() as quotas, pytest.raises(OpenStackError) as caught:
        quotas.apply(project, QuotaSet(cores=2, ram_mb=51200, instances=10))
    error = caught.value
    assert (error.kind, error.status) == ("bad_request", 400)
    assert (
        "Quota limit 2 for cores must be greater than or equal to already used and reserved 8"
        in str(error)
    )
    with nova() as quotas:
        assert quotas.get(project) == DEFAULTS


def test_real_errors_become_quota_error_kinds_with_novas_own_message(
    real_cloud: RealCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = real_cloud.new_project()
    with nova() as quotas:
        # Nova checks the project with Keystone and answers 400: gmd calls it not_found.
        with pytest.raises(OpenStackError) as caught:
            quotas.apply("0123456789abcdef0123456789abcdef", DEFAULTS)
        assert (caught.value.kind, caught.value.status) == ("not_found", 400)
        assert "is not a valid project" in str(caught.value)
        # Beyond Nova's schema (a 32-bit limit): its validation message.
        with pytest.raises(OpenStackError) as caught:
            quotas.apply(project, QuotaSet(cores=2**31, ram_mb=51200, instances=10))
        assert (caught.value.kind, caught.value.status) == ("bad_request", 400)
        assert "Invalid input for field/attribute cores" in str(caught.value)
        assert quotas.disabled_reason is None
    # A microversion the server does not serve: its 406, naming what it does serve.
    monkeypatch.setattr(NovaQuotas, "_negotiate", lambda self, conn: "2.999")
    with nova() as quotas, pytest.raises(OpenStackError) as caught:
        quotas.get(project)
    assert (caught.value.kind, caught.value.status) == ("unsupported_version", 406)
    assert "Version 2.999 is not supported by the API. Minimum is 2.1" in str(caught.value)


def test_a_wrong_password_is_unauthorized(real_cloud: RealCloud, tmp_path: Path) -> None:
    clouds = json.loads(real_cloud.clouds_yaml.read_text())
    clouds["clouds"][LEGACY]["auth"]["password"] = "wrong"
    path = tmp_path / "clouds.yaml"
    path.write_text(json.dumps(clouds))
    import os

    os.environ["OS_CLIENT_CONFIG_FILE"] = str(path)  # restored by real_cloud's monkeypatch
    with nova() as quotas, pytest.raises(OpenStackError) as caught:
        quotas.get(real_cloud.acme)
    assert (caught.value.kind, caught.value.status) == ("unauthorized", 401)


def test_the_unified_driver_ignores_legacy_writes_and_the_breaker_opens(
    real_cloud: RealCloud,
) -> None:
    project = real_cloud.new_project()
    with nova(UNIFIED) as quotas:
        with pytest.raises(QuotaNotApplied) as caught:
            quotas.apply(project, QuotaSet(5, 12800, 2))
        assert caught.value.write.after == caught.value.write.before == DEFAULTS
        assert "unified-limits" in str(caught.value)
        with pytest.raises(QuotaError) as refused:
            quotas.apply(project, QuotaSet(5, 12800, 2))
        assert refused.value.kind == "disabled"


# --- the member-only account, through the quota job ----------------------------------------


def quota_config(tmp_path: Path, cloud: str, **quota: Any) -> Config:
    return make_config(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        {"cmp-1": "operator"},
        enforcement={
            "mode": "on",
            "quota_level": 1,
            "quota": {"cloud": cloud, "timeout_s": 30, "retries": 0, **quota},
        },
        # The quotas are what is tested; host cmp-1 is made up, not one of the cloud's.
        placement={"verify": "off"},
    )


def at_level(config: Config, project: str, level: int) -> sa.Engine:
    engine = sa.create_engine(config.database_url)
    upgrade(engine)
    with engine.begin() as conn:
        cid = conn.execute(
            sa.text("INSERT INTO customers (name) VALUES (:n) RETURNING id"), {"n": project}
        ).scalar_one()
        iid = conn.execute(
            sa.text(
                "INSERT INTO intervals (start_s, length_s, state) VALUES (0, 60, 'accounted') "
                "RETURNING id"
            )
        ).scalar_one()
        conn.execute(
            sa.text(
                "INSERT INTO customer_levels (customer_id, level, since_s, score, interval_id) "
                "VALUES (:c, :l, 0, 1.0, :i)"
            ),
            {"c": cid, "l": level, "i": iid},
        )
    return engine


def set_level(engine: sa.Engine, level: int) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE customer_levels SET level = :l"), {"l": level})


def quota_rows(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT kind, status, before, after, reason FROM enforcement_actions "
                    "WHERE kind LIKE 'quota%' ORDER BY id"
                )
            )
        ]


def test_a_member_only_account_is_forbidden_and_nothing_claims_the_quota_changed(
    real_cloud: RealCloud, tmp_path: Path
) -> None:
    config = quota_config(tmp_path, MEMBER, backend="nova")
    engine = at_level(config, real_cloud.acme, 1)
    job = QuotaReconciler(engine, config.enforcement)
    run = job.run()
    job.close()
    assert (run.lowered, run.failed) == (0, 1)
    [(kind, status, before, after, reason)] = quota_rows(engine)
    assert (kind, status, before, after) == ("quota_lower", "failed", None, None)
    assert "forbidden" in reason
    assert "Policy doesn't allow os_compute_api:os-quota-sets:update to be performed" in reason
    with engine.connect() as conn:
        held = conn.execute(sa.text("SELECT steps, applied, backend FROM quota_originals")).all()
    assert [tuple(r) for r in held] == [(0, False, None)]
    with nova() as quotas:
        assert quotas.get(real_cloud.acme) == DEFAULTS


# --- unified limits -----------------------------------------------------------------------


def test_unified_limits_lowered_and_restored_by_deleting_the_limit_gmd_created(
    real_cloud: RealCloud,
) -> None:
    project = real_cloud.new_project("greedy")
    with limits() as keystone:
        original = keystone.original(project)
        assert original == QuotaOriginal(DEFAULTS, frozenset({"cores", "ram_mb", "instances"}))
        for steps in (1, 2, 3):
            target = lowered(original.quota, steps, STEP, NO_FLOOR)
            write = keystone.apply(project, target)
            assert write.ok and write.backend == QuotaBackendKind.keystone_limits
            # Keystone holds it, and the unified-limits Nova reads it.
            assert real_cloud.project_limits(project) == {
                "class:VCPU": target.cores,
                "class:MEMORY_MB": target.ram_mb,
                "servers": target.instances,
            }
            with nova(UNIFIED) as reader:
                assert reader.get(project) == target
        back = keystone.restore(project, original)
        assert back.ok and back.after == DEFAULTS
    assert real_cloud.project_limits(project) == {}


def test_unified_limits_restore_puts_an_existing_project_limit_back(
    real_cloud: RealCloud,
) -> None:
    project = real_cloud.new_project()
    real_cloud.set_project_limit(project, "class:VCPU", 48)
    with limits() as keystone:
        original = keystone.original(project)
        assert original == QuotaOriginal(
            QuotaSet(48, 51200, 10), frozenset({"ram_mb", "instances"})
        )
        keystone.apply(project, lowered(original.quota, 2, STEP, NO_FLOOR))
        assert real_cloud.project_limits(project) == {
            "class:VCPU": 24,
            "class:MEMORY_MB": 25600,
            "servers": 5,
        }
        keystone.restore(project, original)
    assert real_cloud.project_limits(project) == {"class:VCPU": 48}


def test_keystone_refuses_limits_where_nothing_is_registered(real_cloud: RealCloud) -> None:
    """RegionOne (the legacy Nova) has no registered limits: Keystone's own 403 and words."""
    project = real_cloud.new_project()
    keystone = KeystoneLimits(LEGACY, limits_cloud="legacy-system", timeout_s=30, retries=0)
    with keystone:
        assert keystone.registered(project) == {}
        with pytest.raises(OpenStackError) as caught:
            keystone.apply(project, QuotaSet(5, 12800, 2))
    assert (caught.value.kind, caught.value.status) == ("forbidden", 403)
    assert "no corresponding registered limit" in str(caught.value)
    assert real_cloud.project_limits(project) == {}


def test_a_member_only_account_cannot_write_keystone_limits(real_cloud: RealCloud) -> None:
    project = real_cloud.new_project()
    keystone = KeystoneLimits(UNIFIED, limits_cloud=MEMBER, timeout_s=30, retries=0)
    with keystone, pytest.raises(OpenStackError) as caught:
        keystone.apply(project, QuotaSet(5, 12800, 2))
    assert (caught.value.kind, caught.value.status) == ("forbidden", 403)
    assert "You are not authorized to perform the requested action: identity:create_limits" in str(
        caught.value
    )
    assert real_cloud.project_limits(project) == {}


# --- auto ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cloud", "expected"),
    [(LEGACY, QuotaBackendKind.nova), (UNIFIED, QuotaBackendKind.keystone_limits)],
)
def test_auto_finds_the_backend_each_nova_uses(
    real_cloud: RealCloud,
    cloud: str,
    expected: QuotaBackendKind,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gmd.daemon.enforce")
    project = real_cloud.new_project()
    limits_cloud = f"{cloud}-system"
    backend = build_backend("auto", cloud, limits_cloud=limits_cloud, timeout_s=30, retries=0)
    assert isinstance(backend, AutoQuotas)
    with nova(cloud) as reader:
        original = backend.original(project)
        target = lowered(original.quota, 2, STEP, NO_FLOOR)
        write = backend.apply(project, target)
        assert backend.resolved == expected
        assert write.ok and write.backend == expected
        assert reader.get(project) == target
        backend.restore(project, original)
        assert reader.get(project) == DEFAULTS
    backend.close()
    assert real_cloud.project_limits(project) == {}
    # Finding out is not a failure: one line says what was found, nothing at WARNING or above.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    found = [r.getMessage() for r in caplog.records if "compute quotas are written to" in r.msg]
    assert len(found) == 1
    assert found[0].startswith(f"cloud {cloud!r}: compute quotas are written to {expected.value} (")


def test_the_quota_job_on_unified_limits_audits_every_write(
    real_cloud: RealCloud, tmp_path: Path
) -> None:
    project = real_cloud.new_project("greedy")
    config = quota_config(tmp_path, UNIFIED, limits_cloud=UNIFIED_SYSTEM, floor_instances=1)
    engine = at_level(config, project, 1)
    job = QuotaReconciler(engine, config.enforcement)
    assert job.run().lowered == 1
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT unset, backend, applied FROM quota_originals")).one()
    assert tuple(row) == ("cores,ram_mb,instances", "keystone-limits", True)
    assert real_cloud.project_limits(project) == {
        "class:VCPU": 15,
        "class:MEMORY_MB": 38400,
        "servers": 7,
    }
    set_level(engine, 0)
    assert job.run().restored == 1
    job.close()
    assert real_cloud.project_limits(project) == {}
    kinds = [(r[0], r[1], json.loads(r[2]), json.loads(r[3])) for r in quota_rows(engine)]
    assert kinds == [
        ("quota_lower", "ok", DEFAULTS.as_nova(), QuotaSet(15, 38400, 7).as_nova()),
        ("quota_restore", "ok", QuotaSet(15, 38400, 7).as_nova(), DEFAULTS.as_nova()),
    ]
    assert all("keystone-limits" in r[4] for r in quota_rows(engine))
