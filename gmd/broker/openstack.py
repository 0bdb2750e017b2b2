"""The OpenStack handler: each federation request a server that Nova boots in the federation's
project, deleted once it has run; the site offers its configured cores, never more than
Placement's spare VCPU.

**One way of reaching the cloud.** Nova, Glance and Placement are spoken to through
:class:`~gmd.openstack.client.OpenStackClient`, gmd's one owner of a connection to OpenStack
(gmd-daemon's too): an openstacksdk connection from a clouds.yaml entry, raw HTTP on its
service adapters at a chosen microversion, every request bounded by ``timeout_s`` and every
failure one error in one line (an :class:`~gmd.openstack.client.OpenStackError`) that names
the call, the project and the cloud. Placement is read by the daemon's reader
(:class:`~gmd.openstack.placement.PlacementReader`, in the broker's words). No retries inside
a call: the broker's thread waits on these calls, and the next poll asks again anyway.

**Never in the broker's way.** The broker calls its handler from its one thread, each tick.
Nothing here blocks for longer than a request's timeout and nothing raises into the loop but
:meth:`OpenStackHandler.running` before Nova has ever answered (the broker cannot reconcile
what it runs with ZooKeeper without knowing it; it tries again later). A boot is asked for and
left: :meth:`~OpenStackHandler.start` returns once Nova took the request; how the server is
doing is read by one listing of the project's federation servers at most every ``poll_s``.

**The life of a request here.** ``start`` boots ``gmd-fed-<name>`` with the smallest flavor
that has the request's cores, tagged ``gmd-federation`` and with metadata that says whose it
is (the request's id, organisation and site, and this site as its runner). A server ACTIVE for
the request's ``run_s`` (counted from the earliest moment it is known to be ACTIVE) is deleted
and reported finished and completed, with the seconds it ran. A server that went to ERROR, was
refused, or did not become ACTIVE within ``boot_timeout_s`` is deleted and reported finished
but not completed, and the site then offers nothing for ``pause_s``. A server that vanished
(someone deleted it) is reported not completed. ``stop`` deletes the server and reports
nothing.

**After a restart** the servers are found again: the first listing adopts every federation
server of this site (by its metadata), so that the broker's reconciliation keeps those
ZooKeeper still says are this site's and stops the others. A server of this site that no
request here owns (its boot's answer was lost, and the request failed or was stopped since)
is deleted. A failed delete is asked again at each poll until Nova no longer lists the server.

**Spare capacity** is one Placement request, ``GET /allocation_candidates`` for one VCPU on
compute hosts that are not disabled: its provider summaries give each host's VCPU capacity
(``(total - reserved) × allocation_ratio``) and use. The sum of what is left is read at most
every ``spare_s``; the boots asked for since are taken off it, since Placement does not count
them yet. A Placement that cannot be read offers nothing, with a warning. The sum is over all
hosts: a request larger than any one host's spare is refused by Nova's scheduler (ERROR: "No
valid host"), fails here and goes back to the federation.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol
from urllib.parse import quote

from gmd import GmdError
from gmd.broker.config import OpenStackSettings
from gmd.broker.coordination import Request
from gmd.broker.handlers import Finished, HandlerUnavailable
from gmd.openstack.client import (
    ConnectionFactory,
    MalformedAnswer,
    OpenStackClient,
    OpenStackError,
    OpenStackErrorKind,
    checked,
)
from gmd.openstack.placement import PlacementReader

if TYPE_CHECKING:
    from openstack.connection import Connection

log = logging.getLogger(__name__)

COMPUTE_MICROVERSION = "2.52"
"""The oldest that does all the handler asks: ``networks: "none"`` (2.37), a flavor's vCPUs in
a server's details (2.47), tags given at boot (2.52) and listings filtered by tag (2.26)."""
TAG = "gmd-federation"
"""Every federation server's tag: what the handler lists."""
PREFIX = "gmd-fed-"
"""A federation server's name is this and the request's node name (``gmd-fed-req-0000000012``)."""
REASK_S = 60.0
"""A server asked to be deleted that Nova still lists, and not as being deleted, after this
long is asked again."""
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$")


class NoFlavor(GmdError):
    """No allowed flavor has the cores a request needs."""


