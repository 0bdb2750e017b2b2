"""One cloud's openstacksdk connection, with bounded retries and every failure an
:class:`OpenStackError`: how every part of gmd reaches OpenStack.

gmd-daemon's quota backends (:mod:`gmd.daemon.enforce.nova_quotas`,
:mod:`gmd.daemon.enforce.keystone_limits`), its project names
(:mod:`gmd.daemon.project_names`), the Placement reads of the daemon and of gmd-broker
(:mod:`gmd.openstack.placement`) and the broker's federation servers
(:mod:`gmd.broker.openstack`) all subclass :class:`OpenStackClient`, so that a cloud is
reached one way: the connection built from a clouds.yaml entry, its timeout, its retries and
the translation of whatever openstacksdk and keystoneauth raise into one error that names the
call, its target and the cloud. It lives below the daemon and the broker (imports nothing of
either) because both programs need it; what a failure *means* to a caller (a quota not
applied, writes disabled) is the caller's to say, with kinds of its own
(:class:`gmd.daemon.enforce.quotas.QuotaErrorKind`).

The clients speak to the services through raw HTTP on openstacksdk's service adapters, not
through openstacksdk's resource classes: they choose the microversion, send exactly the keys
that microversion accepts (``force`` included) and read the service's own error message from
the body, which is what an operator needs to see ("Quota limit 2 for cores must be greater
than or equal to already used and reserved 8").

Calls never hang (openstacksdk's ``api_timeout`` on every HTTP request, no hidden
openstacksdk retries) and never raise anything but :class:`OpenStackError`. Only
``unavailable`` (5xx, 429, connection refused) and ``timeout`` are retried, with exponential
backoff; a 401/403/400 cannot fix itself by asking again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, TypeVar

from gmd import GmdError

if TYPE_CHECKING:
    from openstack.connection import Connection

log = logging.getLogger(__name__)

_T = TypeVar("_T")

ConnectionFactory: TypeAlias = Callable[..., "Connection"]
"""Called like :func:`openstack.connect`: ``cloud=…, api_timeout=…`` and the retry settings
of :data:`NO_SDK_RETRIES`; tests inject one to count or alter connections."""

NO_SDK_RETRIES: dict[str, Any] = {
    "connect_retries": 0,
    "status_code_retries": 0,
    "compute_connect_retries": 0,
    "compute_status_code_retries": 0,
    "identity_connect_retries": 0,
    "identity_status_code_retries": 0,
    "placement_connect_retries": 0,
    "placement_status_code_retries": 0,
}


class OpenStackErrorKind(StrEnum):
    """Why a call to a cloud failed (the quota job stores it in the enforcement log's
    reasons, beside the quota-specific :class:`~gmd.daemon.enforce.quotas.QuotaErrorKind`)."""

    unauthorized = "unauthorized"
    """401: the clouds.yaml credentials are wrong or expired"""
    forbidden = "forbidden"
    """403: the user may not do this (the service's policy; often an admin role is needed)"""
    not_found = "not_found"
    """404: no such project (or provider, image …), or no such API at that endpoint"""
    bad_request = "bad_request"
    """other 4xx: the service refused the request"""
    conflict = "conflict"
    """409: another writer created the same thing at the same time"""
    unsupported_version = "unsupported_version"
    """406: the microversion asked for is not served"""
    unavailable = "unavailable"
    """5xx, 429, connection refused/reset: retried"""
    timeout = "timeout"
    """no answer within the timeout: retried"""
    config = "config"
    """the cloud is not in clouds.yaml, or its auth settings are incomplete"""
    error = "error"
    """anything else openstacksdk raised (a malformed answer, …)"""


RETRYABLE_KINDS: frozenset[OpenStackErrorKind] = frozenset(
    {OpenStackErrorKind.unavailable, OpenStackErrorKind.timeout}
)


class OpenStackError(GmdError):
    """A call to a cloud failed; ``kind`` says how, the message names the call, its target
    and the cloud (and what the operator should look at)."""

    def __init__(
        self,
        kind: OpenStackErrorKind,
        message: str,
        *,
        cloud: str,
        target: str | None,
        operation: str,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: OpenStackErrorKind = kind
        self.cloud = cloud
        self.target = target
        """what the call named: a project id, ``provider <name>``, ``every compute host``"""
        self.operation = operation
        self.status = status
        """the HTTP status, when the failure was an HTTP answer"""

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS


class ServiceRefused(GmdError):
    """A service answered with an HTTP error; ``message`` is the service's own words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class MalformedAnswer(GmdError):
    """A service answered 2xx, but not with what its API promises (classified ``error``)."""


def checked(response: Any) -> Any:
    """The response's JSON body if it is a success, else :class:`ServiceRefused`."""
    status = int(response.status_code)
    if status >= 400:
        raise ServiceRefused(status, service_message(response))
    if status == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError as exc:
        raise MalformedAnswer(f"HTTP {status} with a body that is not JSON") from exc


def service_message(response: Any) -> str:
    """The message in an OpenStack error body: Nova's ``{"badRequest": {"message": …}}``,
    Keystone's ``{"error": {"message": …}}``; else the body's first line, or the reason."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        for value in body.values():
            if isinstance(value, dict) and isinstance(value.get("message"), str):
                return one_line(value["message"])
        if isinstance(body.get("message"), str):
            return one_line(body["message"])
    text = one_line(getattr(response, "text", "") or "")
    return text or str(getattr(response, "reason", "") or f"HTTP {response.status_code}")


def one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status_kind(status: int | None, message: str = "") -> OpenStackErrorKind:
    if status is None:
        return OpenStackErrorKind.unavailable
    if status == 401:
        return OpenStackErrorKind.unauthorized
    if status == 403:
        return OpenStackErrorKind.forbidden
    if status == 404:
        return OpenStackErrorKind.not_found
    if status == 400 and "is not a valid project" in message:
        return OpenStackErrorKind.not_found  # Nova checks the project with Keystone and answers 400
    if status == 406:
        return OpenStackErrorKind.unsupported_version
    if status == 408:
        return OpenStackErrorKind.timeout
    if status == 409:
        return OpenStackErrorKind.conflict
    if status == 429 or status >= 500:
        return OpenStackErrorKind.unavailable
    if 400 <= status < 500:
        return OpenStackErrorKind.bad_request
    return OpenStackErrorKind.error


def _classify(exc: BaseException) -> tuple[OpenStackErrorKind, int | None, str]:
    """The kind, HTTP status and message of what openstacksdk, keystoneauth or we raised."""
    import requests
    from keystoneauth1 import exceptions as ksa
    from openstack import exceptions as sdk

    if isinstance(exc, ServiceRefused):
        return status_kind(exc.status, exc.message), exc.status, exc.message
    # Order matters: openstacksdk's HttpException is also a requests HTTPError.
    if isinstance(exc, sdk.HttpException):
        detail = exc.details or describe(exc)
        return status_kind(exc.status_code, detail), exc.status_code, detail
    if isinstance(exc, ksa.HttpError):
        return status_kind(exc.http_status), exc.http_status, describe(exc)
    if isinstance(exc, ksa.ConnectTimeout | requests.Timeout):  # ksa: connect *and* read
        return OpenStackErrorKind.timeout, None, describe(exc)
    if isinstance(exc, ksa.ConnectionError | ksa.DiscoveryFailure | requests.ConnectionError):
        return OpenStackErrorKind.unavailable, None, describe(exc)
    if isinstance(
        exc,
        sdk.ConfigException
        | sdk.EndpointNotFound
        | ksa.AuthPluginException
        | ksa.AuthorizationFailure
        | ksa.CatalogException
        | ksa.EndpointNotFound,
    ):
        return OpenStackErrorKind.config, None, describe(exc)
    return OpenStackErrorKind.error, None, describe(exc)


def describe(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line, shortened (openstacksdk's messages carry the type)."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    if not text.startswith(name):
        text = f"{name}: {text}" if text else name
    return text if len(text) <= limit else text[: limit - 1] + "…"


def entry_problem(cloud: str) -> str | None:
    """Why the clouds.yaml entry ``cloud`` cannot be used (no such entry, a file that cannot be
    read), or None; read from the files only, nothing is asked of the cloud."""
    try:
        from openstack.config import OpenStackConfig

        OpenStackConfig().get_one(cloud=cloud)
    except Exception as exc:  # openstacksdk raises several kinds for a bad entry or file
        return describe(exc)
    return None


class OpenStackClient:
    """One cloud's connection (kept between calls, with its token), retries and translation.

    ``subject`` names what the subclass manages in messages ("Nova quota", "Keystone limits",
    "Placement view");
    ``hints`` says per error kind what the operator should look at. Worst-case duration of one
    call: ``(retries + 1)`` attempts of at most a few HTTP requests (discovery, authentication,
    the call itself) of ``timeout_s`` each, plus the backoff sleeps.
    """

    subject: ClassVar[str] = "OpenStack service"
    hints: ClassVar[Mapping[OpenStackErrorKind, str]] = {}
    of: ClassVar[str] = "of project "
    """what the target a call names is, in messages (``of project <id>``); a subclass whose
    calls name their target themselves (``provider <name>``) says ``"of "``"""

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
        kind = type(self).__name__
        if not cloud:
            raise ValueError(f"{kind} needs a cloud name (a key of clouds.yaml)")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0 or backoff_max_s < 0:
            raise ValueError(
                f"{kind}({cloud!r}): timeout_s must be > 0, retries, backoff_s and "
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

    def close(self) -> None:
        """Close the connection; the next call opens a new one."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception as exc:  # closing must not fail the caller either
                log.debug("closing the connection to cloud %r: %s", self.cloud, exc)

    def __enter__(self) -> OpenStackClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection(self) -> Connection:
        with self._lock:
            if self._conn is None:
                factory = self._factory
                if factory is None:
                    import openstack

                    factory = openstack.connect
                # No openstacksdk/keystoneauth retries of their own: ours are the only ones, so
                # their number and backoff are what the configuration says. The per-service
                # keys too, since a clouds.yaml's compute_status_code_retries beats the plain one.
                self._conn = factory(cloud=self.cloud, api_timeout=self.timeout_s, **NO_SDK_RETRIES)
            return self._conn

    def call(self, operation: str, target: str, fn: Callable[[Connection], _T]) -> _T:
        """``fn`` on the connection, retried on unavailable/timeout; raises only OpenStackError."""
        attempts = self.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                with self._translated(operation, target):
                    try:
                        conn = self.connection()
                    except Exception as exc:
                        raise _ConfigFailure(exc) from exc
                    return fn(conn)
            except OpenStackError as error:
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

    def error(
        self, kind: OpenStackErrorKind, operation: str, target: str, text: str
    ) -> OpenStackError:
        """An OpenStackError whose message names the operation, its target and the cloud."""
        return OpenStackError(
            kind,
            f"{operation} of the {self.subject} {self.of}{target} on cloud "
            f"{self.cloud!r} failed: {text}",
            cloud=self.cloud,
            target=target,
            operation=operation,
        )

    @contextmanager
    def _translated(self, operation: str, target: str) -> Iterator[None]:
        """Turn whatever openstacksdk and its libraries raise into a OpenStackError."""
        try:
            yield
        except OpenStackError:
            raise
        except _ConfigFailure as failure:
            exc = failure.cause
            raise OpenStackError(
                OpenStackErrorKind.config,
                f"{operation} of the {self.subject} {self.of}{target} on cloud "
                f"{self.cloud!r} failed: cannot connect with the clouds.yaml entry "
                f"{self.cloud!r}: {describe(exc)}",
                cloud=self.cloud,
                target=target,
                operation=operation,
            ) from exc
        except Exception as exc:
            kind, status, message = _classify(exc)
            http = f" (HTTP {status})" if status is not None else ""
            hint = self.hints.get(kind) or _HINTS[kind]
            raise OpenStackError(
                kind,
                f"{operation} of the {self.subject} {self.of}{target} on cloud "
                f"{self.cloud!r} failed: {hint}{http}: {message}",
                cloud=self.cloud,
                target=target,
                operation=operation,
                status=status,
            ) from exc


_HINTS: dict[OpenStackErrorKind, str] = {
    OpenStackErrorKind.unauthorized: (
        "authentication refused: check the credentials of this cloud in clouds.yaml"
    ),
    OpenStackErrorKind.forbidden: "not allowed: the policy of the service refused this user",
    OpenStackErrorKind.not_found: "not found: check the project id and the service's endpoint",
    OpenStackErrorKind.bad_request: "the service refused the request",
    OpenStackErrorKind.conflict: (
        "the service reports a conflict (another writer at the same time?)"
    ),
    OpenStackErrorKind.unsupported_version: (
        "the service does not support the API version asked for"
    ),
    OpenStackErrorKind.unavailable: "the cloud is unavailable",
    OpenStackErrorKind.timeout: "no answer within the timeout",
    OpenStackErrorKind.config: "the cloud's configuration is unusable",
    OpenStackErrorKind.error: "unexpected failure",
}


class _ConfigFailure(GmdError):
    """Building the connection failed (unknown cloud, bad clouds.yaml): never retried."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause
