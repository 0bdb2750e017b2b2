"""Unified limits: a project's compute quotas as Keystone project limits, read back through Nova.

With Nova's ``UnifiedLimitsDriver`` the limits live in Keystone: a *registered limit* per
resource is the cloud's default, a *project limit* overrides it for one project. Nova reads
them per service and region (its ``[oslo_limit] endpoint_id``); gmd takes both from the compute
endpoint of its clouds.yaml entry, so it writes exactly what that Nova reads.

- The original is the *effective* limit (the project limit, else the registered default), and
  which resources had no project limit (:class:`QuotaOriginal.unset`).
- Lowering creates or updates the project limits of ``class:VCPU``, ``class:MEMORY_MB`` and
  ``servers``; Keystone does not check usage (it does not know it), so no ``force`` is needed.
- Every write is read back through Keystone *and* through Nova's ``os-quota-sets``: a cloud
  whose Nova does not read Keystone (the legacy driver) shows the old value there, which raises
  :class:`QuotaNotApplied` and opens the breaker, as on the Nova path.
- Restoring puts back exactly what was there: the old project limit's value, or no project
  limit at all (the one gmd created is deleted, so the project follows the default again).

Writing limits takes an admin account (Keystone 30's default policy accepts the same
project-scoped admin that writes Nova quotas); ``limits_cloud`` names another clouds.yaml entry
for Keystone where a cloud keeps that right elsewhere (a system-scoped account, say). Keystone
also refuses a project limit for a resource that has no registered limit in that service and
region (a 403).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from gmd.daemon.enforce.nova_quotas import NovaQuotas
from gmd.daemon.enforce.quotas import (
    RESOURCES,
    UNLIMITED,
    QuotaError,
    QuotaErrorKind,
    QuotaNotApplied,
    QuotaOriginal,
    QuotaSet,
    QuotaWrite,
)
from gmd.daemon.enforce.settings import QuotaBackendKind
from gmd.openstack.client import MalformedAnswer, OpenStackClient, OpenStackErrorKind, checked

if TYPE_CHECKING:
    from openstack.connection import Connection

log = logging.getLogger(__name__)

KEYSTONE_RESOURCES = {"cores": "class:VCPU", "ram_mb": "class:MEMORY_MB", "instances": "servers"}
"""Our QuotaSet fields → Nova's unified-limits resource names."""


@dataclass(frozen=True)
class LimitScope:
    """The compute service and region whose limits the cloud's Nova reads."""

    service_id: str
    region_id: str | None

    def query(self, **extra: str) -> dict[str, str]:
        params = {"service_id": self.service_id, **extra}
        if self.region_id:
            params["region_id"] = self.region_id
        return params


@dataclass(frozen=True)
class ProjectLimits:
    """One project's limits as Keystone holds them."""

    registered: dict[str, int]
    """resource (QuotaSet field) → the registered default, where there is one"""
    own: dict[str, tuple[str, int]]
    """resource → (project limit id, value), where the project has its own limit"""

    def effective(self) -> QuotaSet:
        """What Nova enforces: the project limit, else the default (else unlimited)."""
        values = {}
        for resource in RESOURCES:
            if resource in self.own:
                values[resource] = self.own[resource][1]
            else:
                values[resource] = self.registered.get(resource, UNLIMITED)
        return QuotaSet(**values)

    def original(self) -> QuotaOriginal:
        unset = frozenset(r for r in RESOURCES if r not in self.own)
        return QuotaOriginal(self.effective(), unset)


class _Keystone(OpenStackClient):
    subject = "Keystone limits"
    hints: ClassVar[dict[OpenStackErrorKind, str]] = {
        OpenStackErrorKind.forbidden: "refused by Keystone: writing limits needs an account with"
        " the admin role, and a registered limit of each resource for the compute service and"
        " region",
        OpenStackErrorKind.bad_request: "Keystone refused the request",
        OpenStackErrorKind.conflict: "Keystone already has that project limit (another writer?)",
    }


