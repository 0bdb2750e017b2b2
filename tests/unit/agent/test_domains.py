"""The agent's domain filter (``agent.domain_prefixes``, ``agent.only_nova``): on a hypervisor
shared with other work, the domains outside it are neither measured (by either collector) nor
throttled (by either applier), and the agent says at start which domains it measures.

On libvirt's test driver: tests/support/agent_fixtures/node.xml has instance-00000001 (Nova 1.1),
instance-00000002 (Nova 1.0), lab-vm (gmd's own metadata) and orphan (no metadata) running.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import libvirt
import pytest

from gmd.agent.apply.libvirt import LibvirtApplier
from gmd.agent.collect.ownership import DomainFilter
from gmd.agent.config import parse_agent
from gmd.common.config import ConfigError
from tests.support.agent_fixtures import GMD, NODE, NOVA, NOVA10, ORPHAN, collector, uri
from tests.support.appliers import (
    NODE as APPLIER_NODE,
    UUID_A,
    UUID_B,
    SchedConn,
    dump,
    item,
    plan,
    weight,
)
from tests.support.kernel_host import TEST_UUID, v1_tree


@pytest.mark.parametrize(
    ("domains", "measured"),
    [
        (DomainFilter(), {NOVA, NOVA10, GMD, ORPHAN}),
        (DomainFilter(("instance-", "lab-")), {NOVA, NOVA10, GMD}),
        (DomainFilter(only_nova=True), {NOVA, NOVA10}),
        (DomainFilter(("instance-00000001", "lab-"), only_nova=True), {NOVA}),
    ],
)
@pytest.mark.parametrize("bulk", [True, False])
def test_the_libvirt_collector_reads_only_the_domains_the_filter_admits(
    domains: DomainFilter, measured: set[str], bulk: bool
) -> None:
    c, _ = collector(domains=domains, bulk=bulk)
    for _tick in range(2):  # the second from the cached descriptions
        reading = c.collect()
        assert reading.ok and reading.errors == ()
        assert {v.uuid for v in reading.vms} == measured
        assert reading.listed == measured  # the others are not even running, for gmd
    c.close()


@pytest.mark.parametrize(
    ("domains", "measured"),
    [
        (DomainFilter(), {TEST_UUID}),
        (DomainFilter(("te",)), {TEST_UUID}),
        (DomainFilter(("instance-",)), set()),
        (DomainFilter(only_nova=True), set()),  # "test" carries no Nova metadata
    ],
)
def test_the_kernel_collector_reads_only_the_domains_the_filter_admits(
    tmp_path: Path, domains: DomainFilter, measured: set[str]
) -> None:
    kernel = v1_tree(tmp_path)
    kernel.domains = domains
    try:
        for _tick in range(2):
            reading = kernel.collect()
            assert reading.ok and {v.uuid for v in reading.vms} == measured
            assert reading.listed == measured and reading.fallbacks == frozenset()
    finally:
        kernel.close()


@pytest.fixture
def conn(tmp_path: Path) -> Any:
    node = tmp_path / "node.xml"
    node.write_text(APPLIER_NODE)
    c = libvirt.open(f"test://{node}")
    yield c
    c.close()


def test_the_applier_leaves_a_domain_outside_the_filter_alone(conn: Any, tmp_path: Path) -> None:
    """vm-b is throttled by an agent without a filter; the agent restarted with
    ``domain_prefixes = ["vm-a"]`` puts it back, says once why it is left alone, and still
    throttles vm-a."""
    state = tmp_path / "s.json"
    sched = SchedConn(conn)  # scheduler parameters as the QEMU driver keeps them
    before = LibvirtApplier(sched, state_path=state)
    assert dump(before.sync(plan("on", item(UUID_B)))) == [(UUID_B, "apply", True)]
    assert weight(conn, UUID_B) == 50

    applier = LibvirtApplier(sched, state_path=state, domains=DomainFilter(("vm-a",)))
    results = applier.sync(plan("on", item(UUID_A), item(UUID_B)))
    assert dump(results) == [
        (UUID_A, "apply", True),
        (UUID_B, "restore", True),
        (UUID_B, "apply", False),
    ]
    assert results[2].error == (
        f"VM {UUID_B} (vm-b): outside this agent's domains named vm-a*: left alone"
    )
    assert weight(conn, UUID_A) == 50 and weight(conn, UUID_B) == 0
    assert set(applier.remembered) == {UUID_A}
    assert applier.sync(plan("on", item(UUID_A), item(UUID_B))) == []  # said once

    # Nova-only: none of the test host's domains has Nova's metadata.
    nova = LibvirtApplier(
        conn, state_path=tmp_path / "n.json", domains=DomainFilter(only_nova=True)
    )
    results = nova.sync(plan("dry-run", item(UUID_B)))
    assert dump(results) == [(UUID_B, "would_apply", False)]
    assert "outside this agent's domains with Nova's metadata" in (results[0].error or "")


def test_the_configuration_keys_and_their_errors() -> None:
    config = parse_agent({"agent": {"domain_prefixes": ["instance-"], "only_nova": True}})
    assert config.domains == DomainFilter(("instance-",), only_nova=True)
    assert parse_agent({}).domains == DomainFilter()
    for bad, words in [
        ({"domain_prefixes": "instance-"}, "agent.domain_prefixes: expected"),
        ({"domain_prefixes": [""]}, "agent.domain_prefixes: '': each prefix"),
        ({"domain_prefixes": [3]}, "agent.domain_prefixes: 3: each prefix"),
        ({"only_nova": "yes"}, "agent.only_nova: expected"),
    ]:
        with pytest.raises(ConfigError, match=words):
            parse_agent({"agent": bad}, "gmd.toml")


def test_gmd_agent_says_which_domains_it_measures_and_sends_only_those(tmp_path: Path) -> None:
    """The real command, ``--dry-run`` (two readings, the batch on stdout)."""
    toml = tmp_path / "gmd.toml"
    toml.write_text(
        f'[agent]\nlibvirt_uri = "{uri(NODE)}"\ncollector = "libvirt"\ntick_s = 0.05\n'
        'domain_prefixes = ["instance-", "lab-"]\nonly_nova = true\n'
    )
    agent = Path(sys.executable).with_name("gmd-agent")
    out = subprocess.run(
        [str(agent), "--config", str(toml), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert {vm["uuid"] for vm in json.loads(out.stdout)["vms"]} == {NOVA, NOVA10}
    assert (
        "measuring and throttling domains named instance-* or lab-*, with Nova's metadata"
        in out.stderr
    )
