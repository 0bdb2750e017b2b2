"""Who owns a VM, and its flavor, from the domain XML. Pure functions on parsed XML.

Order of precedence for the customer:

1. Nova's metadata, namespace ``http://openstack.org/xmlns/libvirt/nova/1.1`` (Nova ≥ 2023.1),
   else ``…/nova/1.0`` (older Nova): ``<instance><owner><project uuid=…>`` is the customer,
   ``<instance><flavor><vcpus>``/``<memory>`` (MiB) the flavor, ``<creationTime>`` (UTC) the
   creation time;
2. gmd's own namespace for plain libvirt hosts, :data:`GMD_NS`:
   ``<gmd:vm xmlns:gmd="urn:gmd:libvirt:1" customer="acme" vcpus="2" memory_mib="4096"/>``;
3. the configured default customer (``agent.default_customer``);
4. :data:`~gmd.agent.collect.base.UNKNOWN_CUSTOMER`: a VM without an owner is still reported, so the
   host's use adds up, and an operator sees it under ``unknown`` in the standings.

Without a flavor in the metadata, the domain's own ``<vcpu>`` and ``<memory>`` are what it
was configured with, which is what flavor endowments mean.
"""

from __future__ import annotations

import calendar
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from gmd.agent.collect.base import UNKNOWN_CUSTOMER, DomainFlavor, Ownership
from gmd.wire import MAX_NAME, visible_name

NOVA_NS = (
    ("nova/1.1", "http://openstack.org/xmlns/libvirt/nova/1.1"),
    ("nova/1.0", "http://openstack.org/xmlns/libvirt/nova/1.0"),
)
GMD_NS = "urn:gmd:libvirt:1"
MIB = 2**20

# The ledger's customer names: 1–255 characters, no control characters (gmd.wire).
_VALID_NAME = re.compile(r"^[^\x00-\x1f]{1,255}$")
_MEMORY_UNITS = {
    "b": 1,
    "bytes": 1,
    "kb": 1000,
    "k": 1024,
    "kib": 1024,
    "mb": 1000**2,
    "m": 1024**2,
    "mib": 1024**2,
    "gb": 1000**3,
    "g": 1024**3,
    "gib": 1024**3,
    "tb": 1000**4,
    "t": 1024**4,
    "tib": 1024**4,
}


def _positive(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and 0 < value < float("inf") else None


def _customer(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return text if _VALID_NAME.match(text) else None


def _project_name(text: str | None) -> str | None:
    """The project's name as the daemon accepts names (:func:`gmd.wire.visible_name`), else
    None: a name the daemon would refuse must not make it refuse the batch, the usage."""
    if text is None:
        return None
    text = text.strip()
    try:
        return visible_name(text) if 0 < len(text) <= MAX_NAME else None
    except ValueError:
        return None


def _created_s(text: str | None) -> int | None:
    """Nova writes ``YYYY-MM-DD HH:MM:SS`` in UTC."""
    if not text:
        return None
    try:
        return calendar.timegm(time.strptime(text.strip(), "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None


def domain_flavor(root: ET.Element) -> DomainFlavor:
    """The domain's configured vCPUs and memory (``<vcpu>``, ``<memory unit=…>``)."""
    vcpus = _positive(root.findtext("vcpu"))
    memory = root.find("memory")
    memory_bytes = None
    if memory is not None:
        amount = _positive(memory.text)
        scale = _MEMORY_UNITS.get(memory.get("unit", "KiB").lower())
        if amount is not None and scale is not None:
            memory_bytes = amount * scale
    return DomainFlavor(vcpus, memory_bytes)


def _nova(instance: ET.Element, source: str, ns: str, fallback: DomainFlavor) -> Ownership | None:
    """The owner Nova wrote into ``<instance>``; None if it names no valid project."""

    def q(path: str) -> str:
        return "/".join(f"{{{ns}}}{part}" for part in path.split("/"))

    project = instance.find(q("owner/project"))
    customer = _customer(project.get("uuid")) if project is not None else None
    name = _project_name(project.text) if project is not None else None
    flavor = None
    f = instance.find(q("flavor"))
    if f is not None:
        memory_mib = _positive(f.findtext(q("memory")))
        flavor = DomainFlavor(
            _positive(f.findtext(q("vcpus"))), None if memory_mib is None else memory_mib * MIB
        )
    if customer is None:
        return None
    created_s = _created_s(instance.findtext(q("creationTime")))
    return Ownership(customer, source, flavor or fallback, created_s, name)


def ownership(root: ET.Element, default_customer: str | None = None) -> Ownership:
    """The owner, flavor and creation time of the domain whose XML ``root`` is."""
    metadata = root.find("metadata")
    fallback_flavor = domain_flavor(root)
    if metadata is not None:
        for source, ns in NOVA_NS:
            instance = metadata.find(f"{{{ns}}}instance")
            if instance is None:
                continue
            owner = _nova(instance, source, ns, fallback_flavor)
            if owner is not None:
                return owner
        mine = metadata.find(f"{{{GMD_NS}}}vm")
        if mine is not None:
            customer = _customer(mine.get("customer"))
            if customer is not None:
                memory_mib = _positive(mine.get("memory_mib"))
                flavor = DomainFlavor(
                    _positive(mine.get("vcpus")) or fallback_flavor.vcpus,
                    memory_mib * MIB if memory_mib is not None else fallback_flavor.memory_bytes,
                )
                return Ownership(customer, "gmd", flavor)
    if default_customer is not None:
        return Ownership(default_customer, "default", fallback_flavor)
    return Ownership(UNKNOWN_CUSTOMER, "unknown", fallback_flavor)


def ownership_from_xml(xml: str, default_customer: str | None = None) -> Ownership:
    """:func:`ownership` of a domain XML document (``virDomainGetXMLDesc``)."""
    return ownership(ET.fromstring(xml), default_customer)


@dataclass(frozen=True)
class DomainFilter:
    """Which of the host's domains are gmd's to measure and throttle (``agent.domain_prefixes``,
    ``agent.only_nova``): on a hypervisor shared with other work, the agent leaves the other
    domains alone. The one predicate the collectors and the appliers ask.

    ``prefixes``: a domain's name must start with one of them (empty: any name); ``only_nova``:
    its XML must carry Nova's metadata with an owner. The name is known without the XML, so
    collectors ask :meth:`admits_name` when they list and :meth:`admits_owner` once the
    domain is described.
    """

    prefixes: tuple[str, ...] = ()
    only_nova: bool = False

    @property
    def by_owner(self) -> bool:
        """Whether the owner (the domain's XML) must be read to decide."""
        return self.only_nova

    def admits_name(self, name: str) -> bool:
        return not self.prefixes or name.startswith(self.prefixes)

    def admits_owner(self, owner: Ownership) -> bool:
        return not self.only_nova or owner.source.startswith("nova/")

    def admits(self, name: str, owner: Ownership) -> bool:
        return self.admits_name(name) and self.admits_owner(owner)

    def words(self) -> str:
        """For the log: "every domain", or what a domain must be to be measured."""
        rules = []
        if self.prefixes:
            rules.append("named " + " or ".join(f"{p}*" for p in self.prefixes))
        if self.only_nova:
            rules.append("with Nova's metadata")
        return "domains " + ", ".join(rules) if rules else "every domain"


EVERY_DOMAIN = DomainFilter()
"""No filter: the default, for a hypervisor that is all the cloud's."""
