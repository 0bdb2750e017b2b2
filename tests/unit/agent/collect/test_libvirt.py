"""The libvirt collector against libvirt's test driver, with real libvirt errors.

The test driver's ``getAllDomainStats`` returns only ``state.*``, so these tests run the
per-domain fallback; a wrapper that adds QEMU's bulk keys checks the bulk path. Wrappers at
the libvirt boundary stop, restart or break domains through the same connection, so every
error the collector sees is one libvirt raised.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import libvirt
import pytest

from gmd.agent.collect.aggregate import AgentState, advance
from gmd.agent.collect.base import DomainFlavor, FailureKind, Ownership
from gmd.agent.collect.libvirt import LibvirtCollector
from gmd.agent.config import parse_agent
from gmd.agent.loop import AgentLoop
from gmd.agent.spool import Spool
from tests.support.agent_fixtures import (
    GMD,
    NODE,
    NOVA,
    NOVA10,
    ORPHAN,
    STOPPED,
    Conn,
    collector,
    many_domains_node,
    unreachable_libvirt_error,
    uri,
)

MIB = 2**20


def test_owner_flavor_and_creation_time_from_metadata() -> None:
    c, _ = collector()
    reading = c.collect()
    owners = {v.uuid: v.owner for v in reading.vms}
    assert owners == {
        NOVA: Ownership(
            "7f3e1c2b9a8d4e5f6a7b8c9d0e1f2a3b",
            "nova/1.1",
            DomainFlavor(2.0, 4096 * MIB),
            1709294400,
            "acme",  # the project's name, as Nova wrote it beside the uuid
        ),
        NOVA10: Ownership(
            "11112222333344445555666677778888",
            "nova/1.0",
            DomainFlavor(1.0, 2048 * MIB),
            1579077000,
            "legacy",
        ),
        # gmd's namespace gives 6 vCPUs; the RAM comes from the domain's <memory> (8 GiB).
        GMD: Ownership("physics-lab", "gmd", DomainFlavor(6.0, 8 * 2**30)),
        # No owner: reported, under "unknown", with the domain's own size as its flavor.
        ORPHAN: Ownership("unknown", "unknown", DomainFlavor(2.0, 2**30)),
    }
    # The stopped domain is neither read nor listed.
    assert STOPPED not in reading.listed and reading.listed == set(owners)
    assert reading.ok and reading.errors == () and reading.gone == frozenset()


def test_default_customer_for_vms_without_metadata() -> None:
    c, _ = collector(default_customer="operator-pool")
    owners = {v.uuid: v.owner for v in c.collect().vms}
    assert owners[ORPHAN] == Ownership("operator-pool", "default", DomainFlavor(2.0, 2**30))
    assert owners[NOVA].customer == "7f3e1c2b9a8d4e5f6a7b8c9d0e1f2a3b"


def test_per_domain_fallback_reads_what_bulk_stats_lack() -> None:
    c, conns = collector()
    before = time.time()
    reading = c.collect()
    after = time.time()
    vm = {v.uuid: v for v in reading.vms}[NOVA]
    # info(): the test driver's CPU time is the wall clock; memory is <currentMemory>
    # (its memoryStats() gives no rss).
    assert before * 1e9 <= vm.cpu_time_ns <= after * 1e9
    assert vm.memory_rss_bytes == 3072 * MIB
    # Every disk with a source (not the empty CD-ROM), every interface, by target device.
    assert set(vm.disks) == {"vda", "vdb"} and set(vm.nics) == {"tap0001"}
    real = conns[0].real.lookupByUUIDString(NOVA)
    rd, wr = real.blockStats("vda")[1], real.blockStats("vda")[3]
    assert 0 < vm.disks["vda"][0] <= rd and 0 < vm.disks["vda"][1] <= wr
    assert vm.run_id == real.ID()
    assert conns[0].per_domain_calls > 0


def test_bulk_stats_are_used_when_the_driver_gives_them() -> None:
    """On QEMU one getAllDomainStats call has everything: no per-domain calls."""
    c, conns = collector()
    c.collect()  # open the connection, learn the domains
    conns[0].per_domain_calls = 0
    for i, u in enumerate((NOVA, NOVA10, GMD, ORPHAN)):
        conns[0].bulk_extra[u] = {
            "cpu.time": 10**9 * (i + 1),
            "balloon.rss": 1024 * (i + 1),
            "block.count": 1,
            "block.0.name": "vda",
            "block.0.rd.bytes": 111 * (i + 1),
            "block.0.wr.bytes": 22,
            "net.count": 2,
            "net.0.name": "vnet0",
            "net.0.rx.bytes": 5,
            "net.0.tx.bytes": 6,
            "net.1.name": "vnet1",
            "net.1.rx.bytes": 7,
            "net.1.tx.bytes": 8,
        }
    vm = {v.uuid: v for v in c.collect().vms}[NOVA10]
    assert conns[0].per_domain_calls == 0
    assert (vm.cpu_time_ns, vm.memory_rss_bytes) == (2 * 10**9, 2048 * 1024)
    assert vm.disks == {"vda": (222, 22)}
    assert vm.nics == {"vnet0": (5, 6), "vnet1": (7, 8)}


def test_many_domains_in_one_tick(tmp_path: Path) -> None:
    node = many_domains_node(tmp_path / "node.xml", 200, stopped=3)
    c, _ = collector(node)
    reading = c.collect()
    assert len(reading.vms) == 200 and len(reading.listed) == 200
    customers = {v.owner.customer for v in reading.vms}
    assert customers == {f"proj-{k}" for k in range(7)}
    vm = {v.uuid: v for v in reading.vms}["00000000-0000-4000-8000-000000000013"]
    assert vm.owner.flavor == DomainFlavor(2.0, 1024 * MIB)
    assert set(vm.disks) == {"vda"} and set(vm.nics) == {"tap13"}


def test_domains_vanishing_mid_tick_do_not_lose_the_others() -> None:
    c, conns = collector()
    c.collect()
    conn = conns[0]
    transient = conn.real.createXML(
        "<domain type='test'><name>short-lived</name><memory>65536</memory>"
        "<os><type>hvm</type></os></domain>"
    )
    gone_uuid = transient.UUIDString()

    def stop_two(real: Any) -> None:
        # Between the listing and the reading: a Nova VM shuts off, a transient one is undefined.
        real.lookupByUUIDString(NOVA).destroy()
        real.lookupByUUIDString(gone_uuid).destroy()

    conn.after_listing.append(stop_two)
    reading = c.collect()
    assert reading.ok and reading.errors == ()
    assert reading.gone == {NOVA, gone_uuid}
    assert {v.uuid for v in reading.vms} == {NOVA10, GMD, ORPHAN}


def test_a_failing_domain_is_reported_and_the_others_read(caplog: Any) -> None:
    c, conns = collector()
    state = advance(AgentState(), c.collect(), 60).state

    # A real libvirt error that is neither "gone" nor a lost connection.
    conns[0].wrap[NOVA10] = {"info": lambda real: real.blockStats("no-such-disk")}
    with caplog.at_level(logging.WARNING, "gmd.agent.collect.libvirt"):
        reading = c.collect()
    assert {v.uuid for v in reading.vms} == {NOVA, GMD, ORPHAN}
    assert NOVA10 in reading.listed and NOVA10 not in reading.gone
    assert [(f.kind, f.uuid) for f in reading.errors] == [(FailureKind.domain, NOVA10)]
    assert reading.errors[0].message.startswith(f"domain {NOVA10}: ")
    assert f"cannot read domain {NOVA10}" in caplog.text
    # Its baseline survives, so the next good reading measures the whole gap.
    state2 = advance(state, reading, 60).state
    assert state2.baselines[NOVA10] == state.baselines[NOVA10]


def test_a_failing_device_skips_the_device_not_the_domain() -> None:
    c, conns = collector()

    assert c.collect().ok
    conns[0].wrap[NOVA] = {
        "blockStats": lambda real, dev: real.blockStats("no-such-disk" if dev == "vdb" else dev)
    }
    vm = {v.uuid: v for v in c.collect().vms}[NOVA]
    assert set(vm.disks) == {"vda"}


def test_restarted_domain_is_a_counter_reset() -> None:
    c, conns = collector()
    state = advance(AgentState(), c.collect(), 60).state
    dom = conns[0].real.lookupByUUIDString(NOVA10)
    old_id = dom.ID()
    dom.destroy()
    dom.create()
    r = advance(state, c.collect(), 60)
    span = {s.uuid: s for s in r.spans}[NOVA10]
    assert span.resets == (f"process (domain id {old_id} → {dom.ID()})",)
    # The new process's counters are counted from zero: the test driver's CPU time is the
    # wall clock, so a reset counts it whole (~56 years), never as a negative amount.
    assert span.usage.cpu_s > 1e9
    assert r.state.baselines[NOVA10].run_id == dom.ID()


def test_lost_connection_is_retried_with_backoff_and_logged(caplog: Any) -> None:
    now = [1000.0]
    refused = unreachable_libvirt_error()
    attempts: list[float] = []
    conns: list[Conn] = []

    def opener(u: str) -> Conn:
        attempts.append(now[0])
        if len(attempts) in (2, 3):
            raise refused
        conns.append(Conn(libvirt.open(u)))
        return conns[-1]

    c = LibvirtCollector(
        uri(NODE), opener=opener, monotonic=lambda: now[0], backoff_initial_s=1, backoff_max_s=60
    )
    state = advance(AgentState(), c.collect(), 60).state
    conns[0].fail_listing = refused
    with caplog.at_level(logging.INFO, "gmd.agent.libvirt_conn"):
        lost = c.collect()  # the call fails: connection dropped, retry in 1 s
        assert not lost.ok and [f.kind for f in lost.errors] == [FailureKind.host]
        assert "lost while listing domains" in lost.errors[0].message
        assert "retrying in 1 s" in lost.errors[0].message
        assert not c.collect().ok  # still within the backoff: not even tried
        now[0] += 1.0
        assert not c.collect().ok  # tried, refused: retry in 2 s
        now[0] += 1.5
        assert not c.collect().ok  # within 2 s: not tried
        now[0] += 0.5
        assert not c.collect().ok  # tried, refused: retry in 4 s
        now[0] += 4.0
        back = c.collect()
    assert attempts == [1000.0, 1001.0, 1003.0, 1007.0]
    assert back.ok and len(back.vms) == 4
    text = caplog.text
    assert "libvirt connection to test://" in text and "lost while listing domains" in text
    assert "retrying in 2 s" in text and "retrying in 4 s" in text
    assert "reconnected to libvirt" in text and "after 3 failures" in text
    # Unreadable ticks kept the baselines: the reading after the outage measures from before.
    state = advance(state, lost, 60).state
    spans = advance(state, back, 60).spans
    assert {s.uuid for s in spans} == {NOVA, NOVA10, GMD, ORPHAN}
    assert all(s.start_s < back.taken_s for s in spans)


def test_host_resources_from_the_node() -> None:
    c, _ = collector()
    resources = c.resources()
    assert resources is not None
    # node.xml: 1 node × 2 sockets × 4 cores × 2 threads, 64 GiB.
    assert (resources.cpu_cores, resources.memory_bytes) == (16.0, 64 * 2**30)


@pytest.mark.parametrize("bulk", [True, False])
def test_listing_modes_read_the_same_domains(bulk: bool) -> None:
    c, _ = collector(bulk=bulk)
    assert {v.uuid for v in c.collect().vms} == {NOVA, NOVA10, GMD, ORPHAN}


def test_agent_with_libvirt_down_counts_errors_and_spools_nothing(tmp_path: Path) -> None:
    config = parse_agent(
        {"agent": {"host": "cmp-x", "network_bytes_per_s": 1e9, "spool_path": "unused"}}
    )
    spool = Spool(tmp_path / "spool.db", max_bytes=10**6, max_batches=10)
    agent = AgentLoop(config, LibvirtCollector("qemu+tcp://127.0.0.1:1/system"), spool, None)
    for _ in range(3):
        report = agent.tick()
        assert not report.reading.ok and report.batches == 0
    value = agent.metrics.registry.get_sample_value
    assert value("gmd_agent_libvirt_errors_total", {"scope": "host"}) == 3
    assert value("gmd_agent_ticks_total", {"outcome": "host_unreadable"}) == 3
    assert spool.size() == (0, 0) and spool.state() is None
    spool.close()
