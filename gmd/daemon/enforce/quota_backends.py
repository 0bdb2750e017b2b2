"""Choosing where a cloud's compute quotas are written: Nova, Keystone limits, or found out.

``[enforcement.quota] backend``:

- ``nova``: Nova's legacy quota API (:class:`.NovaQuotas`).
- ``keystone-limits``: project limits in Keystone (:class:`.KeystoneLimits`).
- ``auto`` (:class:`AutoQuotas`): a cloud with no registered limits for its compute service
  cannot be on unified limits (Nova would allow nothing), so it is Nova. A cloud with
  registered limits usually is on unified limits but need not be (limits registered ahead of a
  migration): when Nova reports other values than Keystone's, Nova is not reading Keystone;
  when they agree, the first write goes to Nova, and if Nova accepts it and changes nothing
  (the unified-limits driver's silent no-op) the cloud is on unified limits. Whatever is found
  is kept for the life of the adapter and logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from gmd.daemon.enforce.keystone_limits import KeystoneLimits
from gmd.daemon.enforce.nova_quotas import NovaQuotas
from gmd.daemon.enforce.quotas import (
    QuotaNotApplied,
    QuotaOriginal,
    QuotaSet,
    QuotaWrite,
)
from gmd.daemon.enforce.settings import QuotaBackendKind
from gmd.openstack.client import OpenStackError

log = logging.getLogger(__name__)


class QuotaBackend(Protocol):
    """What the quota job needs of a backend; every method raises only a
    :data:`~gmd.daemon.enforce.quotas.QuotaFailure`."""

    cloud: str

    @property
    def disabled_reason(self) -> str | None: ...

    def get(self, project_id: str) -> QuotaSet: ...

    def original(self, project_id: str) -> QuotaOriginal: ...

    def apply(self, project_id: str, target: QuotaSet) -> QuotaWrite: ...

    def restore(self, project_id: str, original: QuotaOriginal) -> QuotaWrite: ...

    def close(self) -> None: ...


class AutoQuotas:
    """Nova or Keystone limits, whichever the cloud turns out to use."""

    kind = QuotaBackendKind.auto

    def __init__(self, nova: NovaQuotas, keystone: KeystoneLimits) -> None:
        self.cloud = nova.cloud
        self.nova, self.keystone = nova, keystone
        self.resolved: QuotaBackendKind | None = None

    @property
    def disabled_reason(self) -> str | None:
        if self.resolved == QuotaBackendKind.keystone_limits:
            return self.keystone.disabled_reason
        return self.nova.disabled_reason

    def close(self) -> None:
        self.nova.close()
        self.keystone.close()

    def _resolve(self, kind: QuotaBackendKind, why: str) -> None:
        self.resolved = kind
        log.info("cloud %r: compute quotas are written to %s (%s)", self.cloud, kind.value, why)

    def _backend(self) -> NovaQuotas | KeystoneLimits | None:
        if self.resolved == QuotaBackendKind.nova:
            return self.nova
        if self.resolved == QuotaBackendKind.keystone_limits:
            return self.keystone
        return None

    def _detect(self, project_id: str) -> None:
        if self.resolved is not None:
            return
        try:
            registered = self.keystone.registered(project_id)
        except OpenStackError as exc:
            if exc.retryable:
                raise
            # Unreadable limits (no such API, or not allowed): no unified limits we can write.
            self._resolve(QuotaBackendKind.nova, f"Keystone's registered limits unreadable: {exc}")
            return
        if not registered:
            self._resolve(
                QuotaBackendKind.nova, "no registered limits for its compute service in Keystone"
            )

    def get(self, project_id: str) -> QuotaSet:
        self._detect(project_id)
        backend = self._backend()
        return (backend or self.nova).get(project_id)

    def original(self, project_id: str) -> QuotaOriginal:
        self._detect(project_id)
        backend = self._backend()
        if backend is not None:
            return backend.original(project_id)
        in_keystone = self.keystone.original(project_id)
        in_nova = self.nova.get(project_id)
        if in_nova != in_keystone.quota:
            self._resolve(
                QuotaBackendKind.nova,
                f"Nova reports {in_nova}, not Keystone's {in_keystone.quota}",
            )
            return QuotaOriginal(in_nova)
        # Undecided yet: Keystone's original holds the same values and also says which were
        # defaults, which restoring through Keystone needs.
        return in_keystone

    def apply(self, project_id: str, target: QuotaSet) -> QuotaWrite:
        return self._write(project_id, lambda b: b.apply(project_id, target))

    def restore(self, project_id: str, original: QuotaOriginal) -> QuotaWrite:
        return self._write(project_id, lambda b: b.restore(project_id, original))

    def _write(
        self, project_id: str, write: Callable[[NovaQuotas | KeystoneLimits], QuotaWrite]
    ) -> QuotaWrite:
        self._detect(project_id)
        backend = self._backend()
        if backend is not None:
            return write(backend)
        self.nova.probing = True
        try:
            done = write(self.nova)
        except QuotaNotApplied as exc:
            if exc.write.after != exc.write.before:
                raise
            self._resolve(
                QuotaBackendKind.keystone_limits,
                "Nova accepted a quota write and changed nothing: it reads unified limits",
            )
            return write(self.keystone)
        finally:
            self.nova.probing = False
        self._resolve(QuotaBackendKind.nova, "a Nova quota write took effect")
        return done


def build_backend(
    kind: QuotaBackendKind | str, cloud: str, *, limits_cloud: str = "", **kw: Any
) -> NovaQuotas | KeystoneLimits | AutoQuotas:
    """The backend ``[enforcement.quota] backend`` names, for one clouds.yaml entry."""
    kind = QuotaBackendKind(kind)
    nova = NovaQuotas(cloud, **kw)
    if kind == QuotaBackendKind.nova:
        return nova
    keystone = KeystoneLimits(cloud, limits_cloud=limits_cloud, nova=nova, **kw)
    if kind == QuotaBackendKind.keystone_limits:
        return keystone
    return AutoQuotas(nova, keystone)
