"""What a host offers per second: cores and RAM from the hypervisor, disk and network
bandwidth from the configuration (network defaulting to the link speed).

The daemon turns capacity × interval length into the host's supply, so a wrong figure here
makes every VM on the host look more or less greedy; hence the log line that says where each
figure came from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from gmd.agent.collect.amounts import FieldAmounts
from gmd.agent.collect.base import HostResources
from gmd.wire import CAPACITY_FIELDS

log = logging.getLogger(__name__)

SYS_CLASS_NET = Path("/sys/class/net")
FALLBACK_NETWORK_BYTES_PER_S = 1e9 / 8
"""1 Gbit/s, used when neither the configuration nor any physical link gives a speed."""


class HostCapacity(FieldAmounts):
    """What the host offers per second: one amount per :data:`gmd.wire.CAPACITY_FIELDS`
    (:class:`~gmd.agent.collect.amounts.FieldAmounts`)."""

    FIELDS = CAPACITY_FIELDS
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Bandwidth:
    """The host's disk and network bandwidth, which libvirt does not know: decided once at
    start (configured, else the link speed) and joined to each reading of cores and RAM."""

    disk_bytes_per_s: float
    network_bytes_per_s: float
    network_source: str

    @classmethod
    def of(
        cls,
        disk_bytes_per_s: float,
        configured_network: float | None,
        sys_class_net: Path = SYS_CLASS_NET,
    ) -> Bandwidth:
        network, source = network_bytes_per_s(configured_network, sys_class_net)
        return cls(disk_bytes_per_s, network, source)

    def capacity(self, resources: HostResources) -> HostCapacity:
        return HostCapacity.of(
            cpu_cores=resources.cpu_cores,
            memory_bytes=resources.memory_bytes,
            disk_bytes_per_s=self.disk_bytes_per_s,
            network_bytes_per_s=self.network_bytes_per_s,
        )


def link_speeds_mbit(sys_class_net: Path = SYS_CLASS_NET) -> dict[str, int]:
    """Speed in Mbit/s of each physical or bonded interface that reports one.

    Physical NICs have a ``device`` link, bonds a ``bonding`` directory; bridges, taps and
    veths are skipped (a tap claims 10 Mbit/s, a veth 10 Gbit/s: neither is the host's link).
    A link that is down, or virtio's, reports -1 or refuses to read.
    """
    speeds: dict[str, int] = {}
    if not sys_class_net.is_dir():
        return speeds
    for iface in sorted(sys_class_net.iterdir()):
        if not ((iface / "device").exists() or (iface / "bonding").is_dir()):
            continue
        try:
            speed = int((iface / "speed").read_text().strip())
        except (OSError, ValueError):
            continue
        if speed > 0:
            speeds[iface.name] = speed
    return speeds


def network_bytes_per_s(
    configured: float | None, sys_class_net: Path = SYS_CLASS_NET
) -> tuple[float, str]:
    """The host's network bandwidth in bytes/s and where it came from (for the log).

    The fastest link, not the sum: hosts usually have a fast data link beside a slow management
    one, and VMs' traffic uses the former.
    """
    if configured is not None:
        return configured, "agent.network_bytes_per_s"
    speeds = link_speeds_mbit(sys_class_net)
    if speeds:
        name = max(speeds, key=lambda n: speeds[n])
        return speeds[name] * 1e6 / 8, f"link speed of {name} ({speeds[name]} Mbit/s)"
    return (
        FALLBACK_NETWORK_BYTES_PER_S,
        f"no physical link in {sys_class_net} reports a speed: assuming 1 Gbit/s"
        " (set agent.network_bytes_per_s)",
    )
