"""The agent's /metrics as Prometheus scrapes it: the client library's process and platform
series, every label value from the start, the current enforcement mode, plans not applied
through, a busy domain counted apart from libvirt's errors, the VMs measured and held
throttled, and which knobs the host can set.

The page is scraped from the real gmd-agent on libvirt's test driver; the busy domains come
from the collector on the test driver behind a connection that says it is QEMU (whose bulk
reply holds every counter of a domain that is not busy) or whose domain does not answer.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import libvirt
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gmd.agent.apply.base import BackendUnavailable
from gmd.agent.apply.libvirt import LibvirtApplier
from gmd.agent.collect.base import FailureKind, HostReading, ReadFailure
from gmd.agent.collect.libvirt import LibvirtCollector
from gmd.agent.config import parse_agent
from gmd.agent.loop import AgentLoop
from gmd.agent.metrics import AgentMetrics
from gmd.agent.spool import Spool
from gmd.wire import PLAN_MODES
from tests.support.agent_fixtures import GMD, NODE, NOVA, NOVA10, ORPHAN, Conn, uri
from tests.support.appliers import NODE as APPLIER_NODE, UUID_B, Plans, SchedConn, item, plan

AGENT = Path(sys.executable).with_name("gmd-agent")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_real_agents_page_has_process_series_every_label_value_and_no_stray_names(
    tmp_path: Path,
) -> None:
    port = free_port()
    toml = tmp_path / "gmd.toml"
    toml.write_text(
        f'[agent]\nlibvirt_uri = "{uri(NODE)}"\ncollector = "libvirt"\ntick_s = 0.5\n'
        f'daemon_url = "http://127.0.0.1:9"\nspool_path = "{tmp_path / "spool.db"}"\n'
        f'enforcement_state_path = "{tmp_path / "e.json"}"\nmetrics_port = {port}\n'
    )
    agent = subprocess.Popen(
        [str(AGENT), "--config", str(toml)], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        text = ""
        while 'gmd_agent_ticks_total{outcome="ok"} 0.0' in text or not text:
            assert agent.poll() is None and time.monotonic() < deadline, text
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.TransportError:
                text = ""
            time.sleep(0.2)
    finally:
        agent.terminate()
        assert agent.wait(timeout=30) == 0

    got = samples(text)
    names = {name for name, _labels in got}
    # The client library's own series, as every Prometheus exporter has them.
    assert {
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "python_info",
        "python_gc_objects_collected_total",
    } <= names
    # Every label value exists before it happens: a rate over it reads 0, not "no data".
    zero = [
        ("gmd_agent_ticks_total", (("outcome", "host_unreadable"),)),
        ("gmd_agent_batches_total", (("outcome", "rejected"),)),
        ("gmd_agent_batches_total", (("outcome", "dropped"),)),
        ("gmd_agent_libvirt_errors_total", (("scope", "host"),)),
        ("gmd_agent_libvirt_errors_total", (("scope", "domain"),)),
        ("gmd_agent_libvirt_errors_total", (("scope", "block_stats"),)),
        ("gmd_agent_plan_apply_failures_total", (("reason", "backend_unavailable"),)),
        ("gmd_agent_plan_apply_failures_total", (("reason", "error"),)),
        ("gmd_agent_busy_domains_total", ()),
        *(
            ("gmd_agent_enforcement_results_total", (("action", a), ("outcome", o)))
            for a in ("apply", "restore", "would_apply", "would_restore")
            for o in ("failed", "ok")
        ),
    ]
    assert {key: got.get(key) for key in zero} == dict.fromkeys(zero, 0.0)
    # The plan fetches failed (no daemon): the mode is the one of no plan yet.
    assert got[("gmd_agent_plan_fetches_total", (("outcome", "unavailable"),))] >= 1
    assert got[("gmd_agent_plan_fetches_total", (("outcome", "ok"),))] == 0
    assert {m: got[("gmd_agent_enforcement_mode", (("mode", m),))] for m in PLAN_MODES} == {
        "off": 0,
        "dry-run": 0,
        "on": 0,
    }
    # A HELP text names only series that exist, with their exposed names (…_total).
    helps = re.findall(r"^# HELP \S+ (.*)$", text, re.M)
    named = {n for h in helps for n in re.findall(r"\bgmd_[a-z_]+", h)}
    assert named <= names, named - names


class QemuConn(Conn):
    """The test driver as the QEMU driver answers: a domain's bulk record holds every counter
    unless the domain is busy (here: the domains not in ``complete``)."""

    def __init__(self, real: Any, complete: set[str]) -> None:
        super().__init__(real)
        counters = {"cpu.time": 10**9, "balloon.rss": 1024, "block.count": 0, "net.count": 0}
        self.bulk_extra = {uuid: counters for uuid in complete}

    def getType(self) -> str:
        return "QEMU"


def agent_on(tmp_path: Path, collector: Any, **kw: Any) -> AgentLoop:
    config = parse_agent({"agent": {"host": "cmp-1", "tick_s": 1, "libvirt_uri": "test:///x"}})
    spool = Spool(tmp_path / "spool.db", max_bytes=2**20, max_batches=100)
    return AgentLoop(config, collector, spool, None, **kw)


def value(agent: AgentLoop, name: str, **labels: str) -> float | None:
    return agent.metrics.registry.get_sample_value(name, labels)


def test_a_busy_domain_is_counted_apart_from_libvirt_errors(tmp_path: Path) -> None:
    collector = LibvirtCollector(
        uri(NODE), opener=lambda u: QemuConn(libvirt.open(u), {NOVA, NOVA10, GMD})
    )
    agent = agent_on(tmp_path, collector)
    reading = agent.tick(1_800_000_000.0).reading
    assert reading.ok and reading.busy == {ORPHAN} and reading.errors == ()
    assert {v.uuid for v in reading.vms} == {NOVA, NOVA10, GMD}
    assert value(agent, "gmd_agent_busy_domains_total") == 1
    assert value(agent, "gmd_agent_libvirt_errors_total", scope="domain") == 0
    agent.spool.close()


def timeout_error() -> libvirt.libvirtError:
    """libvirt's error for a domain whose QEMU did not answer in time (no test driver call
    times out on demand: the error object is made here, its code as libvirt sets it)."""
    exc = libvirt.libvirtError("Timed out during operation: cannot acquire state change lock")
    exc.err = (libvirt.VIR_ERR_OPERATION_TIMEOUT, libvirt.VIR_FROM_QEMU, str(exc), 2)
    return exc


def test_a_domain_that_times_out_is_busy_not_a_libvirt_error(tmp_path: Path) -> None:
    conns: list[Conn] = []

    def opener(u: str) -> Conn:
        conns.append(Conn(libvirt.open(u)))
        conns[-1].wrap[ORPHAN] = {"info": lambda _dom: (_ for _ in ()).throw(timeout_error())}
        return conns[-1]

    agent = agent_on(tmp_path, LibvirtCollector(uri(NODE), opener=opener))
    reading = agent.tick(1_800_000_000.0).reading
    assert reading.busy == {ORPHAN} and reading.errors == ()
    assert value(agent, "gmd_agent_busy_domains_total") == 1
    assert value(agent, "gmd_agent_libvirt_errors_total", scope="domain") == 0
    agent.spool.close()


@pytest.fixture
def conn(tmp_path: Path) -> Any:
    node = tmp_path / "node.xml"
    node.write_text(APPLIER_NODE)
    c = libvirt.open(f"test://{node}")
    yield c
    c.close()


class Unreachable(LibvirtApplier):
    """The hypervisor goes away between the fetch and the apply."""

    down = False

    def _find(self, uuid: str) -> Any:
        if self.down:
            raise BackendUnavailable("cannot connect to libvirt at test:///x: refused")
        return super()._find(uuid)


def test_the_mode_applied_and_plans_not_applied_through(conn: Any, tmp_path: Path) -> None:
    from gmd.agent.collect.libvirt import LibvirtCollector as Collector

    applier = Unreachable(SchedConn(conn), state_path=tmp_path / "s.json")
    plans = Plans()
    collector = Collector("test:///x", opener=lambda _u: conn)
    agent = agent_on(tmp_path, collector, applier=applier, plans=plans)

    def modes() -> dict[str, float | None]:
        return {m: value(agent, "gmd_agent_enforcement_mode", mode=m) for m in PLAN_MODES}

    assert modes() == {"off": 0, "dry-run": 0, "on": 0}
    plans.plan = plan("dry-run", item(UUID_B))
    agent.tick(1_800_000_000.0)
    assert modes() == {"off": 0, "dry-run": 1, "on": 0}
    applier.down, plans.plan = True, plan("on", item(UUID_B))
    agent.tick(1_800_000_030.0)
    assert modes() == {"off": 0, "dry-run": 0, "on": 1}
    assert value(agent, "gmd_agent_plan_apply_failures_total", reason="backend_unavailable") == 1
    assert value(agent, "gmd_agent_plan_apply_failures_total", reason="error") == 0
    agent.spool.close()


def test_every_help_text_names_exposed_series_only() -> None:
    """On the registry, before anything happened: the same rule as the scraped page."""
    text = generate_latest(AgentMetrics().registry).decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    helps = re.findall(r"^# HELP \S+ (.*)$", text, re.M)
    named = {n for h in helps for n in re.findall(r"\bgmd_[a-z_]+", h)}
    assert named <= names, named - names


def test_read_failures_are_counted_by_their_kind() -> None:
    """A connection lost in the middle of a tick is a host failure, not one VM's; the block
    stats the kernel collector asks for all its VMs at once are counted apart."""
    metrics = AgentMetrics()
    reading = HostReading(
        1.0,
        True,
        errors=(
            ReadFailure(FailureKind.domain, "domain a: no such file", "a"),
            ReadFailure(FailureKind.domain, "domain b: internal error", "b"),
            ReadFailure(FailureKind.host, "libvirt connection lost while reading domain c"),
            ReadFailure(FailureKind.block_stats, "the block stats of 3 VMs not read"),
        ),
    )
    metrics.read(reading)
    metrics.read(HostReading(2.0, False, errors=(ReadFailure(FailureKind.host, "refused"),)))

    def errors(scope: str) -> float | None:
        return metrics.registry.get_sample_value("gmd_agent_libvirt_errors_total", {"scope": scope})

    assert [errors(k) for k in FailureKind] == [2.0, 2.0, 1.0]  # host, domain, block_stats
    assert (
        metrics.registry.get_sample_value("gmd_agent_ticks_total", {"outcome": "host_unreadable"})
        == 1.0
    )


def test_the_vms_gauge_counts_the_domains_the_agent_measures(tmp_path: Path) -> None:
    """node.xml runs four domains (a fifth is stopped), two of them named instance-*."""
    every = agent_on(tmp_path / "every", LibvirtCollector(uri(NODE)))
    assert value(every, "gmd_agent_vms") == 0
    every.tick(1_800_000_000.0)
    assert value(every, "gmd_agent_vms") == 4
    every.spool.close()

    config = parse_agent({"agent": {"libvirt_uri": "test:///x", "domain_prefixes": ["instance-"]}})
    nova = agent_on(tmp_path / "nova", LibvirtCollector(uri(NODE), domains=config.domains))
    nova.tick(1_800_000_000.0)
    assert value(nova, "gmd_agent_vms") == 2
    nova.spool.close()


def test_the_throttled_gauge_follows_the_appliers_remembered_vms(conn: Any, tmp_path: Path) -> None:
    from gmd.agent.collect.libvirt import LibvirtCollector as Collector
    from tests.support.appliers import UUID_C

    state = tmp_path / "s.json"
    applier = LibvirtApplier(SchedConn(conn), state_path=state)
    plans = Plans()
    agent = agent_on(
        tmp_path / "1", Collector("test:///x", opener=lambda _u: conn), applier=applier, plans=plans
    )
    assert value(agent, "gmd_agent_vms_throttled") == 0
    plans.plan = plan("on", item(UUID_B))
    agent.tick(1_800_000_000.0)
    assert value(agent, "gmd_agent_vms_throttled") == 1 == len(applier.remembered)
    plans.plan = plan("on", item(UUID_B), item(UUID_C), generated_s=1_800_000_060)
    agent.tick(1_800_000_060.0)
    assert value(agent, "gmd_agent_vms_throttled") == 2
    agent.spool.close()

    # Restarted, with the daemon out of reach: the VMs held throttled are those on disk.
    applier = LibvirtApplier(SchedConn(conn), state_path=state)
    plans.plan = None
    agent = agent_on(
        tmp_path / "2", Collector("test:///x", opener=lambda _u: conn), applier=applier, plans=plans
    )
    agent.tick(1_800_000_120.0)
    assert value(agent, "gmd_agent_vms_throttled") == 2
    # Mode "off" puts every VM back.
    plans.plan = plan("off", generated_s=1_800_000_180)
    agent.tick(1_800_000_180.0)
    assert value(agent, "gmd_agent_vms_throttled") == 0 == len(applier.remembered)
    agent.spool.close()


def test_knob_support_is_unknown_until_the_host_is_probed_then_one_support_per_knob() -> None:
    from gmd.wire import HostCapabilities, Knob, KnobCapability, KnobSupport

    metrics = AgentMetrics()

    def support() -> dict[str, str]:
        """Each knob's support: the one label value whose sample is 1 (every other is 0)."""
        got = samples(generate_latest(metrics.registry).decode())
        ones: dict[str, list[str]] = {}
        for (name, labels), v in got.items():
            if name == "gmd_agent_knob_support":
                assert v in (0, 1), (labels, v)
                d = dict(labels)
                ones.setdefault(d["knob"], [])
                if v == 1:
                    ones[d["knob"]].append(d["support"])
        assert all(len(s) == 1 for s in ones.values()), ones
        return {knob: s[0] for knob, s in ones.items()}

    assert support() == dict.fromkeys(Knob, "unknown")
    metrics.capabilities(
        HostCapabilities(
            backend="libvirt",
            cgroup="v2",
            knobs=[
                KnobCapability(knob=Knob.cpu_weight, support=KnobSupport.supported),
                KnobCapability(knob=Knob.cpu_cap, support=KnobSupport.supported),
                KnobCapability(
                    knob=Knob.disk_weight, support=KnobSupport.unsupported, reason="mq-deadline"
                ),
                KnobCapability(knob=Knob.disk_limit, support=KnobSupport.unknown),
            ],
            probed_s=1_800_000_000,
        )
    )
    assert support() == {
        "cpu_weight": "supported",
        "cpu_cap": "supported",
        "disk_weight": "unsupported",
        "disk_limit": "unknown",
        "network_limit": "unknown",  # not reported by the probe
    }
    metrics.capabilities(
        HostCapabilities(
            backend="cgroup",
            cgroup="v1",
            knobs=[KnobCapability(knob=Knob.disk_weight, support=KnobSupport.supported)],
            probed_s=1_800_000_100,
        )
    )
    assert support()["disk_weight"] == "supported"
    assert support()["cpu_weight"] == "unknown"