@dataclass(frozen=True)
class NovaFlavor:
    id: str
    name: str
    vcpus: int
    ram_mb: int
    disk_gb: int


@dataclass(frozen=True)
class Listed:
    """A federation server as Nova listed it."""

    id: str
    status: str
    task_state: str | None
    metadata: dict[str, str]
    vcpus: float
    launched_s: float | None
    """when it went ACTIVE (Unix time, Nova's clock; whole seconds, cut down)"""
    fault: str


class Nova(Protocol):
    """What the handler asks Nova (and Glance) in the federation's project."""

    def flavors(self) -> list[NovaFlavor]: ...
    def image_id(self, image: str) -> str: ...
    def create(self, body: dict[str, Any]) -> str: ...
    def servers(self) -> list[Listed]: ...
    def delete(self, server_id: str) -> None: ...
    def close(self) -> None: ...


class Placement(Protocol):
    def spare_vcpus(self) -> float: ...
    def close(self) -> None: ...


class NovaServers(OpenStackClient):
    """The federation's servers in its project: flavors, the image, boot, list and delete,
    each one HTTP request of at most ``timeout_s`` (no retries: the caller asks again)."""

    subject = "federation servers"
    hints: ClassVar[dict[OpenStackErrorKind, str]] = {
        OpenStackErrorKind.forbidden: "refused by Nova (the project's quota, or its policy)",
        OpenStackErrorKind.bad_request: "Nova refused the request",
        OpenStackErrorKind.not_found: "not found: check the image, the flavors and the project",
    }

    def __init__(
        self,
        cloud: str,
        project: str = "",
        *,
        timeout_s: float,
        connection_factory: ConnectionFactory | None = None,
    ) -> None:
        if connection_factory is None and project:
            connection_factory = _scoped_to(project)
        super().__init__(
            cloud, timeout_s=timeout_s, retries=0, connection_factory=connection_factory
        )
        self.project = project or "(the entry's own)"

    def _call(self, operation: str, fn: Callable[[Connection], Any]) -> Any:
        return self.call(operation, self.project, fn)

    def flavors(self) -> list[NovaFlavor]:
        def read(conn: Connection) -> list[NovaFlavor]:
            body = checked(conn.compute.get("/flavors/detail", microversion=COMPUTE_MICROVERSION))
            items = body.get("flavors") if isinstance(body, dict) else None
            if not isinstance(items, list):
                raise MalformedAnswer("Nova's answer has no list 'flavors'")
            return [
                NovaFlavor(
                    str(f["id"]),
                    str(f.get("name", "")),
                    int(f.get("vcpus", 0)),
                    int(f.get("ram", 0)),
                    int(f.get("disk", 0)),
                )
                for f in items
                if isinstance(f, dict) and "id" in f
            ]

        result: list[NovaFlavor] = self._call("list of the flavors", read)
        return result

    def image_id(self, image: str) -> str:
        """``image``'s id: itself when it is a uuid, else the one image of that name."""
        if _UUID.match(image):
            return image

        def read(conn: Connection) -> str:
            body = checked(conn.image.get(f"/images?name={quote(image)}"))
            items = body.get("images") if isinstance(body, dict) else None
            if not isinstance(items, list):
                raise MalformedAnswer("Glance's answer has no list 'images'")
            ids = [str(i["id"]) for i in items if isinstance(i, dict) and "id" in i]
            if len(ids) != 1:
                found = "no image" if not ids else f"{len(ids)} images"
                raise MalformedAnswer(f"{found} named {image!r}: name one by its id")
            return ids[0]

        result: str = self._call("lookup of the image", read)
        return result

    def create(self, body: dict[str, Any]) -> str:
        def post(conn: Connection) -> str:
            answer = checked(
                conn.compute.post("/servers", json=body, microversion=COMPUTE_MICROVERSION)
            )
            server = answer.get("server") if isinstance(answer, dict) else None
            if not isinstance(server, dict) or "id" not in server:
                raise MalformedAnswer("Nova's answer to a boot has no server id")
            return str(server["id"])

        result: str = self._call("boot", post)
        return result

    def servers(self) -> list[Listed]:
        def read(conn: Connection) -> list[Listed]:
            body = checked(
                conn.compute.get(f"/servers/detail?tags={TAG}", microversion=COMPUTE_MICROVERSION)
            )
            items = body.get("servers") if isinstance(body, dict) else None
            if not isinstance(items, list):
                raise MalformedAnswer("Nova's answer has no list 'servers'")
            return [listed(s) for s in items if isinstance(s, dict) and "id" in s]

        result: list[Listed] = self._call("list", read)
        return result

    def delete(self, server_id: str) -> None:
        def delete(conn: Connection) -> None:
            response = conn.compute.delete(f"/servers/{server_id}")
            if int(response.status_code) != 404:  # gone already: what was asked
                checked(response)

        self._call(f"delete of server {server_id}", delete)


