"""libvirt's domain lifecycle events, so the kernel collector need not ask libvirt every tick.

Without events the only way to learn that a domain started or stopped is to list the domains,
one RPC to libvirtd per tick; with them the list is read again only after an event (or every
``describe_every_s``, in case one was missed), and a tick in which no domain started or
stopped makes no libvirt call at all.

Events reach a process only through an event loop: :func:`start_event_loop` registers
libvirt's default implementation and runs it on a daemon thread, once per process, and must
run before the connection is opened (a connection opened earlier delivers no events). The loop
also carries the connections' keepalive, so a libvirtd that dies or restarts closes the
connection at once (the close callback, which the connection's owner
:class:`gmd.agent.libvirt_conn.LibvirtConnection` registers), instead of at the next call, and
the collector lists again on the new one: events sent while no connection listened are lost,
the listing is not.

:class:`LifecycleWatch` keeps the registration of one connection at a time: the owner calls
its :meth:`~LifecycleWatch.watch` on each connection it opens and
:meth:`~LifecycleWatch.unwatch` before it drops one. Its callbacks run
on the loop's thread: they only set flags and call the handler given to it, which must not
block for long (the loop also carries every other connection's keepalive).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from enum import Enum
from typing import Any

import libvirt

log = logging.getLogger(__name__)

_loop_lock = threading.Lock()
_loop_thread: threading.Thread | None = None


class Lifecycle(Enum):
    """libvirt's lifecycle event kinds (``VIR_DOMAIN_EVENT_*``), named for the logs."""

    DEFINED = libvirt.VIR_DOMAIN_EVENT_DEFINED
    UNDEFINED = libvirt.VIR_DOMAIN_EVENT_UNDEFINED
    STARTED = libvirt.VIR_DOMAIN_EVENT_STARTED
    SUSPENDED = libvirt.VIR_DOMAIN_EVENT_SUSPENDED
    RESUMED = libvirt.VIR_DOMAIN_EVENT_RESUMED
    STOPPED = libvirt.VIR_DOMAIN_EVENT_STOPPED
    SHUTDOWN = libvirt.VIR_DOMAIN_EVENT_SHUTDOWN
    PMSUSPENDED = libvirt.VIR_DOMAIN_EVENT_PMSUSPENDED
    CRASHED = libvirt.VIR_DOMAIN_EVENT_CRASHED
    OTHER = -1
    """a kind newer than this libvirt binding"""

    @classmethod
    def of(cls, code: int) -> Lifecycle:
        try:
            return cls(code)
        except ValueError:
            return cls.OTHER


LAST_MOMENTS = frozenset({Lifecycle.SHUTDOWN, Lifecycle.SUSPENDED})
"""Events after which a domain's process may end before the next tick while its counters can
still be read: the guest shut down (QEMU has stopped the vCPUs; libvirt kills it next) or was
paused (at the end of an outgoing migration, before its process on this host is killed). A
``STOPPED`` event comes too late: libvirt removes the cgroups before sending it."""


def start_event_loop() -> None:
    """libvirt's default event loop on a daemon thread, started once per process."""
    global _loop_thread
    with _loop_lock:
        if _loop_thread is not None:
            return
        libvirt.virEventRegisterDefaultImpl()
        _loop_thread = threading.Thread(target=_run_loop, name="libvirt-events", daemon=True)
        _loop_thread.start()


def _run_loop() -> None:
    while True:
        try:
            libvirt.virEventRunDefaultImpl()
        except libvirt.libvirtError as exc:
            log.warning("libvirt's event loop: %s", exc)


class LifecycleWatch:
    """The lifecycle events of the connection last given to :meth:`watch`.

    ``on_event(uuid, kind, domain)`` runs on the event loop's thread for every event.
    """

    def __init__(self, on_event: Callable[[str, Lifecycle, Any], None]) -> None:
        self._on_event = on_event
        self._conn: Any = None
        self._callback_id: int | None = None
        self._changed = True
        self.available = True
        """false once a connection refused the registration (a driver without events): the
        caller then lists every tick"""

    def watch(self, conn: Any) -> None:
        """Listen to ``conn`` (a no-op when it is already the one listened to)."""
        if conn is self._conn:
            return
        self.unwatch()
        self._conn, self._changed = conn, True
        try:
            self._callback_id = conn.domainEventRegisterAny(
                None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._lifecycle, None
            )
        except libvirt.libvirtError as exc:
            if self.available:
                log.warning(
                    "libvirt at %s sends no domain events (%s): listing the domains every tick",
                    conn.getURI(),
                    exc,
                )
            self.available = False
            return
        self.available = True

    def take_changed(self) -> bool:
        """Whether a domain may have started or stopped since the last call (always, without
        events); clears the flag, so an event arriving after the call counts for the next."""
        changed, self._changed = self._changed, False
        return changed or not self.available

    def unwatch(self) -> None:
        """Stop listening; before the connection is closed, so no callback outlives it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(libvirt.libvirtError):
            if self._callback_id is not None:
                conn.domainEventDeregisterAny(self._callback_id)
        self._callback_id = None

    def _lifecycle(self, _conn: Any, dom: Any, event: int, _detail: int, _opaque: Any) -> None:
        try:
            self._on_event(dom.UUIDString(), Lifecycle.of(event), dom)
        except Exception:
            # An exception here would only reach libvirt's C loop, which prints and drops it.
            log.exception("handling a libvirt lifecycle event")
        finally:
            # After the handler: a tick listing again meanwhile would find a shut-down domain
            # gone and let go of it before its last moment is read.
            self._changed = True
