"""Nova compute quotas (cores, RAM, instances): what to lower them to, and writing them safely.

Two halves:

- **Pure**: :func:`lowered` says what a customer's quota should be after ``steps`` quota steps
  from the original it had before enforcement. A :class:`QuotaStep` is a *fraction of the
  original* per resource: with ``cores=0.25`` each step removes a quarter of the original cores
  (20 → 15 → 10 → 5 → 0), so ``steps`` is cumulative and the same ``steps`` always gives the same
  quota, however many times it is recomputed. The result is rounded down (a step always removes
  at least its share), never below the :data:`QuotaFloor`, never above the original. Nova's
  ``-1`` (unlimited) is kept unlimited unless the step names a finite ``unlimited_base`` to
  count the fractions from (then an unlimited quota becomes finite at the first step and is
  restored to ``-1``). A floor of ``-1`` for a resource means "never lower it".
- **Adapter**: :class:`NovaQuotas` reads and writes one cloud's quotas with openstacksdk, with
  credentials from ``clouds.yaml`` by cloud name like every OpenStack tool. Every write is read
  back, because Nova's unified-limits quota driver accepts a write and changes nothing; such a
  mismatch raises :class:`QuotaNotApplied` and trips the adapter's breaker — further writes to
  that cloud raise ``QuotaError(kind="disabled")`` until a new adapter is built (the operator
  reconfigured). Restoring writes the remembered original explicitly; Nova's "revert" (DELETE)
  would go back to the cloud's *defaults*, which are not what the customer had.

Operations never hang (openstacksdk's ``api_timeout`` on every HTTP request, no hidden
openstacksdk retries) and never raise anything but :class:`QuotaError`: the daemon records the
failure and goes on. Only ``unavailable`` (5xx, 429, connection refused) and ``timeout`` are
retried, with exponential backoff; a 401/403/400 cannot fix itself by asking again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

if TYPE_CHECKING:
    from openstack.connection import Connection

log = logging.getLogger(__name__)

UNLIMITED = -1
"""Nova's value for "no limit"."""

QuotaErrorKind = Literal[
    "unauthorized",  # 401: the clouds.yaml credentials are wrong or expired
    "forbidden",  # 403: the user may not read/write quotas (needs an admin role)
    "not_found",  # 404: no such project, or no quota API at that endpoint
    "bad_request",  # other 4xx: Nova refused the values
    "unavailable",  # 5xx, 429, connection refused/reset: retried
    "timeout",  # no answer within the timeout: retried
    "not_applied",  # the write was accepted but the read-back differs (unified limits)
    "disabled",  # the breaker is open after a not_applied: no more writes to this cloud
    "config",  # the cloud is not in clouds.yaml, or its auth settings are incomplete
    "error",  # anything else openstacksdk raised (a malformed answer, …)
]
RETRYABLE_KINDS: frozenset[str] = frozenset({"unavailable", "timeout"})

_T = TypeVar("_T")


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

    def __str__(self) -> str:
        return f"cores={self.cores} ram={self.ram_mb}MiB instances={self.instances}"


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

    @property
    def ok(self) -> bool:
        return self.after == self.requested