def _scoped_to(project: str) -> ConnectionFactory:
    """Connections of the clouds.yaml entry, scoped to ``project`` (by name) instead of the
    entry's own project: one account may serve the federation's project and others."""

    def connect(**kwargs: Any) -> Connection:
        import openstack

        return openstack.connect(project_name=project, **kwargs)

    return connect


def listed(server: dict[str, Any]) -> Listed:
    """A server of ``GET /servers/detail`` (a malformed field reads as absent)."""
    metadata = server.get("metadata")
    flavor = server.get("flavor")
    fault = server.get("fault")
    vcpus = flavor.get("vcpus") if isinstance(flavor, dict) else None
    return Listed(
        id=str(server["id"]),
        status=str(server.get("status", "")),
        task_state=server.get("OS-EXT-STS:task_state") or None,
        metadata={str(k): str(v) for k, v in metadata.items()}
        if isinstance(metadata, dict)
        else {},
        vcpus=float(vcpus) if isinstance(vcpus, int | float) else 0.0,
        launched_s=_utc_seconds(server.get("OS-SRV-USG:launched_at")),
        fault=str(fault.get("message", "")) if isinstance(fault, dict) else "",
    )


def _utc_seconds(text: Any) -> float | None:
    """Nova's ``2026-11-27T14:06:11.000000`` (UTC, no offset) as Unix time."""
    if not isinstance(text, str) or not text:
        return None
    try:
        when = datetime.fromisoformat(text.rstrip("Z"))
    except ValueError:
        return None
    return when.replace(tzinfo=when.tzinfo or UTC).timestamp()


class PlacementSpare(PlacementReader):
    """The cloud's spare VCPU, from Placement (:meth:`~PlacementReader.spare_vcpus`: one
    request, no retries): the one Placement reader, in the broker's words."""

    subject = "spare VCPU in Placement"
    hints: ClassVar[dict[OpenStackErrorKind, str]] = {
        OpenStackErrorKind.forbidden: "not allowed by Placement's policy: allocation candidates"
        " need an admin (or service) account: broker.openstack.placement_cloud",
    }


@dataclass
class _Job:
    """A request this handler runs: its server (None while a boot's answer is unknown)."""

    name: str
    request_id: str
    cores: float
    """the vCPUs its server holds (its flavor's)"""
    run_s: float
    asked: float
    """monotonic: when its boot was asked for (or when it was found again)"""
    server_id: str | None = None
    active: float | None = None
    """monotonic: the earliest moment it is known to have been ACTIVE"""
    adopted: bool = False
    """found again in Nova after a restart (it may have been ACTIVE long before)"""
    missed: int = 0
    """listings in a row that did not show its server"""