class KeystoneLimits:
    """Reads and writes one cloud's compute limits in Keystone, read back through Nova."""

    kind = QuotaBackendKind.keystone_limits

    def __init__(
        self,
        cloud: str,
        *,
        limits_cloud: str = "",
        nova: NovaQuotas | None = None,
        **kw: Any,
    ) -> None:
        self.cloud = cloud
        self.nova = nova if nova is not None else NovaQuotas(cloud, **kw)
        self.keystone = _Keystone(limits_cloud or cloud, **kw)
        self._scope: LimitScope | None = None
        self._disabled_by: QuotaError | None = None

    @property
    def disabled_reason(self) -> str | None:
        return str(self._disabled_by) if self._disabled_by else None

    def close(self) -> None:
        self.nova.close()
        self.keystone.close()

    def __enter__(self) -> KeystoneLimits:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reading -------------------------------------------------------------------------

    def scope(self, project_id: str = "-") -> LimitScope:
        """The compute service id and region of the cloud's compute endpoint (cached)."""
        if self._scope is None:

            def find(conn: Connection) -> LimitScope:
                data = conn.compute.get_endpoint_data()
                service_id = getattr(data, "service_id", None)
                if not service_id:
                    raise MalformedAnswer("the catalog's compute endpoint has no service id")
                return LimitScope(str(service_id), getattr(data, "region_name", None) or None)

            self._scope = self.nova.call("compute endpoint lookup", project_id, find)
        return self._scope

    def limits(self, project_id: str, operation: str = "get") -> ProjectLimits:
        """The registered defaults and the project's own limits for our three resources."""
        scope = self.scope(project_id)
        names = {name: ours for ours, name in KEYSTONE_RESOURCES.items()}

        def read(conn: Connection) -> ProjectLimits:
            registered: dict[str, int] = {}
            body = checked(conn.identity.get("/registered_limits", params=scope.query()))
            for item in _items(body, "registered_limits"):
                ours = names.get(str(item.get("resource_name")))
                if ours is not None:
                    registered[ours] = _int(item, "default_limit")
            own: dict[str, tuple[str, int]] = {}
            body = checked(conn.identity.get("/limits", params=scope.query(project_id=project_id)))
            for item in _items(body, "limits"):
                ours = names.get(str(item.get("resource_name")))
                if ours is not None and item.get("project_id") == project_id:
                    own[ours] = (str(item.get("id")), _int(item, "resource_limit"))
            return ProjectLimits(registered, own)

        return self.keystone.call(operation, project_id, read)

    def registered(self, project_id: str = "-") -> dict[str, int]:
        """The registered defaults of our resources (empty: the cloud has no unified limits)."""
        return self.limits(project_id, "registered limits").registered

    def get(self, project_id: str) -> QuotaSet:
        return self.limits(project_id).effective()

    def original(self, project_id: str) -> QuotaOriginal:
        return self.limits(project_id).original()

    # --- writing -------------------------------------------------------------------------

    def apply(self, project_id: str, target: QuotaSet) -> QuotaWrite:
        """Set the project limits to ``target``, read back through Keystone and Nova."""
        return self._write("apply", project_id, QuotaOriginal(target))

    def restore(self, project_id: str, original: QuotaOriginal | QuotaSet) -> QuotaWrite:
        """Put back exactly what was there: values, or no project limit where there was none."""
        if isinstance(original, QuotaSet):
            original = QuotaOriginal(original)
        return self._write("restore", project_id, original)

    def _write(self, operation: str, project_id: str, wanted: QuotaOriginal) -> QuotaWrite:
        self._check_enabled(operation, project_id)
        state = self.limits(project_id, f"{operation} (read before)")
        before, target = state.effective(), wanted.quota
        changes: list[tuple[str, str | None, int | None]] = []
        for resource in RESOURCES:
            own = state.own.get(resource)
            if resource in wanted.unset:
                if own is not None:
                    changes.append((resource, own[0], None))
            elif own is None or own[1] != target.value(resource):
                changes.append((resource, None if own is None else own[0], target.value(resource)))
        if not changes:
            log.info(
                "Keystone limits of project %s on cloud %r are already %s: nothing to %s",
                project_id,
                self.cloud,
                wanted,
                operation,
            )
            return QuotaWrite(
                self.cloud, project_id, operation, before, target, before, False, self.kind
            )
        scope = self.scope(project_id)
        for resource, limit_id, value in changes:
            self.keystone.call(
                operation,
                project_id,
                partial(
                    _set_limit,
                    scope=scope,
                    project_id=project_id,
                    resource=resource,
                    limit_id=limit_id,
                    value=value,
                ),
            )
        held = self.limits(project_id, f"{operation} (read-back)")
        # Where the project limit is gone, the default applies: today's, which may have changed
        # since the original was read.
        expected = QuotaSet(
            **{
                r: held.registered.get(r, UNLIMITED) if r in wanted.unset else target.value(r)
                for r in RESOURCES
            }
        )
        seen = self.nova.get(project_id)
        write = QuotaWrite(
            self.cloud, project_id, operation, before, expected, seen, True, self.kind
        )
        kept = held.effective() == expected and all(
            (r in held.own) != (r in wanted.unset) for r in RESOURCES
        )
        if kept and write.ok:
            log.info(
                "%s: Keystone limits of project %s on cloud %r: %s → %s (read back through "
                "Keystone and Nova)",
                operation,
                project_id,
                self.cloud,
                before,
                wanted,
            )
            return write
        if not kept:
            why = f"Keystone holds {held.original()} instead"
        else:
            why = (
                f"Keystone holds it but Nova reads {seen}: this Nova does not use unified "
                f'limits of this service and region (backend = "nova" writes its quotas)'
            )
        error = QuotaNotApplied(
            f"{operation} of the Keystone limits of project {project_id} on cloud "
            f"{self.cloud!r} not applied: requested {wanted}, {why}; further limit writes to "
            f"cloud {self.cloud!r} are pointless until it is reconfigured",
            write,
        )
        self._disabled_by = error
        log.error("%s — limit writes to cloud %r are now disabled", error, self.cloud)
        raise error

    def _check_enabled(self, operation: str, project_id: str) -> None:
        if self._disabled_by is not None:
            raise QuotaError(
                QuotaErrorKind.disabled,
                f"{operation} of the Keystone limits of project {project_id} on cloud "
                f"{self.cloud!r} refused: limit writes to this cloud are disabled until it is "
                f"reconfigured, because: {self._disabled_by}",
                cloud=self.cloud,
                project_id=project_id,
                operation=operation,
            )


def _set_limit(
    conn: Connection,
    *,
    scope: LimitScope,
    project_id: str,
    resource: str,
    limit_id: str | None,
    value: int | None,
) -> None:
    """Create, update or (``value`` None) delete one project limit."""
    if value is None:
        assert limit_id is not None
        checked(conn.identity.delete(f"/limits/{limit_id}"))
    elif limit_id is None:
        limit = {
            **scope.query(project_id=project_id),
            "resource_name": KEYSTONE_RESOURCES[resource],
            "resource_limit": value,
            "description": "set by gmd (fairness enforcement)",
        }
        checked(conn.identity.post("/limits", json={"limits": [limit]}))
    else:
        body = {"limit": {"resource_limit": value}}
        checked(conn.identity.patch(f"/limits/{limit_id}", json=body))


def _items(body: Any, key: str) -> list[dict[str, Any]]:
    items = body.get(key) if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise MalformedAnswer(f"Keystone's answer has no list {key!r}")
    return items


def _int(item: dict[str, Any], key: str) -> int:
    value = item.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < UNLIMITED:
        raise MalformedAnswer(f"Keystone's {key} is not an integer ≥ -1: {value!r}")
    return value