class QuotaError(Exception):
    """A quota operation failed; ``kind`` says how, the message names cloud, project and step."""

    def __init__(
        self,
        kind: QuotaErrorKind,
        message: str,
        *,
        cloud: str,
        project_id: str | None,
        operation: str,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: QuotaErrorKind = kind
        self.cloud = cloud
        self.project_id = project_id
        self.operation = operation
        self.status = status
        """the HTTP status, when the failure was an HTTP answer"""

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS


class QuotaNotApplied(QuotaError):
    """Nova accepted a write but the quota read back differs from what was written."""

    def __init__(self, message: str, write: QuotaWrite) -> None:
        super().__init__(
            "not_applied",
            message,
            cloud=write.cloud,
            project_id=write.project_id,
            operation=write.operation,
        )
        self.write = write


_HINTS: dict[str, str] = {
    "unauthorized": "authentication refused: check the credentials of this cloud in clouds.yaml",
    "forbidden": "not allowed: writing Nova quotas needs a user with the admin role",
    "not_found": "not found: check the project id and the compute endpoint",
    "bad_request": "Nova refused the request",
    "unavailable": "the cloud is unavailable",
    "timeout": "no answer within the timeout",
    "config": "the cloud's configuration is unusable",
    "error": "unexpected failure",
}


def _status_kind(status: int | None) -> QuotaErrorKind:
    if status is None:
        return "unavailable"
    if status == 401:
        return "unauthorized"
    if status == 403:
        return "forbidden"
    if status == 404:
        return "not_found"
    if status == 408:
        return "timeout"
    if status == 429 or status >= 500:
        return "unavailable"
    if 400 <= status < 500:
        return "bad_request"
    return "error"


def _classify(exc: BaseException) -> tuple[QuotaErrorKind, int | None]:
    """The kind of an exception openstacksdk, keystoneauth or requests raised."""
    import requests
    from keystoneauth1 import exceptions as ksa
    from openstack import exceptions as sdk

    # Order matters: openstacksdk's HttpException is also a requests HTTPError.
    if isinstance(exc, sdk.HttpException):
        return _status_kind(exc.status_code), exc.status_code
    if isinstance(exc, ksa.HttpError):
        return _status_kind(exc.http_status), exc.http_status
    if isinstance(exc, ksa.ConnectTimeout | requests.Timeout):  # ksa: connect *and* read
        return "timeout", None
    if isinstance(exc, ksa.ConnectionError | ksa.DiscoveryFailure | requests.ConnectionError):
        return "unavailable", None
    if isinstance(
        exc,
        sdk.ConfigException
        | sdk.EndpointNotFound
        | ksa.AuthPluginException
        | ksa.AuthorizationFailure
        | ksa.CatalogException,
    ):
        return "config", None
    return "error", None


# --- adapter ------------------------------------------------------------------------------

ConnectionFactory: TypeAlias = Callable[..., "Connection"]
"""Called like :func:`openstack.connect`: ``cloud=…, api_timeout=…`` and the retry settings
of :data:`_NO_SDK_RETRIES`; tests inject one to count or alter connections."""

_NO_SDK_RETRIES: dict[str, Any] = {
    "connect_retries": 0,
    "status_code_retries": 0,
    "compute_connect_retries": 0,
    "compute_status_code_retries": 0,
}


class NovaQuotas:
    """Reads and writes Nova compute quotas of one cloud, read back after every write.

    Build one per cloud and keep it: it holds the openstacksdk connection (and so the Keystone
    token) between calls, and its breaker. Worst-case duration of one call to Nova:
    ``(retries + 1)`` attempts of at most a few HTTP requests (Keystone and Nova discovery,
    authentication, the call itself — the first call on a connection only) of ``timeout_s``
    each, plus the backoff sleeps.
    """

    def __init__(
        self,
        cloud: str,
        *,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        connection_factory: ConnectionFactory | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not cloud:
            raise ValueError("NovaQuotas needs a cloud name (a key of clouds.yaml)")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0 or backoff_max_s < 0:
            raise ValueError(
                f"NovaQuotas({cloud!r}): timeout_s must be > 0, retries, backoff_s and "
                f"backoff_max_s ≥ 0 (got {timeout_s}, {retries}, {backoff_s}, {backoff_max_s})"
            )
        self.cloud = cloud
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._factory = connection_factory
        self._sleep = sleep
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._disabled_by: QuotaError | None = None

    # --- public operations ---------------------------------------------------------------

    @property
    def disabled_reason(self) -> str | None:
        """Why writes to this cloud are refused (the breaker is open), or None."""
        return str(self._disabled_by) if self._disabled_by else None

    def get(self, project_id: str) -> QuotaSet:
        """The project's current cores, RAM and instances quotas."""
        return self._read("get", project_id)

    def apply(self, project_id: str, target: QuotaSet) -> QuotaWrite:
        """Write ``target`` as the project's quota, read it back, and say what happened.

        Raises :class:`QuotaNotApplied` (and opens the breaker) when the read-back differs.
        """
        return self._write("apply", project_id, target)

    def restore(self, project_id: str, original: QuotaSet) -> QuotaWrite:
        """Write the remembered ``original`` back explicitly, and read it back.

        Not Nova's revert (``revert_quota_set``, a DELETE): that resets the project to the
        cloud's default quotas, which differ from the original whenever the operator had given
        the project its own quota.
        """
        return self._write("restore", project_id, original)

    def close(self) -> None:
        """Close the connection; the next call opens a new one."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception as exc:  # closing must not fail the caller either
                log.debug("closing the connection to cloud %r: %s", self.cloud, exc)

    def __enter__(self) -> NovaQuotas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -----------------------------------------------------------------------

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
        self._call(
            operation,
            project_id,
            lambda c: c.compute.update_quota_set(project_id, **target.as_nova()),
        )
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
                "unified-limits quota driver"
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
        log.error("%s — quota writes to cloud %r are now disabled", error, self.cloud)
        raise error

    def _read(self, operation: str, project_id: str) -> QuotaSet:
        return self._call(
            operation, project_id, lambda c: _quota_of(c.compute.get_quota_set(project_id))
        )

    def _check_enabled(self, operation: str, project_id: str) -> None:
        reason = self._disabled_by
        if reason is not None:
            raise QuotaError(
                "disabled",
                f"{operation} of the Nova quota of project {project_id} on cloud {self.cloud!r} "
                f"refused: quota writes to this cloud are disabled until it is reconfigured, "
                f"because: {reason}",
                cloud=self.cloud,
                project_id=project_id,
                operation=operation,
            )

    def _connection(self) -> Connection:
        with self._lock:
            if self._conn is None:
                factory = self._factory
                if factory is None:
                    import openstack

                    factory = openstack.connect
                # No openstacksdk/keystoneauth retries of their own: ours are the only ones, so
                # their number and backoff are what the configuration says. The compute_ keys
                # too, since a clouds.yaml's compute_status_code_retries beats the plain one.
                self._conn = factory(
                    cloud=self.cloud, api_timeout=self.timeout_s, **_NO_SDK_RETRIES
                )
            return self._conn

    def _call(self, operation: str, project_id: str, fn: Callable[[Connection], _T]) -> _T:
        """``fn`` on the connection, retried on unavailable/timeout; raises only QuotaError."""
        attempts = self.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                with self._translated(operation, project_id):
                    try:
                        conn = self._connection()
                    except Exception as exc:
                        raise _ConfigFailure(exc) from exc
                    return fn(conn)
            except QuotaError as error:
                if not error.retryable or attempt == attempts:
                    if error.retryable:
                        log.error("%s (gave up after %d attempts)", error, attempt)
                    else:
                        log.error("%s", error)
                    raise
                delay = min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))
                log.warning(
                    "%s — attempt %d of %d, retrying in %.2f s", error, attempt, attempts, delay
                )
                self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    @contextmanager
    def _translated(self, operation: str, project_id: str) -> Iterator[None]:
        """Turn whatever openstacksdk and its libraries raise into a QuotaError."""
        try:
            yield
        except QuotaError:
            raise
        except _ConfigFailure as failure:
            exc = failure.cause
            raise QuotaError(
                "config",
                f"{operation} of the Nova quota of project {project_id} on cloud "
                f"{self.cloud!r} failed: cannot connect with the clouds.yaml entry "
                f"{self.cloud!r}: {_describe(exc)}",
                cloud=self.cloud,
                project_id=project_id,
                operation=operation,
            ) from exc
        except Exception as exc:
            kind, status = _classify(exc)
            http = f" (HTTP {status})" if status is not None else ""
            raise QuotaError(
                kind,
                f"{operation} of the Nova quota of project {project_id} on cloud "
                f"{self.cloud!r} failed: {_HINTS[kind]}{http}: "
                f"{_describe(exc)}",
                cloud=self.cloud,
                project_id=project_id,
                operation=operation,
                status=status,
            ) from exc


class _ConfigFailure(Exception):
    """Building the connection failed (unknown cloud, bad clouds.yaml): never retried."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _describe(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line, shortened (openstacksdk's messages carry the type)."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    if not text.startswith(name):
        text = f"{name}: {text}" if text else name
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _quota_of(sdk_quota: Any) -> QuotaSet:
    """Our QuotaSet from openstacksdk's (whose ``ram`` is MiB, as Nova's)."""
    values = {}
    for ours, nova in (("cores", "cores"), ("ram_mb", "ram"), ("instances", "instances")):
        value = getattr(sdk_quota, nova, None)
        if value is None:
            raise _MalformedAnswer(f"Nova's quota set has no {nova!r}")
        values[ours] = int(value)
    try:
        return QuotaSet(**values)
    except ValueError as exc:
        raise _MalformedAnswer(f"Nova's quota set is invalid: {exc}") from exc


class _MalformedAnswer(Exception):
    """Nova answered, but not with a usable quota set (classified as ``error``)."""
