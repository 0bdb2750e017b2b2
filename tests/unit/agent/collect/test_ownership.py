"""Who owns a VM, from domain XML alone (the cases the test-driver node does not cover)."""

from __future__ import annotations

import calendar
import time

from gmd.agent.collect.base import DomainFlavor, Ownership
from gmd.agent.collect.ownership import ownership_from_xml
from tests.support.agent_fixtures import NODE

NOVA_11 = "http://openstack.org/xmlns/libvirt/nova/1.1"
NOVA_10 = "http://openstack.org/xmlns/libvirt/nova/1.0"


def domain(metadata: str, memory: str = "<memory>2097152</memory>", vcpu: int = 2) -> str:
    return (
        f"<domain type='kvm'><name>d</name>{memory}<vcpu>{vcpu}</vcpu>"
        f"<metadata>{metadata}</metadata></domain>"
    )


def test_nova_11_wins_over_10_and_gmd() -> None:
    xml = domain(
        f'<nova:instance xmlns:nova="{NOVA_10}"><nova:owner><nova:project uuid="old"/>'
        f"</nova:owner></nova:instance>"
        f'<nova:instance xmlns:nova="{NOVA_11}"><nova:owner><nova:project uuid="new"/>'
        f"</nova:owner></nova:instance>"
        '<gmd:vm xmlns:gmd="urn:gmd:libvirt:1" customer="mine"/>'
    )
    # No Nova flavor: the domain's own size is what it was configured with.
    assert ownership_from_xml(xml) == Ownership("new", "nova/1.1", DomainFlavor(2.0, 2 * 2**30))


def test_nova_11_without_a_project_falls_back_to_10() -> None:
    xml = domain(
        f'<nova:instance xmlns:nova="{NOVA_11}"><nova:name>x</nova:name></nova:instance>'
        f'<nova:instance xmlns:nova="{NOVA_10}"><nova:owner><nova:project uuid="p10"/>'
        f"</nova:owner><nova:flavor><nova:vcpus>4</nova:vcpus><nova:memory>512</nova:memory>"
        f"</nova:flavor><nova:creationTime>not a time</nova:creationTime></nova:instance>"
    )
    assert ownership_from_xml(xml) == Ownership("p10", "nova/1.0", DomainFlavor(4.0, 512 * 2**20))


def test_gmd_namespace_then_default_then_unknown() -> None:
    gmd = domain('<gmd:vm xmlns:gmd="urn:gmd:libvirt:1" customer=" lab " memory_mib="1024"/>')
    assert ownership_from_xml(gmd, "ops") == Ownership("lab", "gmd", DomainFlavor(2.0, 2**30))
    # A customer name the ledger would refuse (control characters) is no owner.
    bad = domain('<gmd:vm xmlns:gmd="urn:gmd:libvirt:1" customer="a&#10;b"/>')
    assert ownership_from_xml(bad, "ops").source == "default"
    plain = domain("", memory="<memory unit='GiB'>4</memory>", vcpu=3)
    assert ownership_from_xml(plain, "ops") == Ownership(
        "ops", "default", DomainFlavor(3.0, 4 * 2**30)
    )
    assert ownership_from_xml(plain) == Ownership(
        "unknown", "unknown", DomainFlavor(3.0, 4 * 2**30)
    )


def test_no_metadata_element_at_all() -> None:
    xml = "<domain><name>bare</name><memory unit='MB'>1000</memory></domain>"
    assert ownership_from_xml(xml) == Ownership("unknown", "unknown", DomainFlavor(None, 1e9))


def test_the_project_name_beside_the_uuid_if_the_daemon_would_accept_it() -> None:
    def owner(project: str) -> Ownership:
        return ownership_from_xml(
            domain(
                f'<nova:instance xmlns:nova="{NOVA_11}"><nova:owner>{project}</nova:owner>'
                "</nova:instance>"
            )
        )

    assert owner('<nova:project uuid="p1"> acme </nova:project>').customer_name == "acme"
    assert owner('<nova:project uuid="p1"/>').customer_name is None
    # A name the daemon refuses (a bidi override, too long) is dropped, never the usage.
    hidden = owner('<nova:project uuid="p1">acme\u202egnp</nova:project>')
    assert (hidden.customer, hidden.customer_name) == ("p1", None)
    assert owner(f'<nova:project uuid="p1">{"x" * 256}</nova:project>').customer_name is None


def test_the_domain_xml_nova_34_really_wrote() -> None:
    """tests/support/agent_fixtures/nova34_domain.xml is what a real Nova 34 defined for a server a
    member of project acme booted (saved by tests/cloud/test_nova_cloud.py with GMD_SAVE_NOVA_XML=1,
    the instances directory rewritten to Nova's default /var/lib/nova/instances): its full
    metadata (flavor id, extraSpecs, image properties, root, ports) parses as written."""
    xml = NODE.with_name("nova34_domain.xml").read_text()
    created = calendar.timegm(time.strptime("2026-11-26 22:47:09", "%Y-%m-%d %H:%M:%S"))
    assert ownership_from_xml(xml) == Ownership(
        "e492db59c98e4f7cb004ecc37c2fb176",
        "nova/1.1",
        DomainFlavor(1.0, 128 * 2**20),
        created_s=created,
        customer_name="acme",
    )
