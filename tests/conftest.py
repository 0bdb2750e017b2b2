"""Shared fixtures: where the tests' read-only data lives (tests/data); and the test tiers.

Every test, in whichever folder below this one, is marked from what it uses, so no test file
names its tier and no folder decides it: ``postgres`` (the PostgreSQL server fixture, or
``database_url`` on PostgreSQL), ``realvm`` (the real libvirtd/QEMU guests of
tests/support/realvm.py), ``openstack`` (the real Keystone, Nova and Placement of
tests/support/openstack_support.py, and the whole cloud with a compute host of
tests/support/nova_support.py) and ``slow`` (SLOW below: more than about ten seconds on its own).
``make test-fast`` runs the rest (and skips a test that needs an extra or a program it did not
install: tests/support/needs.py); ``make test`` runs everything.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import needs

needs.skip_missing_extras()


def pytest_collectstart(collector: pytest.Collector) -> None:
    needs.collecting(True)


def pytest_collection_finish(session: pytest.Session) -> None:
    needs.collecting(False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    except ModuleNotFoundError as exc:
        if (why := needs.absent(exc)) is not None:
            pytest.skip(why)
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Under make test-fast, a test that needs an extra it did not install is skipped, not
    failed (tests/support/needs.py)."""
    try:
        return (yield)
    except ModuleNotFoundError as exc:
        if (why := needs.absent(exc)) is not None:
            pytest.skip(why)
        raise


# No per-example deadline: hypothesis' default (200 ms) is a speed assertion, and on a busy
# machine (CI, or benchmarks beside the tests) a property test failed on it once, not on its
# property.
settings.register_profile("gmd", deadline=None)
settings.load_profile("gmd")

# Rewrite the support modules' asserts as a test module's: test modules import the cloud plugins
# before they name them in pytest_plugins, and the helpers that several test files share assert
# what they post and read.
pytest.register_assert_rewrite("tests.support")

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
"""What the tests read, cut from public data at copy time (tests/data/README.md says what, from
where and how): the repository holds everything its tests need."""

POSTGRES_FIXTURE = "postgres_server_url"
REALVM_PLUGIN = "tests.support.realvm"
OPENSTACK_FIXTURE = "openstack_info"
NOVA_FIXTURE = "nova_cloud"
ZOOKEEPER_FIXTURE = "zookeeper_hosts"
"""The shared ZooKeeper ensemble of tests/support/zookeeper_fixtures.py."""
"""The whole small cloud of tests/support/nova_support.py: real Nova booting real QEMU guests."""
# Tests that take more than about ten seconds alone on a busy 2-core machine (measured with
# `pytest --durations=30`: 10-45 s loaded, 4-17 s idle), and two that start real processes and
# wait on them (6-7 s loaded), which keeps `make test-fast` under a minute. By node id; a name
# without "[...]" marks every parametrization.
SLOW = frozenset(
    {
        # 6-16 s each: out of make test-fast's three minutes from a fresh clone.
        "tests/unit/daemon/reports/test_whatif.py::"
        "test_no_override_reproduces_a_demo_ledger_row_by_row",
        "tests/unit/daemon/reports/test_whatif.py::"
        "test_gmd_admin_whatif_shows_the_replay_and_refuses_in_one_line",
        "tests/unit/daemon/api/test_ingest_hardening.py::"
        "test_the_operator_lists_releases_and_drops_quarantined_batches",
        "tests/unit/admin/test_output.py::"
        "test_actions_count_by_their_interval_and_limit_keeps_the_newest",
        "tests/unit/daemon/api/test_fast_batch.py::"
        "test_the_fast_reader_never_accepts_what_the_contract_refuses",
        "tests/repository/test_xdist_groups.py::test_tests_grouped_in_conftest_run_on_one_worker",
        "tests/integration/test_agent_process.py::"
        "test_sigkill_with_a_full_spool_then_restart_loses_and_doubles_nothing",
        "tests/integration/test_bench.py::test_ingest_bench_posts_and_counts_every_sample",
        "tests/integration/test_demo.py::"
        "test_the_demo_replays_accounts_and_reports_what_the_traces_say",
        "tests/integration/test_demo.py::"
        "test_a_bad_trace_stops_the_demo_naming_the_agent_file_and_line",
        "tests/integration/test_bootstrap.py::"
        "test_make_demo_sets_up_without_libvirt_or_apt_and_the_demo_runs",
        "tests/unit/sim/test_lpc_egee.py::"
        "test_the_shipped_weeks_give_the_protocols_values_and_orderings",
        "tests/integration/test_daemon_process.py::"
        "test_sigkill_during_accounting_leaves_no_partial_interval",
        "tests/unit/daemon/reports/test_explain.py::test_errors_have_exit_codes",
        "tests/unit/daemon/enforce/test_levels.py::test_admin_shows_the_log_and_the_plan",
        "tests/integration/test_cli.py::test_db_upgrade_and_current",
        "tests/unit/daemon/api/test_fuzz.py::test_no_request_gets_a_5xx_or_an_undocumented_answer",
        "tests/unit/agent/collect/test_replay.py::"
        "test_a_replaying_agent_killed_mid_replay_resumes_without_counting_twice",
        "tests/integration/test_wheel_demo.py::"
        "test_a_wheel_with_daemon_and_admin_runs_the_demo_outside_the_checkout",
        "tests/integration/test_broker_bench.py::test_broker_bench_claims_probes_and_measures_a_month",
    }
)


