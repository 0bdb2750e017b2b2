"""The agent on a real libvirtd with two TCG guests: one spinning, one idle.

What gmd-agent would send for one tick (``--dry-run``'s batch), from the real collector:
most CPU goes to the spinning guest, whose disk and network counters move, and each guest is
owned by the Nova project in its metadata, with its flavor.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import pytest

from gmd.agent.config import parse_agent
from gmd.wire import SampleBatch

if TYPE_CHECKING:
    from tests.support.realvm import RealGuests

pytest_plugins = ("tests.support.realvm",)


def test_the_agents_batch_attributes_use_to_the_right_guest(
    real_guests: RealGuests, tmp_path
) -> None:
    from gmd.agent.collect.libvirt import LibvirtCollector
    from gmd.agent.loop import dry_run_batch

    config = parse_agent(
        {
            "agent": {
                "libvirt_uri": real_guests.uri,
                "host": "realvm-host",
                "tick_s": 4,
                "spool_path": str(tmp_path / "spool.db"),
                "network_bytes_per_s": 1.25e8,
            }
        }
    )
    collector = LibvirtCollector(config.libvirt_uri)
    try:
        doc, span_s = dry_run_batch(config, collector)
    finally:
        collector.close()
    SampleBatch.model_validate(doc)  # what the daemon would accept
    vms = {v["uuid"]: v for v in doc["vms"]}
    spin, idle = vms[real_guests.spin.uuid], vms[real_guests.idle.uuid]

    assert spin["customer"] == real_guests.spin.project_uuid
    assert idle["customer"] == real_guests.idle.project_uuid
    assert spin["flavor"]["vcpus"] == 1 and spin["flavor"]["memory_bytes"] == 96 * 2**20

    # The spinner burns (nearly) its one vCPU; the idle guest next to nothing.
    assert spin["cpu_s"] > 0.25 * span_s
    assert spin["cpu_s"] > 5 * idle["cpu_s"]
    # The spinner reads and writes its disk and sends on its NIC; memory is resident bytes × s.
    assert spin["disk_read_bytes"] > 0 and spin["disk_write_bytes"] > 0
    assert spin["network_tx_bytes"] > 0
    assert idle["disk_read_bytes"] == 0
    assert spin["memory_byte_s"] > 0 and idle["memory_byte_s"] > 0
    assert doc["capacity"]["cpu_cores"] >= 1


@pytest.mark.parametrize("collector_kind", ["libvirt", "kernel"])
def test_a_guest_within_its_flavor_is_charged_at_most_its_flavor(
    real_guests: RealGuests, tmp_path, collector_kind: str
) -> None:
    """QEMU's own overhead is not the customer's (issue 27): an idle 96 MiB guest's QEMU
    holds ~200 MiB, but the batch charges it at most its flavor, whichever collector reads
    it (the rule is :func:`gmd.agent.collect.counters.charged_memory`)."""
    from gmd.agent.collect.kernel import KernelCollector
    from gmd.agent.collect.libvirt import LibvirtCollector
    from gmd.agent.loop import dry_run_batch

    config = parse_agent(
        {
            "agent": {
                "libvirt_uri": real_guests.uri,
                "host": "realvm-host",
                "tick_s": 2,
                "spool_path": str(tmp_path / "spool.db"),
                "network_bytes_per_s": 1.25e8,
            }
        }
    )
    kinds = {"libvirt": LibvirtCollector, "kernel": KernelCollector}
    collector = kinds[collector_kind](config.libvirt_uri)
    try:
        before = _accounted_cpu_s()
        doc, span_s = dry_run_batch(config, collector)
        after = _accounted_cpu_s()
        resident = {v.uuid: v.memory_rss_bytes for v in collector.collect().vms}
    finally:
        collector.close()
    # The host's own busy time (issue 27): this machine's /proc/stat, at least what the
    # guests' QEMUs used, and no more than its cores could give. /proc/stat samples busy time
    # by the tick; on a VM whose hypervisor deschedules it without reporting steal (as CI's
    # Firecracker machine did: busy 1.72 core-s beside the guests' 2.04), the ticks it missed
    # are in no column, while the guests' CPU time (the scheduler's clock) includes that time.
    # What the kernel left unaccounted over a window holding the span is measured here, at the
    # same moment, and allowed for; the daemon takes the larger of host busy and the VMs' use.
    guests_cpu_s = sum(v["cpu_s"] for v in doc["vms"])
    unaccounted_s = max(0.0, (after[0] - before[0]) * after[2] - (after[1] - before[1]))
    assert guests_cpu_s * 0.9 <= doc["host_cpu_s"] + unaccounted_s, (unaccounted_s, span_s)
    assert doc["host_cpu_s"] <= doc["capacity"]["cpu_cores"] * span_s * 1.1
    vms = {v["uuid"]: v for v in doc["vms"]}
    for guest in real_guests.guests:
        vm = vms[guest.uuid]
        flavor = vm["flavor"]["memory_bytes"]
        assert flavor == 96 * 2**20
        assert 0 < vm["memory_byte_s"] <= flavor * span_s * (1 + 1e-9), (guest.name, vm, span_s)
        print(
            f"{collector_kind}: {guest.role} guest resident {resident[guest.uuid] / 2**20:.1f}"
            f" MiB, charged {vm['memory_byte_s'] / span_s / 2**20:.1f} MiB (flavor"
            f" {flavor / 2**20:g} MiB); host busy {doc['host_cpu_s']:.2f} core-s, guests"
            f" {guests_cpu_s:.2f}, over {span_s:.2f} s"
        )


def _accounted_cpu_s() -> tuple[float, float, int]:
    """(monotonic seconds, every column of ``/proc/stat``'s ``cpu`` line in seconds, the CPUs
    online): how much CPU time the kernel accounted to any state, busy or idle, by now."""
    from gmd.agent.collect.host import PROC_STAT, parse_proc_stat_ticks

    now = time.monotonic()
    text = PROC_STAT.read_text()
    lines = [line.split() for line in text.splitlines()]
    online = sum(1 for f in lines if f and f[0].startswith("cpu") and f[0][3:].isdigit())
    return now, sum(parse_proc_stat_ticks(text).values()) / os.sysconf("SC_CLK_TCK"), online
