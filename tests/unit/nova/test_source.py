"""How the weigher reads gmd (gmd.nova.source, gmd.nova.client): once per cache period, never
waiting past the hard timeout, neutral while gmd is down or answers nonsense, and the real
route of a real gmd-daemon read through keystoneauth as nova-scheduler would read it.

A gmd that answers slowly on demand cannot be had from the real daemon: the slow and failing
fetches here are functions that block or raise."""

from __future__ import annotations

import threading

import httpx
import pytest
from oslo_config import cfg

from gmd.nova.client import GmdRefused, fetcher, register_opts
from gmd.nova.ranking import Project
from gmd.nova.source import Source
from tests.support.daemon_support import (
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
)
from tests.support.polling import wait_until

DOC = {
    "resources": ["cpu", "memory", "disk", "network"],
    "intervals": [60],
    "hosts": {
        "cmp-1": {
            "capacity": {"cpu_cores": 4, "memory_bytes": 8e9},
            "utilization": {"cpu": 0.5, "memory": 0.25},
        }
    },
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Gmd:
    """A fetch that answers DOC (with the project's level), or raises, or blocks."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: Exception | None = None
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, project: str, hosts: bool) -> object:
        self.calls.append(project if hosts else f"{project} alone")
        assert self.gate.wait(30)
        if self.fail is not None:
            raise self.fail
        level = {"project": {"id": project, "level": 2, "cpu_cap_fraction": 0.5}}
        return {**DOC, **level} if hosts else {**DOC, "hosts": {}, **level}


def test_one_fetch_serves_every_request_for_the_cache_period() -> None:
    gmd, clock = Gmd(), Clock()
    source = Source(gmd, cache_s=30, clock=clock)
    first = source.view("p")
    assert first is not None and first.project == Project("p", 2, 0.5)
    assert list(first.cluster.index) == ["cmp-1"]
    clock.now += 29
    assert source.view("p") == first
    assert gmd.calls == ["p"]
    clock.now += 2  # past the cache: fetched again
    assert source.view("p") is not None
    assert gmd.calls == ["p", "p"]


def test_a_new_project_is_weighed_at_once_and_its_level_alone_fetched_behind() -> None:
    gmd, clock = Gmd(), Clock()
    source = Source(gmd, clock=clock)
    first = source.view("p")
    assert first is not None
    seen = source.view("q")  # hosts fresh: no wait for q's level
    assert seen is not None and seen.project == Project("q")

    def known() -> bool:
        view = source.view("q")
        return view is not None and view.project == Project("q", 2, 0.5)

    wait_until("q's level fetched behind", known, timeout_s=30)
    assert gmd.calls == ["p", "q alone"]
    view = source.view("q")
    assert view is not None and view.cluster is first.cluster  # the hosts were not re-read


def test_a_slow_gmd_is_waited_for_at_most_the_timeout_and_its_answer_serves_later() -> None:
    gmd, clock = Gmd(), Clock()
    gmd.gate.clear()
    source = Source(gmd, timeout_s=0.05, clock=clock)
    assert source.view("p") is None
    assert source.counters.timeouts == 1
    assert source.view("p") is None  # the same fetch is still under way: waited on, not repeated
    assert gmd.calls == ["p"]
    gmd.gate.set()
    pending = source._state.pending
    if pending is not None:
        pending.result(timeout=30)
    assert source.view("p") is not None
    assert gmd.calls == ["p"]


@pytest.mark.parametrize(
    "failure", [ConnectionRefusedError("refused"), GmdRefused("GET …: 503 busy"), ValueError("x")]
)
def test_a_failing_gmd_is_neutral_and_asked_again_only_after_the_retry_pause(
    failure: Exception,
) -> None:
    gmd, clock = Gmd(), Clock()
    gmd.fail = failure
    source = Source(gmd, retry_s=10, clock=clock)
    assert source.view("p") is None
    assert source.counters.failures == 1
    clock.now += 5
    assert source.view("p") is None  # in the pause: neutral at once, gmd not asked
    assert gmd.calls == ["p"]
    gmd.fail = None
    clock.now += 6
    assert source.view("p") is not None
    assert gmd.calls == ["p", "p"]


def test_an_answer_that_is_no_document_is_a_failure() -> None:
    clock = Clock()
    source = Source(lambda project, hosts: ["not", "a", "document"], clock=clock)
    assert source.view("p") is None
    assert source.counters.failures == 1


def test_the_client_reads_a_real_gmd_daemons_route(database_url: str) -> None:
    """The fetch nova-scheduler makes, over keystoneauth with ``endpoint_override`` (a gmd
    whose read API needs no token), against a real gmd-daemon; a refusal is GmdRefused."""
    spec = HostSpec("cmp-1", cpu_cores=4, memory_bytes=8e9, disk_bytes_per_s=1e8)
    config = make_config(
        database_url,
        {spec.name: "operator"},
        read_api={"auth": "local"},
        daemon={"bind": "127.0.0.1"},
    )
    with serving(config, accountant=True) as d:
        body = batch(spec, aligned_past(2), [cpu_only("vm-1", "acme", 120.0)])
        posted = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(spec.name))
        assert posted.status_code == 200, posted.text
        conf = cfg.ConfigOpts()
        register_opts(conf)
        conf([], default_config_files=[])
        conf.set_override("endpoint_override", d.url, group="gmd")
        fetch = fetcher(conf)
        source = Source(fetch, timeout_s=30, cache_s=0)  # every request fetches

        def accounted() -> bool:
            view = source.view("acme")
            return view is not None and "cmp-1" in view.cluster.index

        for _ in range(300):
            if accounted():
                break
            threading.Event().wait(0.1)
        else:
            raise AssertionError("the interval was never accounted")
        answer = fetch("acme", True)
        assert isinstance(answer, dict) and answer["project"]["id"] == "acme"
        alone = fetch("acme", False)
        assert (
            isinstance(alone, dict)
            and alone["hosts"] == {}
            and alone["project"] == answer["project"]
        )
        conf.set_override("intervals", 3, group="gmd")
        conf.set_override("endpoint_override", d.url + "/nowhere", group="gmd")
        with pytest.raises(GmdRefused, match="404"):
            fetcher(conf)("acme", True)


def test_the_projects_kept_are_bounded() -> None:
    gmd, clock = Gmd(), Clock()
    source = Source(gmd, max_projects=4, clock=clock)
    for k in range(10):
        clock.now += 0.001
        source.view(f"p{k}")
        wait_until(f"p{k}'s level", lambda k=k: f"p{k}" in source._state.projects, 30)
        assert len(source._state.projects) <= 4
