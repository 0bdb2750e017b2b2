"""Everything gmd reads from Placement, over raw HTTP on openstacksdk's adapter: the one
Placement client.

gmd-daemon's Placement view (:mod:`gmd.daemon.placement.view`, and the job that verifies
later what it could not: :mod:`gmd.daemon.placement.recheck`) reads a compute host's provider,
its inventory, the consumers with allocations on it and one consumer's allocations and
project; gmd-broker (:mod:`gmd.broker.openstack`) reads the cloud's spare VCPU from the
allocation candidates. Both read through :class:`PlacementReader`, so that the connection, its
timeout, the translation of every failure into an
:class:`~gmd.openstack.client.OpenStackError` and the parsing of Placement's answers are
written once (:class:`~gmd.openstack.client.OpenStackClient`: one way of reaching the cloud).

Calls are never retried here: a daemon's batch must not wait for Placement longer than one
call's ``timeout_s`` (what fails is verified later instead), and the broker's thread waits on
these calls (its next poll asks again anyway).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import quote

from gmd.openstack.client import (
    MalformedAnswer,
    OpenStackClient,
    OpenStackError,
    OpenStackErrorKind,
    checked,
)

if TYPE_CHECKING:
    from openstack.connection import Connection

_T = TypeVar("_T")

MICROVERSION = "1.12"
"""The first that gives a consumer's project and user with its allocations
(``GET /allocations/{consumer}``): the microversion of the provider and consumer reads."""
CANDIDATES_MICROVERSION = "1.22"
"""Allocation candidates with provider summaries (1.12) and a forbidden trait (1.22): the
microversion of :meth:`PlacementReader.spare_vcpus`."""
SPARE_QUERY = "/allocation_candidates?resources=VCPU:1&required=!COMPUTE_STATUS_DISABLED"
"""Hosts with a VCPU free that are not disabled (nova-compute sets the trait on a disabled
service's provider): what the federation may still be given."""


@dataclass(frozen=True)
class Inventory:
    """One resource class of a provider, as Placement holds it."""

    total: float
    reserved: float
    allocation_ratio: float


@dataclass(frozen=True)
class Allocation:
    """What a consumer holds of one provider, of the resources a host's claims are compared
    with: its flavor's VCPU (with PCPU, dedicated cores) and MEMORY_MB; None where the
    allocation holds none of it (a provider that is not a compute node's)."""

    vcpus: float | None
    memory_mb: float | None


@dataclass(frozen=True)
class Consumer:
    """One consumer's allocations: the providers it has them on, and its project (None when
    it has no allocations, which is how Placement answers for a consumer it does not know)."""

    providers: frozenset[str]
    project_id: str | None


class PlacementReader(OpenStackClient):
    """The reads gmd makes of Placement; each is one HTTP request, never retried.

    ``subject`` and ``hints`` are the daemon's words (its log lines and docs/operations.md
    quote them); the broker's subclass says its own. After a read that Placement did not
    answer (unavailable, timeout) nothing asks it again for ``pause_s``: a Placement that
    swallows requests would otherwise hold every batch for ``timeout_s``. ``pause_named`` is
    what the pause is called in that error's message (the setting an operator would change).
    """

    subject: ClassVar[str] = "Placement view"
    of = "of "
    hints: ClassVar[Mapping[OpenStackErrorKind, str]] = {
        OpenStackErrorKind.forbidden: "not allowed by Placement's policy: reading providers and"
        " allocations needs an admin (or service) role",
    }

    def __init__(
        self,
        cloud: str,
        *,
        timeout_s: float,
        on_call: Callable[[], object] | None = None,
        pause_s: float = 0.0,
        pause_named: str = "the pause",
        clock: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> None:
        super().__init__(cloud, timeout_s=timeout_s, retries=0, **kwargs)
        self.calls = 0
        """HTTP requests made (tests and benchmarks count them)"""
        self.pause_s = pause_s
        """after Placement could not be reached, how long nothing asks it again"""
        self._pause_named = pause_named
        self._on_call = on_call
        self._clock = clock
        self._calls_lock = threading.Lock()
        self._paused_until = float("-inf")
        self._pause_reason = ""

    def _get(
        self,
        what: str,
        path: str,
        parse: Callable[[Any], _T],
        microversion: str = MICROVERSION,
    ) -> _T:
        """``parse`` of the answer's body, within the call: whatever a malformed answer makes
        it raise becomes the client's one error kind, as a failed request does."""

        def read(conn: Connection) -> _T:
            with self._calls_lock:
                self.calls += 1
            if self._on_call is not None:
                self._on_call()
            return parse(checked(conn.placement.get(path, microversion=microversion)))

        now = self._clock()
        with self._calls_lock:
            paused, reason = now < self._paused_until, self._pause_reason
        if paused:
            raise self.error(
                OpenStackErrorKind.unavailable,
                "read",
                what,
                f"not asked again for {self._pause_named} after it failed: {reason}",
            )
        try:
            return self.call("read", what, read)
        except OpenStackError as exc:
            if exc.retryable:
                with self._calls_lock:
                    self._paused_until = self._clock() + self.pause_s
                    self._pause_reason = str(exc)
            raise

    def provider(self, name: str) -> str | None:
        """The uuid of the resource provider named ``name``; None if Placement has none."""
        return self._get(
            f"provider {name}", f"/resource_providers?name={quote(name)}", _provider(name)
        )

    def inventories(self, provider: str) -> dict[str, Inventory]:
        """The provider's inventory, by resource class."""
        path = f"/resource_providers/{provider}/inventories"
        return self._get(f"provider {provider}", path, _inventories)

    def consumers_on(self, provider: str) -> dict[str, Allocation]:
        """Every consumer with allocations on the provider, with what it holds there: one
        request for the whole host."""
        path = f"/resource_providers/{provider}/allocations"
        return self._get(f"provider {provider}", path, _consumers)

    def consumer(self, uuid: str) -> Consumer:
        """Where the consumer has allocations, and its project."""
        return self._get(f"consumer {uuid}", f"/allocations/{quote(uuid)}", _consumer)

    def spare_vcpus(self) -> float:
        """Over the compute hosts that are not disabled: VCPU capacity less use, summed (one
        request for the whole cloud: :func:`spare_of`)."""
        return self._get("every compute host", SPARE_QUERY, spare_of, CANDIDATES_MICROVERSION)


def _provider(name: str) -> Callable[[Any], str | None]:
    def parse(body: Any) -> str | None:
        items = body.get("resource_providers") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise MalformedAnswer("Placement's answer has no list 'resource_providers'")
        for item in items:
            if isinstance(item, dict) and item.get("name") == name and item.get("uuid"):
                return str(item["uuid"])
        return None

    return parse


def _inventories(body: Any) -> dict[str, Inventory]:
    items = body.get("inventories") if isinstance(body, dict) else None
    if not isinstance(items, dict):
        raise MalformedAnswer("Placement's answer has no object 'inventories'")
    out = {}
    for rc, inv in items.items():
        if isinstance(inv, dict):
            out[str(rc)] = Inventory(
                float(inv.get("total", 0)),
                float(inv.get("reserved", 0)),
                float(inv.get("allocation_ratio", 1.0)),
            )
    return out


def _consumers(body: Any) -> dict[str, Allocation]:
    items = body.get("allocations") if isinstance(body, dict) else None
    if not isinstance(items, dict):
        raise MalformedAnswer("Placement's answer has no object 'allocations'")
    return {str(c).lower(): _allocation(held) for c, held in items.items()}


def _allocation(held: Any) -> Allocation:
    resources = held.get("resources") if isinstance(held, dict) else None
    if not isinstance(resources, dict):
        raise MalformedAnswer("an allocation in Placement's answer has no object 'resources'")

    def amount(*classes: str) -> float | None:
        found = [resources[rc] for rc in classes if rc in resources]
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in found):
            raise MalformedAnswer(f"an allocation of {'/'.join(classes)} is not a number")
        return float(sum(found)) if found else None

    return Allocation(amount("VCPU", "PCPU"), amount("MEMORY_MB"))


def _consumer(body: Any) -> Consumer:
    items = body.get("allocations") if isinstance(body, dict) else None
    if not isinstance(items, dict):
        raise MalformedAnswer("Placement's answer has no object 'allocations'")
    project = body.get("project_id") if items else None
    return Consumer(frozenset(str(p) for p in items), None if project is None else str(project))


def spare_of(body: Any) -> float:
    """The spare VCPU in an allocation candidates answer's provider summaries."""
    summaries = body.get("provider_summaries") if isinstance(body, dict) else None
    if not isinstance(summaries, dict):
        raise MalformedAnswer("Placement's answer has no object 'provider_summaries'")
    spare = 0.0
    for summary in summaries.values():
        vcpu = summary.get("resources", {}).get("VCPU") if isinstance(summary, dict) else None
        if isinstance(vcpu, dict):
            spare += max(0.0, float(vcpu.get("capacity", 0)) - float(vcpu.get("used", 0)))
    return spare
