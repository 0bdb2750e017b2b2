"""Fixtures for the agent's tests: test-driver hosts (node.xml: its domains, and the libvirt
collector reading it through a connection with hooks), and a scripted collector."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libvirt

from gmd.agent.collect.base import (
    DomainFlavor,
    FailureKind,
    HostReading,
    HostResources,
    Ownership,
    ReadFailure,
    VmReading,
)
from gmd.agent.collect.libvirt import LibvirtCollector

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
    flavor: DomainFlavor = field(default_factory=lambda: DomainFlavor(2, 2**31))
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


# --- node.xml's domains, and the libvirt collector on it through a connection with hooks ----------

NOVA = "a1a1a1a1-0000-4000-8000-000000000001"
NOVA10 = "a1a1a1a1-0000-4000-8000-000000000002"
GMD = "a1a1a1a1-0000-4000-8000-000000000003"
ORPHAN = "a1a1a1a1-0000-4000-8000-000000000004"
STOPPED = "a1a1a1a1-0000-4000-8000-000000000005"


def unreachable_libvirt_error() -> libvirt.libvirtError:
    """A real "connection refused" from libvirt's remote driver."""
    try:
        libvirt.openReadOnly("qemu+tcp://127.0.0.1:1/system")
    except libvirt.libvirtError as exc:
        return exc
    raise AssertionError("a libvirt connection to port 1 succeeded")


class Conn:
    """A real test-driver connection with hooks around the calls the collector makes."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.after_listing: list[Any] = []
        self.fail_listing: libvirt.libvirtError | None = None
        self.bulk_extra: dict[str, dict[str, Any]] = {}
        self.wrap: dict[str, dict[str, Any]] = {}
        self.per_domain_calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def getAllDomainStats(self, stats: int, flags: int) -> list[tuple[Any, dict]]:
        if self.fail_listing is not None:
            exc, self.fail_listing = self.fail_listing, None
            raise exc
        pairs = self.real.getAllDomainStats(stats, flags)
        for hook in self.after_listing:
            hook(self.real)
        self.after_listing = []
        out = []
        for dom, st in pairs:
            st = {**st, **self.bulk_extra.get(dom.UUIDString(), {})}
            out.append((Dom(dom, self), st))
        return out


class Dom:
    def __init__(self, real: Any, conn: Conn) -> None:
        self.real, self.conn = real, conn

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if name in ("info", "memoryStats", "blockStats", "interfaceStats"):
            self.conn.per_domain_calls += 1
        hooks = self.conn.wrap.get(self.real.UUIDString(), {})
        if name in hooks:
            return lambda *a: hooks[name](self.real, *a)
        return attr


def collector(path: Path = NODE, **kw: Any) -> tuple[LibvirtCollector, list[Conn]]:
    conns: list[Conn] = []

    def opener(u: str) -> Conn:
        conns.append(Conn(libvirt.open(u)))
        return conns[-1]

    return LibvirtCollector(uri(path), opener=opener, **kw), conns
