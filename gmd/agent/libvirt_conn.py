"""What the agent's collectors and appliers share about libvirt: the one owner of a connection
(opening, backoff, the close callback, hooks for lifecycle events) and what its error codes
mean, so that all of them tell a vanished VM from a lost connection alike.

Importing this module silences libvirt's default error handler, which prints every error to
stderr; the agent logs the errors it cares about itself.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import libvirt

log = logging.getLogger(__name__)

# The domain was undefined between two calls: it is gone, whatever the call was.
DOMAIN_GONE = frozenset({libvirt.VIR_ERR_NO_DOMAIN})
# "Requested operation is not valid": what libvirt answers a LIVE call on a domain that stopped
# between two calls, and also what it answers on a running one for a knob this host lacks
# (blkio weight without BFQ: "blkio device weight is valid only for bfq or cfq scheduler").
# Only the domain's state tells which (:func:`gone`). A reader of counters may take it for a
# stopped domain: a stopped domain's counters are what it cannot read.
DOMAIN_GONE_OR_INVALID = DOMAIN_GONE | {libvirt.VIR_ERR_OPERATION_INVALID}
# The domain is there but cannot be read now: another libvirt job holds it (a migration, a
# snapshot) or its QEMU or guest agent did not answer in time. Not an error of libvirt's: the
# domain is read again at the next tick, from its last counters.
DOMAIN_BUSY = frozenset({libvirt.VIR_ERR_OPERATION_TIMEOUT, libvirt.VIR_ERR_AGENT_UNRESPONSIVE})
# Looking up a VM by uuid: these mean "no such VM here" (a uuid libvirt cannot parse included);
# anything else is libvirt failing, which must not make gmd forget what it changed.
NO_SUCH_DOMAIN = DOMAIN_GONE_OR_INVALID | {libvirt.VIR_ERR_INVALID_ARG}
# The connection itself failed: nothing more can be done through it until it is reopened.
CONNECTION_LOST = frozenset(
    {
        libvirt.VIR_ERR_SYSTEM_ERROR,
        libvirt.VIR_ERR_RPC,
        libvirt.VIR_ERR_INVALID_CONN,
        libvirt.VIR_ERR_NO_CONNECT,
    }
)


def gone(dom: Any, exc: libvirt.libvirtError) -> bool:
    """Whether ``exc``, raised by a call on ``dom``, means the domain is no longer running
    here, rather than that the call is refused for a running domain (see
    :data:`DOMAIN_GONE_OR_INVALID`)."""
    code = exc.get_error_code()
    if code in DOMAIN_GONE:
        return True
    if code not in DOMAIN_GONE_OR_INVALID:
        return False
    try:
        return not dom.isActive()
    except libvirt.libvirtError as again:
        return again.get_error_code() in DOMAIN_GONE_OR_INVALID


def _quiet(_ctx: object, _err: object) -> None:
    """Stands in for libvirt's handler, which would print each error a second time."""


libvirt.registerErrorHandler(_quiet, None)


def open_connection(uri: str, *, read_only: bool) -> Any:
    """A new connection to ``uri``; raises ``libvirt.libvirtError`` when it cannot be had."""
    return libvirt.openReadOnly(uri) if read_only else libvirt.open(uri)


_AUTH_ERRORS = frozenset(
    code
    for name in ("VIR_ERR_AUTH_FAILED", "VIR_ERR_AUTH_UNAVAILABLE", "VIR_ERR_AUTH_CANCELLED")
    if (code := getattr(libvirt, name, None)) is not None
)


def refused(uri: str, exc: libvirt.libvirtError) -> str:
    """Why a connection to ``uri`` was refused, with what this user needs, where libvirt
    refused it for want of rights (the user gmd without systemd: no polkit, no D-Bus)."""
    text = str(exc)
    if exc.get_error_code() not in _AUTH_ERRORS and not any(
        word in text for word in ("Permission denied", "polkit", "authentication")
    ):
        return f"cannot connect to libvirt at {uri}: {text}"
    return (
        f"cannot connect to libvirt at {uri}: {text} — this user may not use libvirt's"
        " read-write socket: run gmd-agent as root, or as a member of group libvirt where"
        " libvirtd lets that group in without polkit (libvirtd.conf: unix_sock_group ="
        ' "libvirt", unix_sock_rw_perms = "0770", auth_unix_rw = "none"; docs/install.md)'
    )