def _uses_postgres(item: pytest.Item) -> bool:
    if POSTGRES_FIXTURE in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("database_url") == "postgresql"


def _uses_real_vms(item: pytest.Item) -> bool:
    """A fixture of tests/support/realvm.py (``real_guests``) among the test's fixtures, directly or
    through another fixture."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        getattr(fixturedef.func, "__module__", None) == REALVM_PLUGIN
        for name in item.fixturenames
        for fixturedef in info.name2fixturedefs.get(name, ())
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test of a real service gets what the service logged meanwhile (``service_logs``,
    set by its fixture): the only trace of a server-side error in a CI run."""
    report: pytest.TestReport = yield
    service_logs = getattr(item, "service_logs", None)
    if report.failed and call.when == "call" and service_logs is not None:
        report.sections.extend(service_logs())
    return report


# First: xdist's own hook turns the `xdist_group` marks into the node ids its scheduler groups
# by, and marks added after it are not seen (the cloud's tests ran on two workers).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_found = set()
    for item in items:
        for module in needs.warning_modules(item):
            if (why := needs.lacking(module)) is not None:
                # pytest imports a filter's category before it skips: the filter goes too.
                needs.drop_warning_filters(item)
                item.add_marker(pytest.mark.skip(reason=why))
        if _uses_postgres(item):
            item.add_marker(pytest.mark.postgres)
        if _uses_real_vms(item):
            item.add_marker(pytest.mark.realvm)
        if OPENSTACK_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.openstack)
            # One real cloud, whose projects' quotas the tests change: one worker runs them all.
            item.add_marker(pytest.mark.xdist_group("openstack"))
        nova = NOVA_FIXTURE in getattr(item, "fixturenames", ())
        if nova:
            item.add_marker(pytest.mark.openstack)
            # One cloud and one compute host, whose guests the tests boot and count: one worker.
            item.add_marker(pytest.mark.xdist_group("nova"))
        if ZOOKEEPER_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.zookeeper)
            # One ensemble, which the session that started it stops: one worker. Not for a
            # test of the cloud's too: xdist would join both marks into a group of their own,
            # on a worker that waits for the cloud's session to end and starts the cloud again.
            # Under `make test` the ensemble is make's (GMD_TEST_ZOOKEEPER): any worker uses it.
            if not nova:
                item.add_marker(pytest.mark.xdist_group("zookeeper"))
        if item.nodeid.startswith("tests/unit/admin/test_read_replica.py"):
            # One streaming replica, which these tests stop and start again.
            item.add_marker(pytest.mark.xdist_group("replica"))
        slow = {item.nodeid, item.nodeid.split("[")[0]} & SLOW
        if slow:
            item.add_marker(pytest.mark.slow)
            slow_found |= slow
    # A renamed test would quietly leave the slow tier: say so when its whole file was collected.
    if not any("::" in arg for arg in config.args):
        files = {item.nodeid.split("::")[0] for item in items}
        for name in sorted(SLOW - slow_found):
            if name.split("::")[0] in files:
                warnings.warn(
                    f"tests/conftest.py SLOW names {name}, which is no test", stacklevel=1
                )


@pytest.fixture(scope="session")
def test_vectors() -> dict:
    """The published DRF and Shapley examples (tests/data/README.md)."""
    return json.loads((DATA / "test_vectors.json").read_text())


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """The PostgreSQL server `make test` started; a test that needs it fails without it."""
    url = os.environ.get("GMD_TEST_POSTGRES_URL")
    if not url:
        pytest.fail("GMD_TEST_POSTGRES_URL is not set: run the tests with `make test`")
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty ledger database of each kind: a SQLite file, or a new PostgreSQL db."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    from tests.support.daemon_support import fresh_postgres_database

    with fresh_postgres_database(request.getfixturevalue("postgres_server_url")) as url:
        yield url
