"""The real-VM fixture works: a real libvirtd reports the two guests' counters as expected.

Raw libvirt calls only; the agent's own real-VM test reuses the same `real_guests` fixture.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

import pytest

try:
    import libvirt
except ImportError:  # the real_guests fixture, which every test here uses, says what is missing
    libvirt = None

if TYPE_CHECKING:
    from tests.support.realvm import RealGuests

# The real_guests fixture: one pair of guests per session, shared by every module naming the
# plugin. (Importing tests.support.realvm at module level here would make pytest warn that it cannot
# rewrite the plugin's asserts: import its names inside the tests.)
pytest_plugins = ("tests.support.realvm",)

SAMPLE_GAP = 4.0  # seconds between the two samples


def _sample(conn: libvirt.virConnect, guests: RealGuests) -> dict[str, dict]:
    """One bulk call, as the agent makes it, keeping our two domains (other sessions may run)."""
    stats = {dom.name(): s for dom, s in conn.getAllDomainStats() if dom.name() in guests.names}
    missing = set(guests.names) - set(stats)
    assert not missing, f"getAllDomainStats() did not report {sorted(missing)}"
    return stats


@pytest.fixture
def conn(real_guests: RealGuests):
    c = real_guests.connect()
    yield c
    c.close()


def test_the_spinner_takes_the_cpu_and_moves_its_disk_and_network(
    real_guests: RealGuests, conn: libvirt.virConnect
) -> None:
    spin, idle = real_guests.spin.name, real_guests.idle.name
    t0 = time.monotonic()
    before = _sample(conn, real_guests)
    time.sleep(SAMPLE_GAP)
    after = _sample(conn, real_guests)
    elapsed_ns = (time.monotonic() - t0) * 1e9

    def delta(name: str, key: str) -> int:
        assert key in before[name] and key in after[name], f"{name} has no {key} in its stats"
        return after[name][key] - before[name][key]

    cpu_spin, cpu_idle = delta(spin, "cpu.time"), delta(idle, "cpu.time")
    assert cpu_spin > 0.25 * elapsed_ns, f"{spin} used {cpu_spin / elapsed_ns:.0%} of a core"
    assert cpu_spin > 5 * cpu_idle, f"cpu.time: {spin} +{cpu_spin} ns, {idle} +{cpu_idle} ns"
    assert delta(spin, "vcpu.0.time") > 0
    assert delta(spin, "block.0.rd.bytes") > 0
    assert delta(spin, "block.0.wr.bytes") > 0
    assert delta(spin, "net.0.tx.bytes") > 0
    assert delta(idle, "block.0.rd.bytes") == 0
    for guest in real_guests.guests:
        s = after[guest.name]
        assert s["state.state"] == libvirt.VIR_DOMAIN_RUNNING
        assert s["balloon.rss"] > 0, f"{guest.name} reports no balloon.rss"
        assert s["balloon.current"] == guest.memory_mib * 1024
        assert s["net.0.name"] == guest.tap
        assert s["block.0.name"] == guest.disk_target
        assert s["block.0.path"] == str(guest.disk)


def test_the_guests_carry_nova_ownership_metadata(
    real_guests: RealGuests, conn: libvirt.virConnect
) -> None:
    from tests.support.realvm import NOVA_NS

    for guest in real_guests.guests:
        dom = conn.lookupByName(guest.name)
        assert dom.UUIDString() == guest.uuid
        meta = ET.fromstring(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NOVA_NS))
        assert meta.find("owner/project").get("uuid") == guest.project_uuid
        assert meta.find("owner/user").get("uuid") == guest.user_uuid
        flavor = meta.find("flavor")
        assert flavor.get("name") == "m1.tiny"
        assert int(flavor.findtext("vcpus")) == guest.vcpus == 1
        assert int(flavor.findtext("memory")) == guest.memory_mib
    assert len(set(real_guests.project_uuids)) == 2


def test_a_live_vcpu_quota_throttles_the_spinner_and_leaves_its_definition_alone(
    real_guests: RealGuests, conn: libvirt.virConnect
) -> None:
    """What issue 5 builds on: LIVE tuning takes effect; the persistent XML keeps no trace."""
    dom = conn.lookupByName(real_guests.spin.name)
    live, config = libvirt.VIR_DOMAIN_AFFECT_LIVE, libvirt.VIR_DOMAIN_AFFECT_CONFIG
    unlimited = dom.schedulerParametersFlags(live)["vcpu_quota"]
    try:
        dom.setSchedulerParametersFlags({"vcpu_quota": 20000, "vcpu_period": 100000}, live)
        assert dom.schedulerParametersFlags(live)["vcpu_quota"] == 20000
        assert dom.schedulerParametersFlags(config)["vcpu_quota"] == 0
        assert "<cputune>" not in dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        time.sleep(0.5)  # let the quota settle in before measuring
        t0, c0 = time.monotonic(), dom.info()[4]
        time.sleep(2.0)
        share = (dom.info()[4] - c0) / ((time.monotonic() - t0) * 1e9)
        assert share < 0.4, f"at 20 % vcpu quota the spinner still used {share:.0%} of a core"
    finally:
        # Unthrottled again for the session's other tests.
        dom.setSchedulerParametersFlags({"vcpu_quota": unlimited}, live)
    assert dom.schedulerParametersFlags(live)["vcpu_quota"] == unlimited
