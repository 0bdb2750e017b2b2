"""Placement's answers the daemon needs, read over raw HTTP on openstacksdk's adapter.

The connection, its timeout and the translation of every failure into one error kind are
those of the quota clients (:class:`~gmd.daemon.enforce.openstack_client.OpenStackClient`):
one way of reaching the cloud. Calls are never retried here: a batch must not wait for
Placement longer than one call's ``timeout_s``; what fails is verified later instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import quote

from gmd.daemon.enforce.openstack_client import MalformedAnswer, OpenStackClient, checked
from gmd.daemon.enforce.quotas import QuotaError, QuotaErrorKind

if TYPE_CHECKING:
    from openstack.connection import Connection

_T = TypeVar("_T")

MICROVERSION = "1.12"
"""The first that gives a consumer's project and user with its allocations
(``GET /allocations/{consumer}``)."""


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


class PlacementClient(OpenStackClient):
    """The few reads the Placement view makes; each is one HTTP request."""

    subject = "Placement view"
    of = "of "
    hints: ClassVar[dict[QuotaErrorKind, str]] = {
        QuotaErrorKind.forbidden: "not allowed by Placement's policy: reading providers and"
        " allocations needs an admin (or service) role",
    }

    def __init__(
        self,
        cloud: str,
        *,
        timeout_s: float,
        on_call: Callable[[], object] | None = None,
        pause_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> None:
        super().__init__(cloud, timeout_s=timeout_s, retries=0, **kwargs)
        self.calls = 0
        """HTTP requests made (tests and benchmarks count them)"""
        self.pause_s = pause_s
        """after Placement could not be reached, how long nothing asks it again: a Placement
        that swallows requests would otherwise hold every batch for ``timeout_s``"""
        self._on_call = on_call
        self._clock = clock
        self._calls_lock = threading.Lock()
        self._paused_until = float("-inf")
        self._pause_reason = ""

    def _get(self, what: str, path: str, parse: Callable[[Any], _T]) -> _T:
        """``parse`` of the answer's body, within the call: whatever a malformed answer makes
        it raise becomes the client's one error kind, as a failed request does."""

        def read(conn: Connection) -> _T:
            with self._calls_lock:
                self.calls += 1
            if self._on_call is not None:
                self._on_call()
            return parse(checked(conn.placement.get(path, microversion=MICROVERSION)))

        now = self._clock()
        with self._calls_lock:
            paused, reason = now < self._paused_until, self._pause_reason
        if paused:
            raise self.error(
                QuotaErrorKind.unavailable,
                "read",
                what,
                f"not asked again for [placement] miss_s after it failed: {reason}",
            )
        try:
            return self.call("read", what, read)
        except QuotaError as exc:
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