def reason(exc: BaseException) -> str:
    """The part of a failed call worth reporting: libvirt's own message without its prefix,
    or which key its answer lacked."""
    if isinstance(exc, libvirt.libvirtError):
        return str(exc.get_error_message() or exc).strip()
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r} in the answer"
    return str(exc)


class LibvirtConnection:
    """The one owner of a libvirt connection, for the collectors and the appliers alike.

    Opened on first use; after a failure (it could not be opened, a call found it lost, or
    libvirt's close callback said libvirtd went away) it is dropped and reopened on a later
    :meth:`get`, waiting ``backoff_initial_s`` doubling up to ``backoff_max_s`` between tries,
    so that a libvirtd that is down is not hammered every tick and the log says once per try
    why. ``on_open`` callbacks run on each new connection (registering lifecycle events, asking
    the driver's type); ``on_close`` ones before it is closed (deregistering them), so no
    callback outlives its connection.

    A connection lent by the caller (a test's, a ``test:///`` one) is used as is: never closed
    here, and ``lost`` only reports."""

    def __init__(
        self,
        conn_or_uri: Any,
        *,
        read_only: bool,
        opener: Callable[[str], Any] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
    ) -> None:
        self.read_only = read_only
        self._opener = opener or functools.partial(open_connection, read_only=read_only)
        self._monotonic = monotonic
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self._conn: Any = None
        self._lent: Any = None
        if isinstance(conn_or_uri, str):
            self.uri = conn_or_uri
        else:
            self.uri, self._lent = conn_or_uri.getURI(), conn_or_uri
        self._failures = 0
        self._retry_at = 0.0
        self._closed_under_us = False
        self.down_reason = ""
        """why there is no connection now, and when the next try is"""
        self._on_open: list[Callable[[Any], None]] = []
        self._on_close: list[Callable[[Any], None]] = []

    def on_open(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(conn)`` on every connection opened from now on."""
        self._on_open.append(callback)

    def on_close(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(conn)`` before a connection is dropped."""
        self._on_close.append(callback)

    def get(self) -> Any:
        """The open connection, opened now if need be; ``None`` while waiting to try again
        after a failure (:attr:`down_reason` says why)."""
        if self._closed_under_us:
            self._closed_under_us = False
            self.lost("the connection closed", "waiting for events")
        if self._conn is not None:
            return self._conn
        if self._monotonic() < self._retry_at:
            return None
        try:
            conn = self._lent if self._lent is not None else self._opener(self.uri)
        except libvirt.libvirtError as exc:
            self._failed(refused(self.uri, exc))
            return None
        self._conn = conn
        if self._lent is None:
            try:
                conn.registerCloseCallback(self._closed, None)
            except libvirt.libvirtError as exc:
                log.debug("no close callback on the libvirt connection: %s", exc)
            if self._failures:
                log.info("reconnected to libvirt at %s after %d failures", self.uri, self._failures)
            else:
                log.info("connected to libvirt at %s", self.uri)
        self._failures = 0
        self.down_reason = ""
        for callback in self._on_open:
            callback(conn)
        return conn

    def lost(self, exc: BaseException | str, during: str) -> None:
        """Drop a connection that failed ``during`` something; the next one waits a backoff."""
        self._drop()
        self._failed(f"libvirt connection to {self.uri} lost while {during}: {exc}")

    def close(self) -> None:
        """Drop the connection (the next :meth:`get` opens a new one at once)."""
        self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        for callback in self._on_close:
            with contextlib.suppress(libvirt.libvirtError):
                callback(conn)
        if conn is not self._lent:
            with contextlib.suppress(libvirt.libvirtError):
                conn.unregisterCloseCallback()
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()

    def _failed(self, why: str) -> None:
        delay = min(self.backoff_initial_s * 2**self._failures, self.backoff_max_s)
        self._failures += 1
        self._retry_at = self._monotonic() + delay
        self.down_reason = f"{why}; retrying in {delay:g} s" if delay else why
        log.warning("%s", self.down_reason)

    def _closed(self, _conn: Any, why: int, _opaque: Any) -> None:
        """libvirt's close callback (on its event loop's thread): libvirtd went away. The
        next :meth:`get`, on the agent's thread, drops the connection and tries again."""
        self._closed_under_us = True
        log.warning("libvirt connection to %s closed (reason %d)", self.uri, why)
