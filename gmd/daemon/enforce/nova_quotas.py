"""Nova's legacy compute quotas (``os-quota-sets``): read, lower with ``force``, read back.

Real Nova refuses to set a limit below what the project already uses ("Quota limit 2 for
cores must be greater than or equal to already used and reserved 8") unless the update says
``force`` — and a greedy customer is precisely one with high usage. A forced quota below usage
kills nothing: it stops new servers and resizes upwards until usage is under it again. Every
write therefore carries ``force``; restoring too, since what it puts back is what Nova held.

The microversion is negotiated once per connection: the newest of
:data:`NOVA_MICROVERSIONS` the endpoint serves. Every key gmd sends (``cores``, ``ram``,
``instances``, ``force``) exists at all of them; the ones that differ between them (network
quotas gone at 2.36, injected files at 2.57) are never sent, and only these three are read.

Every write is read back, because Nova's unified-limits driver accepts a write and changes
nothing; such a mismatch raises :class:`QuotaNotApplied` and opens the breaker — further writes
to that cloud raise ``QuotaError(kind="disabled")`` until a new adapter is built (the operator
reconfigured, or :mod:`.quota_backends` switched to Keystone limits). Restoring writes the
remembered original explicitly; Nova's "revert" (DELETE) would go back to the cloud's
*defaults*, which are not what the customer had.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

from gmd.daemon.enforce.quotas import (
    QuotaError,
    QuotaErrorKind,
    QuotaNotApplied,
    QuotaOriginal,
    QuotaSet,
    QuotaWrite,
)
from gmd.daemon.enforce.settings import QuotaBackendKind
from gmd.openstack.client import (
    MalformedAnswer,
    OpenStackClient,
    OpenStackErrorKind,
    ServiceRefused,
    checked,
)

if TYPE_CHECKING:
    from openstack.connection import Connection

log = logging.getLogger(__name__)

NOVA_MICROVERSIONS = ("2.57", "2.36", "2.1")
"""The compute API versions gmd speaks, newest first (the quota set's keys change at each)."""


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


class NovaQuotas(OpenStackClient):
    """Reads and writes Nova compute quotas of one cloud, read back after every write.

    Build one per cloud and keep it: it holds the openstacksdk connection (and so the Keystone
    token), the negotiated microversion and the breaker.
    """

    subject = "Nova quota"
    kind = QuotaBackendKind.nova
    force: ClassVar[bool] = True
    """Always: a quota below usage is what enforcement is for (a test turns it off to show
    Nova's refusal)."""
    hints: ClassVar[dict[OpenStackErrorKind, str]] = {
        OpenStackErrorKind.forbidden: "not allowed by Nova's policy: writing quotas needs the"
        " admin role, project-scoped",
        OpenStackErrorKind.bad_request: "Nova refused the request",
        OpenStackErrorKind.not_found: "not found: no such project in Keystone, or no compute"
        " API there",
    }

    def __init__(self, cloud: str, **kw: Any) -> None:
        super().__init__(cloud, **kw)
        self._disabled_by: QuotaError | None = None
        self.probing = False
        """Set by :class:`.AutoQuotas` while a write finds out whether Nova reads unified
        limits: a write that changes nothing is then the expected answer, logged as such."""
        self._microversion: str | None = None
        self._negotiated_for: object = None

    @property
    def disabled_reason(self) -> str | None:
        """Why writes to this cloud are refused (the breaker is open), or None."""
        return str(self._disabled_by) if self._disabled_by else None

    def get(self, project_id: str) -> QuotaSet:
        """The project's current cores, RAM and instances quotas."""
        return self._read("get", project_id)

    def original(self, project_id: str) -> QuotaOriginal:
        """What restoring must bring back: Nova reports effective values only."""
        return QuotaOriginal(self.get(project_id))

    def apply(self, project_id: str, target: QuotaSet) -> QuotaWrite:
        """Write ``target`` (forced) as the project's quota, read it back, say what happened.

        Raises :class:`QuotaNotApplied` (and opens the breaker) when the read-back differs.
        """
        return self._write("apply", project_id, target)

    def restore(self, project_id: str, original: QuotaOriginal | QuotaSet) -> QuotaWrite:
        """Write the remembered original back explicitly, and read it back.

        Not Nova's revert (a DELETE): that resets the project to the cloud's default quotas,
        which differ from the original whenever the operator had given the project its own.
        """
        quota = original.quota if isinstance(original, QuotaOriginal) else original
        return self._write("restore", project_id, quota)

    def microversion(self, project_id: str = "-") -> str:
        """The compute microversion this connection uses (negotiated on first use)."""
        return self.call("version discovery", project_id, self._negotiate)

    # --- internals -----------------------------------------------------------------------

    def _negotiate(self, conn: Connection) -> str:
        if self._microversion is not None and self._negotiated_for is conn:
            return self._microversion
        from keystoneauth1 import discover

        data = conn.compute.get_endpoint_data()
        low = getattr(data, "min_microversion", None)
        high = getattr(data, "max_microversion", None)
        if high is None:
            chosen = "2.1"  # a server without microversions speaks 2.1
        else:
            low_v = discover.normalize_version_number(low or "2.1")
            high_v = discover.normalize_version_number(high)
            served = [v for v in NOVA_MICROVERSIONS if low_v <= _version(v) <= high_v]
            if not served:
                raise ServiceRefused(
                    406,
                    f"the compute endpoint serves microversions "
                    f"{discover.version_to_string(low_v)} to "
                    f"{discover.version_to_string(high_v)}; gmd speaks "
                    f"{NOVA_MICROVERSIONS[-1]} to {NOVA_MICROVERSIONS[0]}",
                )
            chosen = served[0]
        self._microversion, self._negotiated_for = chosen, conn
        log.debug("cloud %r: compute microversion %s", self.cloud, chosen)
        return chosen

    def _read(self, operation: str, project_id: str) -> QuotaSet:
        def read(conn: Connection) -> QuotaSet:
            version = self._negotiate(conn)
            body = checked(conn.compute.get(f"/os-quota-sets/{project_id}", microversion=version))
            return quota_of(body)

        return self.call(operation, project_id, read)

    def _put(self, operation: str, project_id: str, target: QuotaSet) -> None:
        def put(conn: Connection) -> None:
            version = self._negotiate(conn)
            body = {"quota_set": {**target.as_nova(), "force": self.force}}
            checked(
                conn.compute.put(f"/os-quota-sets/{project_id}", json=body, microversion=version)
            )

        self.call(operation, project_id, put)

    def _write(self, operation: str, project_id: str, target: QuotaSet) -> QuotaWrite:
        self._check_enabled(operation, project_id)
        before = self._read(f"{operation} (read before)", project_id)
        if before == target:
            log.info(
                "quota of project %s on cloud %r is already %s: nothing to %s",
                project_id,
                self.cloud,
                target,
                operation,
            )
            return QuotaWrite(self.cloud, project_id, operation, before, target, before, False)
        self._put(operation, project_id, target)
        after = self._read(f"{operation} (read-back)", project_id)
        write = QuotaWrite(self.cloud, project_id, operation, before, target, after, True)
        if write.ok:
            log.info(
                "%s: quota of project %s on cloud %r: %s → %s (read back)",
                operation,
                project_id,
                self.cloud,
                before,
                after,
            )
            return write
        if after == before:
            why = (
                "Nova accepted the write but the quota did not change, as with Nova's "
                'unified-limits quota driver (backend = "keystone-limits" writes those)'
            )
        else:
            why = "Nova accepted the write but reads back other values"
        error = QuotaNotApplied(
            f"{operation} of the Nova quota of project {project_id} on cloud {self.cloud!r} not "
            f"applied: {why} (before {before}, requested {target}, read back {after}); further "
            f"quota writes to cloud {self.cloud!r} are pointless until it is reconfigured",
            write,
        )
        with self._lock:
            self._disabled_by = error
        if self.probing and after == before:
            log.debug("%s (found out by backend = auto)", error)
        else:
            log.error("%s — quota writes to cloud %r are now disabled", error, self.cloud)
        raise error

    def _check_enabled(self, operation: str, project_id: str) -> None:
        reason = self._disabled_by
        if reason is not None:
            raise QuotaError(
                QuotaErrorKind.disabled,
                f"{operation} of the Nova quota of project {project_id} on cloud {self.cloud!r} "
                f"refused: quota writes to this cloud are disabled until it is reconfigured, "
                f"because: {reason}",
                cloud=self.cloud,
                project_id=project_id,
                operation=operation,
            )


def quota_of(body: Any) -> QuotaSet:
    """Our QuotaSet from Nova's ``{"quota_set": {...}}`` (``ram`` is MiB, as ours)."""
    quota = body.get("quota_set") if isinstance(body, dict) else None
    if not isinstance(quota, dict):
        raise MalformedAnswer("Nova's answer has no quota_set")
    values = {}
    for ours, nova in (("cores", "cores"), ("ram_mb", "ram"), ("instances", "instances")):
        value = quota.get(nova)
        if isinstance(value, dict):  # the /detail form: {limit, in_use, reserved}
            value = value.get("limit")
        if isinstance(value, bool) or not isinstance(value, int):
            raise MalformedAnswer(f"Nova's quota set has no integer {nova!r}: {value!r}")
        values[ours] = value
    try:
        return QuotaSet(**values)
    except ValueError as exc:
        raise MalformedAnswer(f"Nova's quota set is invalid: {exc}") from exc
