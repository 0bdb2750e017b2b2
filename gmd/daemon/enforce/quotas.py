"""Compute quotas (cores, RAM, servers): what to lower them to, and how writing them fails.

Pure, and shared by the backends that write them (:mod:`.nova_quotas` for Nova's legacy quota
API, :mod:`.keystone_limits` for unified limits in Keystone, :mod:`.quota_backends` to choose):

- :func:`lowered` says what a customer's quota should be after ``steps`` quota steps from the
  original it had before enforcement. A :class:`QuotaStep` is a *fraction of the original* per
  resource: with ``cores=0.25`` each step removes a quarter of the original cores (20 → 15 → 10
  → 5 → 0), so ``steps`` is cumulative and the same ``steps`` always gives the same quota,
  however many times it is recomputed. The result is rounded down (a step always removes at
  least its share), never below the :data:`QuotaFloor`, never above the original. ``-1``
  (unlimited) is kept unlimited unless the step names a finite ``unlimited_base`` to count the
  fractions from (then an unlimited quota becomes finite at the first step and is restored to
  ``-1``). A floor of ``-1`` for a resource means "never lower it".
- :class:`QuotaOriginal` is what restoring must bring back: the values, and which of them were
  the cloud's default rather than the project's own limit (so that restoring removes the limit
  gmd created instead of pinning today's default).
- :class:`QuotaError` and its kinds: what is wrong with a quota write that the cloud
  accepted (not applied), or why gmd no longer writes (disabled). A backend raises these, and
  :class:`~gmd.openstack.client.OpenStackError` when the cloud could not be asked (the two
  together: :data:`QuotaFailure`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any, TypeAlias

from gmd import GmdError
from gmd.daemon.enforce.settings import QuotaBackendKind
from gmd.openstack.client import OpenStackError

UNLIMITED = -1
"""Nova's and Keystone's value for "no limit"."""


class QuotaErrorKind(StrEnum):
    """What went wrong with a quota that the cloud itself did not refuse (stored in the
    enforcement log's reasons, as an :class:`~gmd.openstack.client.OpenStackErrorKind` is when
    the cloud could not be asked or refused)."""

    not_applied = "not_applied"
    """the write was accepted but the read-back differs (wrong backend)"""
    disabled = "disabled"
    """the breaker is open after a not_applied: no more writes to this cloud"""


# --- pure part ----------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaSet:
    """The three Nova compute quotas gmd manages; ``-1`` is unlimited, as Nova says."""

    cores: int
    ram_mb: int
    instances: int

    def __post_init__(self) -> None:
        for name in ("cores", "ram_mb", "instances"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < UNLIMITED:
                raise ValueError(f"QuotaSet.{name} must be an int ≥ -1 (-1: unlimited): {value!r}")

    def as_nova(self) -> dict[str, Any]:
        """The ``quota_set`` attributes as Nova names them."""
        return {"cores": self.cores, "ram": self.ram_mb, "instances": self.instances}

    def value(self, resource: str) -> int:
        """One of ``cores``, ``ram_mb``, ``instances``."""
        return int(getattr(self, resource))

    def __str__(self) -> str:
        return f"cores={self.cores} ram={self.ram_mb}MiB instances={self.instances}"


RESOURCES = ("cores", "ram_mb", "instances")
"""The QuotaSet fields, in the order messages list them."""


@dataclass(frozen=True)
class QuotaOriginal:
    """What a project had before gmd lowered it, and so what restoring puts back.

    ``unset`` names the resources (QuotaSet field names) that had no limit of the project's
    own — the cloud's default applied. Keystone's unified limits tell the two apart: restoring
    such a resource deletes the project limit gmd created. Nova's legacy API cannot (it reports
    the effective values), so its originals have ``unset`` empty and are written back as values.
    """

    quota: QuotaSet
    unset: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        unknown = set(self.unset) - set(RESOURCES)
        if unknown:
            raise ValueError(f"QuotaOriginal.unset names unknown resources: {sorted(unknown)}")

    def __str__(self) -> str:
        if not self.unset:
            return str(self.quota)
        return f"{self.quota} (default: {', '.join(r for r in RESOURCES if r in self.unset)})"


QuotaFloor: TypeAlias = QuotaSet
"""The lowest quota enforcement may set, per resource (``-1``: never lower that resource)."""


@dataclass(frozen=True)
class QuotaStep:
    """How much one quota step removes: per resource, a fraction of the *original* quota.

    Fractions of the original rather than absolute amounts so that one configuration fits
    customers with quotas of 10 and of 1000 cores, and rather than fractions of the current
    value so that ``steps`` maps to exactly one quota (no drift on recomputation, restore is
    exact). ``unlimited_base``, if given, is the finite quota an unlimited (``-1``) original is
    counted from; without it an unlimited resource is left unlimited (there is no fraction of
    infinity to remove).
    """

    cores: float = 0.25
    ram: float = 0.25
    instances: float = 0.25
    unlimited_base: QuotaSet | None = None

    def __post_init__(self) -> None:
        for name in ("cores", "ram", "instances"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"QuotaStep.{name} must be a fraction in [0, 1]: {value!r}")
        base = self.unlimited_base
        if base is not None and UNLIMITED in (base.cores, base.ram_mb, base.instances):
            raise ValueError(f"QuotaStep.unlimited_base must be finite: {base}")


def _lower_one(original: int, steps: int, fraction: float, floor: int, base: int | None) -> int:
    if steps == 0 or floor == UNLIMITED:
        return original
    if original == UNLIMITED:
        if base is None:
            return UNLIMITED
        counted_from = base
    else:
        counted_from = original
    # Exact arithmetic: 30 * (1 - 3 * 0.1) must be 21, not 20.999… rounded down to 20.
    remaining = max(Fraction(0), 1 - steps * Fraction(str(fraction)))
    target = max(math.floor(counted_from * remaining), floor)
    return target if original == UNLIMITED else min(target, original)


def lowered(original: QuotaSet, steps: int, step: QuotaStep, floor: QuotaFloor) -> QuotaSet:
    """The quota after ``steps`` cumulative steps down from ``original``.

    Never below ``floor`` (a floor above the original leaves the original), never above the
    original; ``steps=0`` is the original itself.
    """
    if steps < 0:
        raise ValueError(f"steps must be ≥ 0: {steps}")
    base = step.unlimited_base
    return QuotaSet(
        cores=_lower_one(
            original.cores, steps, step.cores, floor.cores, base.cores if base else None
        ),
        ram_mb=_lower_one(
            original.ram_mb, steps, step.ram, floor.ram_mb, base.ram_mb if base else None
        ),
        instances=_lower_one(
            original.instances,
            steps,
            step.instances,
            floor.instances,
            base.instances if base else None,
        ),
    )


# --- errors -------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaWrite:
    """One write of a project's quota and what reading it back showed."""

    cloud: str
    project_id: str
    operation: str
    """``apply`` or ``restore``"""
    before: QuotaSet
    requested: QuotaSet
    after: QuotaSet
    written: bool
    """False when the quota already had the requested values, so nothing was sent"""
    backend: QuotaBackendKind = QuotaBackendKind.nova

    @property
    def ok(self) -> bool:
        return self.after == self.requested


class QuotaError(GmdError):
    """A quota write the cloud accepted did not take, or writes to the cloud are disabled;
    ``kind`` says which, the message names cloud, project and step. Never retried: asking
    again cannot change either."""

    def __init__(
        self,
        kind: QuotaErrorKind,
        message: str,
        *,
        cloud: str,
        project_id: str | None,
        operation: str,
    ) -> None:
        super().__init__(message)
        self.kind: QuotaErrorKind = kind
        self.cloud = cloud
        self.project_id = project_id
        self.operation = operation


QuotaFailure: TypeAlias = OpenStackError | QuotaError
"""What a quota backend raises: the cloud could not be asked or refused
(:class:`~gmd.openstack.client.OpenStackError`), or the quota did not take
(:class:`QuotaError`). Both have a ``kind`` that the enforcement log keeps."""


class QuotaNotApplied(QuotaError):
    """A write was accepted but the quota read back (through Nova) differs from it."""

    def __init__(self, message: str, write: QuotaWrite) -> None:
        super().__init__(
            QuotaErrorKind.not_applied,
            message,
            cloud=write.cloud,
            project_id=write.project_id,
            operation=write.operation,
        )
        self.write = write