@dataclass
class OpenStackHandler:
    """A :class:`~gmd.broker.handlers.ResourceHandler` on one OpenStack cloud (see the module's
    notes). ``nova`` and ``placement`` default to clients of ``settings``' clouds.yaml entries."""

    site: str
    cores: float
    """what the site offers the federation, in cores"""
    settings: OpenStackSettings
    nova: Nova | None = None
    placement: Placement | None = None
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    _jobs: dict[str, _Job] = field(default_factory=dict)
    _done: list[Finished] = field(default_factory=list)
    _doomed: dict[str, tuple[str, float]] = field(default_factory=dict)
    """server id → why it is to go, and when its delete was last asked (monotonic; -inf: a
    delete that failed): kept while Nova lists it"""
    _listed_once: bool = False
    _polled: float = -math.inf
    _paused_until: float = -math.inf
    _spare: float | None = None
    _spare_read: float = -math.inf
    _flavors: list[NovaFlavor] | None = None
    _image: str | None = None

    def __post_init__(self) -> None:
        s = self.settings
        if self.nova is None:
            self.nova = NovaServers(s.cloud, s.project, timeout_s=s.timeout_s)
        if self.placement is None:
            self.placement = PlacementSpare(s.placement_cloud or s.cloud, timeout_s=s.timeout_s)

    @property
    def _nova(self) -> Nova:
        assert self.nova is not None
        return self.nova

    def check(self) -> None:
        """At the broker's start: list the project's servers (finding those a previous run
        left) and read Placement once. Raises :class:`HandlerUnavailable` when the cloud
        refuses (a clouds.yaml entry, credentials, a policy, a project: nothing that mends by
        waiting); an unreachable one is waited out, the site offering nothing meanwhile."""
        now = self.clock()
        problems = [self._poll(now), self._read_spare(now)]
        for problem in problems:
            if problem is not None and not problem.retryable:
                raise HandlerUnavailable(f"{self.site}: {problem}")

    # -- the protocol -------------------------------------------------------------------------

    def capacity_cores(self) -> float:
        return self.cores

    def free_cores(self) -> float:
        """The offered cores less what this handler's servers hold, never more than
        Placement's spare VCPU; nothing while paused after a failed boot, or when Placement
        cannot be read."""
        self._tick()
        now = self.clock()
        if not self._listed_once or now < self._paused_until:
            return 0.0  # what runs here is not known yet, or booting fails here
        spare = self._spare_now(now)
        if spare is None:
            return 0.0
        held = sum(job.cores for job in self._jobs.values())
        return max(0.0, min(self.cores - held, spare))

    def start(self, name: str, request: Request) -> None:
        """Ask Nova for the request's server and return; how it does is read by the polls.
        Nothing raises: a boot refused (or impossible: no flavor fits) is a request finished
        and not completed at once, and pauses the site's offer."""
        now = self.clock()
        try:
            flavor = self._flavor_for(request.cores)
            body = self._boot_body(name, request, flavor)
        except (OpenStackError, NoFlavor) as exc:
            self._failed(name, request.id, 0.0, str(exc), pause=True)
            return
        job = _Job(name, request.id, float(flavor.vcpus), request.run_s, now)
        try:
            job.server_id = self._nova.create(body)
        except OpenStackError as exc:
            if not exc.retryable:
                self._failed(name, request.id, 0.0, str(exc), pause=True)
                return
            # no answer: Nova may have made it all the same; the polls find it by its metadata
            log.warning("%s: %s: boot unanswered, looking for its server: %s", self.site, name, exc)
        self._jobs[name] = job
        log.info(
            "%s: booting %s%s (%s, %s vCPUs) for request %s of %s",
            self.site,
            PREFIX,
            name,
            flavor.name,
            flavor.vcpus,
            request.id,
            request.org,
        )

    def stop(self, name: str) -> None:
        """Delete the request's server (taken from this site); no finish is reported."""
        job = self._jobs.pop(name, None)
        self._done = [d for d in self._done if d.name != name]
        if job is not None and job.server_id is not None:
            self._delete(job.server_id, f"{name} stopped")
        # a server whose boot is unanswered is deleted when a listing shows it (no job owns it)

    def running(self) -> set[str]:
        """The requests with a server here (and those finished but not yet reported). Raises
        :class:`HandlerUnavailable` until Nova has listed the project's servers once: before
        that, servers booted before a restart would be missed."""
        self._tick()
        if not self._listed_once:
            raise HandlerUnavailable(
                f"{self.site}: Nova has not listed the federation's servers yet"
                " (they cannot be told apart from requests that are not running)"
            )
        return set(self._jobs) | {d.name for d in self._done}

    def finished(self) -> list[Finished]:
        self._tick()
        done, self._done = self._done, []
        return done

    def close(self, delete: bool = True) -> None:
        """Delete every server of this handler (the broker stops: its site leaves the
        federation, whose other brokers run its requests again), then close the connections.
        ``delete=False`` leaves them running, as a crash would, for a new handler to find."""
        if delete:
            for name in list(self._jobs):
                self.stop(name)
            for server_id, (why, asked) in list(self._doomed.items()):
                if asked == -math.inf:
                    self._delete(server_id, why)
        self._nova.close()
        if self.placement is not None:
            self.placement.close()

    # -- Nova: the polls ----------------------------------------------------------------------

    def _tick(self) -> None:
        now = self.clock()
        if now - self._polled >= self.settings.poll_s:
            self._poll(now)
        for job in list(self._jobs.values()):
            if job.active is not None and now - job.active >= job.run_s:
                self._retire(job, now)

    def _poll(self, now: float) -> OpenStackError | None:
        """One listing of the project's federation servers, and what follows from it; what
        failed (the client logged it; the next poll asks again)."""
        self._polled = now
        try:
            servers = self._nova.servers()
        except OpenStackError as exc:
            return exc
        mine = [s for s in servers if s.metadata.get("gmd_runner") == self.site]
        if not self._listed_once:
            self._listed_once = True
            self._adopt(mine, now)
        by_id = {s.id: s for s in mine}
        by_name = {s.metadata.get("gmd_name", ""): s for s in mine}
        for job in list(self._jobs.values()):
            server = by_id.get(job.server_id) if job.server_id else by_name.get(job.name)
            if server is None:
                job.missed += 1
                self._missing(job, now)
            else:
                job.server_id, job.missed = server.id, 0
                self._observe(job, server, now)
        owned = {job.server_id for job in self._jobs.values()}
        for server in mine:
            if server.id not in owned and server.id not in self._doomed:
                why = f"{server.metadata.get('gmd_name', '?')}: no request here owns it"
                self._doomed[server.id] = (why, -math.inf)
        self._delete_doomed({s.id: s for s in servers}, now)
        return None

    def _adopt(self, mine: list[Listed], now: float) -> None:
        """The first listing: the servers a previous run of this site left (a crash, a
        restart) are its requests again, counted from when Nova says they went ACTIVE."""
        for server in mine:
            name = server.metadata.get("gmd_name", "")
            if not name or name in self._jobs or server.task_state == "deleting":
                continue
            if server.status == "ERROR":
                self._doomed[server.id] = (f"{name}: in ERROR when found again", -math.inf)
                continue
            try:
                run_s = float(server.metadata.get("gmd_run_s", "0"))
            except ValueError:
                run_s = 0.0
            request_id = server.metadata.get("gmd_request", name)
            job = _Job(name, request_id, server.vcpus, run_s, now, server.id, adopted=True)
            self._jobs[name] = job
            log.info("%s: found %s%s running again (server %s)", self.site, PREFIX, name, server.id)

    def _missing(self, job: _Job, now: float) -> None:
        if job.server_id is not None:
            if job.missed >= 2:  # twice: not a listing that raced with something
                self._failed(job.name, job.request_id, self._ran(job, now), "its server vanished")
        elif now - job.asked > 2 * self.settings.timeout_s + self.settings.poll_s:
            # the unanswered boot made nothing (a boot still under way would be listed by now)
            self._failed(job.name, job.request_id, 0.0, "Nova made no server for it", pause=True)

    def _observe(self, job: _Job, server: Listed, now: float) -> None:
        if server.status == "ERROR":
            fault = server.fault or "no fault recorded"
            self._failed(job.name, job.request_id, 0.0, f"server in ERROR: {fault}", pause=True)
        elif server.status == "BUILD":
            if now - job.asked > self.settings.boot_timeout_s:
                why = f"not ACTIVE {self.settings.boot_timeout_s:g} s after its boot"
                self._failed(job.name, job.request_id, 0.0, why, pause=True)
        elif job.active is None:  # ACTIVE (or since stopped, paused …: it holds its cores)
            job.active = now
            if server.launched_s is not None:
                # Nova's launched_at is cut down to the second: a second later it surely was
                # ACTIVE (a server of this run: not before its boot was asked for)
                launched = now - (self.wall() - (server.launched_s + 1.0))
                job.active = min(now, launched if job.adopted else max(job.asked, launched))

    def _retire(self, job: _Job, now: float) -> None:
        """The request ran its time: its server goes, and it is complete."""
        ran = self._ran(job, now)
        self._jobs.pop(job.name, None)
        self._done.append(Finished(job.name, ran, True))
        if job.server_id is not None:
            self._delete(job.server_id, f"{job.name} done")
        log.info("%s: %s ran %.1f s: done", self.site, job.name, ran)

    @staticmethod
    def _ran(job: _Job, now: float) -> float:
        return 0.0 if job.active is None else max(0.0, now - job.active)

    def _failed(
        self, name: str, request_id: str, ran_s: float, why: str, pause: bool = False
    ) -> None:
        job = self._jobs.pop(name, None)
        if job is not None and job.server_id is not None:
            self._delete(job.server_id, f"{name} failed")
        self._done.append(Finished(name, ran_s, False))
        if pause:
            self._paused_until = self.clock() + self.settings.pause_s
            log.error(
                "%s: request %s (%s) failed here: %s; offering nothing for %g s",
                self.site,
                request_id,
                name,
                why,
                self.settings.pause_s,
            )
        else:
            log.error("%s: request %s (%s) failed here: %s", self.site, request_id, name, why)

    def _delete(self, server_id: str, why: str) -> None:
        """Ask Nova to delete the server; it stays doomed until Nova no longer lists it (a
        failed delete is asked again at the next poll)."""
        try:
            self._nova.delete(server_id)
            asked = self.clock()
        except OpenStackError:
            asked = -math.inf  # the client logged it
        self._doomed[server_id] = (why, asked)

    def _delete_doomed(self, listed_now: dict[str, Listed], now: float) -> None:
        for server_id, (why, asked) in list(self._doomed.items()):
            server = listed_now.get(server_id)
            if server is None:
                del self._doomed[server_id]  # gone: done
            elif server.task_state != "deleting" and now - asked >= REASK_S:
                log.info("%s: deleting server %s (%s)", self.site, server_id, why)
                self._delete(server_id, why)

    # -- booting ------------------------------------------------------------------------------

    def _flavor_for(self, cores: float) -> NovaFlavor:
        """The smallest allowed flavor with the request's cores (the list is read again once
        when none fits: a flavor may have been made since)."""
        need = max(1, math.ceil(cores - 1e-9))
        for fresh in (False, True):
            if self._flavors is None or fresh:
                allowed = set(self.settings.flavors)
                self._flavors = [
                    f
                    for f in self._nova.flavors()
                    if not allowed or f.name in allowed or f.id in allowed
                ]
            fitting = [f for f in self._flavors if f.vcpus >= need]
            if fitting:
                return min(fitting, key=lambda f: (f.vcpus, f.ram_mb, f.disk_gb, f.name))
        names = ", ".join(sorted(f.name for f in self._flavors or [])) or "none"
        raise NoFlavor(f"no flavor with {need} vCPUs or more among {names} (allowed)")

    def _boot_body(self, name: str, request: Request, flavor: NovaFlavor) -> dict[str, Any]:
        if self._image is None:
            self._image = self._nova.image_id(self.settings.image)
        network = self.settings.network
        metadata = {
            "gmd_name": name,
            "gmd_request": request.id,
            "gmd_org": request.org,
            "gmd_site": request.site,
            "gmd_runner": self.site,
            "gmd_run_s": repr(float(request.run_s)),
            "gmd_cores": repr(float(request.cores)),
        }
        return {
            "server": {
                "name": f"{PREFIX}{name}"[:255],
                "imageRef": self._image,
                "flavorRef": flavor.id,
                "networks": network if network in ("none", "auto") else [{"uuid": network}],
                "tags": [TAG],
                "metadata": {k: v[:255] for k, v in metadata.items()},
            }
        }

    # -- Placement ----------------------------------------------------------------------------

    def _read_spare(self, now: float) -> OpenStackError | None:
        """Read Placement's spare VCPU now (None kept when it cannot be read); the error."""
        self._spare_read = now
        assert self.placement is not None
        try:
            self._spare = self.placement.spare_vcpus()
        except OpenStackError as exc:
            self._spare = None
            return exc
        return None

    def _spare_now(self, now: float) -> float | None:
        """Placement's spare VCPU (read at most every ``spare_s``; None: unreadable) less the
        boots asked for since it was read."""
        if now - self._spare_read >= self.settings.spare_s:
            problem = self._read_spare(now)
            if problem is not None:
                log.warning(
                    "%s: Placement's spare VCPU unknown, the site offers nothing: %s",
                    self.site,
                    problem,
                )
        if self._spare is None:
            return None
        since = sum(
            j.cores for j in self._jobs.values() if not j.adopted and j.asked >= self._spare_read
        )
        return max(0.0, self._spare - since)
