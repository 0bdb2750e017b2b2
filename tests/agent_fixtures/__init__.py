"""Fixtures for the agent's tests: test-driver hosts, and a scripted collector."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gmd.agent.collect.base import (
    FailureKind,
    Flavor,
    HostReading,
    HostResources,
    Ownership,
    ReadFailure,
    VmReading,
)

NODE = Path(__file__).with_name("node.xml")
NOVA_11 = "http://openstack.org/xmlns/libvirt/nova/1.1"


def uri(path: Path) -> str:
    """The test driver's URI for a node file (it wants an absolute path)."""
    return f"test://{path.resolve()}"


def many_domains_node(path: Path, n: int, *, stopped: int = 0) -> Path:
    """A node file with ``n`` running Nova domains (project ``proj-{i % 7}``, one disk, one
    interface each) and ``stopped`` stopped ones."""
    domains = []
    for i in range(n + stopped):
        runstate = "<test:runstate>5</test:runstate>" if i >= n else ""
        domains.append(
            f"""<domain type='test' xmlns:test='http://libvirt.org/schemas/domain/test/1.0'>
  <name>vm-{i:04d}</name><uuid>00000000-0000-4000-8000-{i:012d}</uuid>
  <memory unit='MiB'>{512 * (1 + i % 4)}</memory><vcpu>{1 + i % 4}</vcpu>
  <os><type>hvm</type></os>
  <metadata><nova:instance xmlns:nova="{NOVA_11}">
    <nova:flavor name="f{i % 4}"><nova:memory>{512 * (1 + i % 4)}</nova:memory>
      <nova:vcpus>{1 + i % 4}</nova:vcpus></nova:flavor>
    <nova:owner><nova:project uuid="proj-{i % 7}">p</nova:project></nova:owner>
  </nova:instance></metadata>
  <devices>
    <disk type='file' device='disk'><source file='/img/{i}'/><target dev='vda'/></disk>
    <interface type='ethernet'><target dev='tap{i}'/></interface>
  </devices>
  {runstate}
</domain>"""
        )
    path.write_text(
        "<node><cpu><nodes>1</nodes><sockets>1</sockets><cores>32</cores><threads>1</threads>"
        "<mhz>2000</mhz></cpu><memory>134217728</memory>" + "".join(domains) + "</node>"
    )
    return path


@dataclass
class ScriptedVm:
    """A VM whose counters grow at fixed rates with the scripted clock."""

    uuid: str
    customer: str
    cores: float = 1.0
    rss_bytes: int = 2**30
    read_bytes_per_s: int = 1000
    write_bytes_per_s: int = 500
    rx_bytes_per_s: int = 2000
    tx_bytes_per_s: int = 100
    flavor: Flavor = field(default_factory=lambda: Flavor(2, 2**31))
    started_s: float = 0.0
    run_id: int = 1

    def reading(self, now_s: float) -> VmReading:
        up = now_s - self.started_s
        return VmReading(
            uuid=self.uuid,
            run_id=self.run_id,
            taken_s=now_s,
            cpu_time_ns=round(up * self.cores * 1e9),
            memory_rss_bytes=self.rss_bytes,
            disks={"vda": (round(up * self.read_bytes_per_s), round(up * self.write_bytes_per_s))},
            nics={"tap0": (round(up * self.rx_bytes_per_s), round(up * self.tx_bytes_per_s))},
            owner=Ownership(self.customer, "nova/1.1", self.flavor),
        )


class ScriptedCollector:
    """A collector (the :class:`gmd.agent.collect.base.Collector` interface) on a scripted clock."""

    def __init__(self, clock: Callable[[], float], vms: list[ScriptedVm]) -> None:
        self.clock, self.vms = clock, vms
        self.down = False

    def collect(self) -> HostReading:
        now = self.clock()
        if self.down:
            return HostReading(
                now, False, errors=(ReadFailure(FailureKind.host, "scripted: libvirt down"),)
            )
        readings = tuple(vm.reading(now) for vm in self.vms)
        return HostReading(now, True, readings, frozenset(vm.uuid for vm in self.vms))

    def resources(self) -> HostResources | None:
        return None if self.down else HostResources(16, 64 * 2**30)

    def close(self) -> None:
        pass
