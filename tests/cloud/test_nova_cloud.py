"""The whole small cloud (tests/scripts/nova_cloud.sh) does what gmd relies on: project members boot
real guests through Nova, Nova's domain metadata names their Keystone projects, a spinning guest
burns CPU, and deleting a server through the API removes its domain."""

from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable

from tests.support.agent_fixtures import NODE
from tests.support.nova_support import NovaCloud, Server

pytest_plugins = ("tests.support.nova_support",)

NOVA_NS = "http://openstack.org/xmlns/libvirt/nova/1.1"
FIXTURE_XML = NODE.with_name("nova34_domain.xml")
POLL_TIMEOUT_S = 120.0


def poll(what: str, check: Callable[[], bool], timeout_s: float = POLL_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not after {timeout_s:.0f} s"
        time.sleep(0.5)


def domain_names(nova: NovaCloud) -> set[str]:
    conn = nova.libvirt()
    try:
        return {d.name() for d in conn.listAllDomains() if d.name().startswith(nova.domain_prefix)}
    finally:
        conn.close()


def test_members_boot_real_guests_nova_names_their_projects_and_delete_removes_them(
    nova: NovaCloud,
) -> None:
    spin = nova.boot("acme", "spin")
    servers: list[Server] = [spin]
    try:
        servers.append(nova.boot("initech", "idle"))
        placed_on_the_compute_host(nova, servers)
        for server in servers:
            owned_as_nova_wrote(nova, server)
        if os.environ.get("GMD_SAVE_NOVA_XML"):
            save_domain_xml(nova, spin)
        conn = nova.libvirt()
        try:
            spinning = conn.lookupByUUIDString(spin.id)
            first = spinning.info()[4]  # cpu time, ns
            poll("the spin guest's CPU time grows", lambda: spinning.info()[4] > first + 10**9)
        finally:
            conn.close()
    finally:
        for server in servers:
            nova.delete(server)
    poll(
        "the deleted servers' domains are gone",
        lambda: not {s.domain for s in servers} & domain_names(nova),
    )


def placed_on_the_compute_host(nova: NovaCloud, servers: list[Server]) -> None:
    """Nova placed each on the one compute host, by the names cloud.json gives for it."""
    admin = nova.connect("admin")
    try:
        for server in servers:
            shown = admin.compute.get(f"/servers/{server.id}").json()["server"]
            assert shown["OS-EXT-SRV-ATTR:host"] == nova.info["compute_host"]
            assert shown["OS-EXT-SRV-ATTR:hypervisor_hostname"] == nova.info["hypervisor_hostname"]
    finally:
        admin.close()


def owned_as_nova_wrote(nova: NovaCloud, server: Server) -> None:
    """Its domain runs, named by the prefix, and Nova's metadata names its Keystone project."""
    conn = nova.libvirt()
    try:
        assert server.domain.startswith(nova.domain_prefix)
        dom = conn.lookupByUUIDString(server.id)
        assert dom.name() == server.domain
        assert dom.isActive()
        xml = dom.XMLDesc(0)
    finally:
        conn.close()
    owner = ET.fromstring(xml).find(f"metadata/{{{NOVA_NS}}}instance/{{{NOVA_NS}}}owner")
    assert owner is not None, xml
    project = owner.find(f"{{{NOVA_NS}}}project")
    assert project is not None
    assert project.get("uuid") == nova.projects[server.project]
    assert project.text == server.project


def save_domain_xml(nova: NovaCloud, server: Server) -> None:
    """Keeps the real XML Nova wrote for the ownership parser's test
    (tests/unit/agent/collect/test_ownership.py); only when asked (GMD_SAVE_NOVA_XML), so a run
    leaves the committed file alone. Only the instances directory is rewritten, to Nova's
    default: this checkout's path would tie the file to one machine."""
    conn = nova.libvirt()
    try:
        xml = conn.lookupByUUIDString(server.id).XMLDesc(0)
    finally:
        conn.close()
    FIXTURE_XML.write_text(xml.replace(f"{nova.run}/instances/", "/var/lib/nova/instances/"))
