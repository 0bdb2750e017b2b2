"""What the agent's collector and appliers share about libvirt: how a connection is opened and
what its error codes mean, so that both tell a vanished VM from a lost connection alike.

Importing this module silences libvirt's default error handler, which prints every error to
stderr; the agent logs the errors it cares about itself.
"""

from __future__ import annotations

import contextlib
from typing import Any

import libvirt

# The domain stopped or was undefined between two calls.
DOMAIN_GONE = frozenset({libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_OPERATION_INVALID})
# The domain is there but cannot be read now: another libvirt job holds it (a migration, a
# snapshot) or its QEMU or guest agent did not answer in time. Not an error of libvirt's: the
# domain is read again at the next tick, from its last counters.
DOMAIN_BUSY = frozenset({libvirt.VIR_ERR_OPERATION_TIMEOUT, libvirt.VIR_ERR_AGENT_UNRESPONSIVE})
# Looking up a VM by uuid: these mean "no such VM here" (a uuid libvirt cannot parse included);
# anything else is libvirt failing, which must not make gmd forget what it changed.
NO_SUCH_DOMAIN = DOMAIN_GONE | {libvirt.VIR_ERR_INVALID_ARG}
# The connection itself failed: nothing more can be done through it until it is reopened.
CONNECTION_LOST = frozenset(
    {
        libvirt.VIR_ERR_SYSTEM_ERROR,
        libvirt.VIR_ERR_RPC,
        libvirt.VIR_ERR_INVALID_CONN,
        libvirt.VIR_ERR_NO_CONNECT,
    }
)


def _quiet(_ctx: object, _err: object) -> None:
    """Stands in for libvirt's handler, which would print each error a second time."""


libvirt.registerErrorHandler(_quiet, None)


def open_connection(uri: str, *, read_only: bool) -> Any:
    """A new connection to ``uri``; raises ``libvirt.libvirtError`` when it cannot be had."""
    return libvirt.openReadOnly(uri) if read_only else libvirt.open(uri)


def reason(exc: BaseException) -> str:
    """The part of a failed call worth reporting: libvirt's own message without its prefix,
    or which key its answer lacked."""
    if isinstance(exc, libvirt.libvirtError):
        return str(exc.get_error_message() or exc).strip()
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r} in the answer"
    return str(exc)


class LazyConnection:
    """A connection the caller lends (used as is, never closed here) or a URI, opened on first
    use and, once closed after a loss, opened again on the next use."""

    def __init__(self, conn_or_uri: Any, *, read_only: bool) -> None:
        self.read_only = read_only
        if isinstance(conn_or_uri, str):
            self.uri, self._conn, self._owned = conn_or_uri, None, True
        else:
            self.uri, self._conn, self._owned = conn_or_uri.getURI(), conn_or_uri, False

    def get(self) -> Any:
        """The open connection; raises ``libvirt.libvirtError`` when it cannot be opened."""
        if self._conn is None:
            self._conn = open_connection(self.uri, read_only=self.read_only)
        return self._conn

    def close(self) -> None:
        """Close a connection opened here, so the next :meth:`get` opens a fresh one."""
        if self._owned and self._conn is not None:
            with contextlib.suppress(libvirt.libvirtError):
                self._conn.close()
            self._conn = None
