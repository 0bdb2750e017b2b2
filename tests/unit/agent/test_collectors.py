"""The collectors' registry: every kind that reads a host has its collector, and ``auto``
chooses as documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from gmd.agent.collect.kernel import KernelCollector
from gmd.agent.collect.libvirt import LibvirtCollector
from gmd.agent.collectors import HOST_COLLECTORS, CollectorUnavailable, choose, host_collector
from gmd.agent.config import CollectorKind, parse_agent
from tests.support.agent_fixtures import NODE


def config(**agent: object):  # type: ignore[no-untyped-def]
    return parse_agent({"agent": {"host": "cmp-001", **agent}}, "test.toml")


def test_every_kind_that_reads_a_host_has_a_collector() -> None:
    reading = set(CollectorKind) - {CollectorKind.auto, CollectorKind.replay}
    assert set(HOST_COLLECTORS) == reading


def test_auto_reads_a_remote_or_test_driver_through_libvirt() -> None:
    kind, why = choose(config(libvirt_uri=f"test://{NODE}"))
    assert kind is CollectorKind.libvirt
    assert "is not this machine's system QEMU driver" in why
    collector, _why = host_collector(config(libvirt_uri=f"test://{NODE}"))
    try:
        assert isinstance(collector, LibvirtCollector)
        assert collector.collect().ok
    finally:
        collector.close()


def test_a_named_kind_is_taken_as_named() -> None:
    kind, why = choose(config(collector="kernel", libvirt_uri=f"test://{NODE}"))
    assert (kind, why) == (CollectorKind.kernel, "agent.collector = kernel")
    collector, _why = host_collector(config(collector="kernel", libvirt_uri=f"test://{NODE}"))
    try:
        assert isinstance(collector, KernelCollector)
    finally:
        collector.close()


def test_replay_is_not_a_host_collector(tmp_path: Path) -> None:
    (tmp_path / "1.csv").write_text("")
    with pytest.raises(CollectorUnavailable, match="does not read a host"):
        host_collector(config(collector="replay", replay_dir=str(tmp_path)))
