"""The federation's shared state in ZooKeeper, and the moves that change it exactly once.

Layout under ``root`` (``/gmd/federation`` by default)::

    members/<site>           ephemeral: a broker that is up (its session's), JSON of its site
    queue/req-<seq>          persistent, sequential: a request waiting, JSON :class:`Request`
    claims/req-<seq>-c-<seq> ephemeral, sequential: brokers about to take that request
    running/req-<seq>        persistent: a request some site runs, JSON :class:`Running`
    published/<site>/<id>    persistent: the site published its request ``id`` and has not yet
                             heard so (the marker of a publish whose answer may be lost)
    summaries/<org>          persistent: an organisation's contribution and use so far
    sites/<site>             persistent: how many completions a site made, and its last one

**Exactly once.** A request leaves the queue only in :meth:`Federation.consume`'s transaction,
which deletes ``queue/req-N`` (possible once) and creates ``running/req-N`` together, *and*
checks that the consumer's claim node still exists. The claim is ephemeral and its path unique
(sequential), so the check fails once the consumer's session has expired, even if another
broker has claimed the request since: a broker cut off past its session timeout can never
consume. (A version check on a fixed claim path would not do: another broker's new claim at
the same path has the same version.) Of several claimants only the one with the lowest
sequence goes on; the others withdraw. A claim
left behind by a call whose answer never came is withdrawn by its own broker
(:meth:`Federation.withdraw_claims`). A request completes only in :meth:`complete`'s
transaction, which deletes ``running/req-N`` at the version its runner read: a site whose
running requests were requeued meanwhile (the site-lost rule) cannot complete, so nothing is
counted twice. Summaries are written in the same transactions, each fenced by its version,
and so is the site's completion count (``sites/<site>``), the number its cloud's ledger files
the completion under before it is made: a broker that stopped between the two learns from it
whether its last completion counted (:mod:`gmd.broker.history`).

**Published once.** A publish creates the queue node and the site's marker for the request in
one transaction, which fails if the marker exists: a publish whose answer was lost, tried
again, is refused by ZooKeeper itself, however far the request went meanwhile (taken, run and
completed by another site while the publisher was cut off, when neither ``queue/`` nor
``running/`` holds it any more). The publisher deletes the marker once it knows the outcome,
and all its markers when it starts (an earlier process's pending publishes went with it).

**A failed transaction raises nothing in kazoo**: each operation's result is checked
(:func:`_failed`). Every call is bounded (``*_async(...).get(timeout)``): during a loss of
quorum kazoo queues requests, and a plain call would hang until quorum returns.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from gmd import GmdError
from gmd.fairness.federation import Summary, choice_order

ROOT = "/gmd/federation"
CALL_TIMEOUT_S = 10.0
"""The longest any one ZooKeeper call is waited for."""
COMPLETE_TRIES = 20
"""How often one completion is tried against other sites' concurrent writes before the
broker puts it off to its next tick."""
MAX_DATA_BYTES = 64 * 1024
"""The largest node a broker accepts to read (ZooKeeper's own limit is 1 MB)."""


class FederationError(GmdError):
    """What a broker cannot do in the federation's state, said in one line."""


class Contended(FederationError):
    """A transaction lost every try to other sites' writes of the same nodes (the summaries
    every completion adds to): nothing was made, and the same call later may succeed."""


@dataclass(frozen=True)
class Request:
    """A workload one site could not run and published for the others."""

    id: str
    """the publishing site's own id of it (unique there)"""
    org: str
    """the organisation it belongs to (its priority is that organisation's)"""
    site: str
    """the site that published it"""
    cores: float
    run_s: float
    submitted_s: float

    def __post_init__(self) -> None:
        for name in ("id", "org", "site"):
            value = getattr(self, name)
            if not isinstance(value, str) or not 0 < len(value) <= 255 or "/" in value:
                raise FederationError(f"request {name} {value!r}: 1 to 255 characters, no '/'")
        for name in ("cores", "run_s", "submitted_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise FederationError(f"request {name} {value!r}: a finite number ≥ 0")


@dataclass(frozen=True)
class Running:
    """A request a site took from the queue."""

    request: Request
    site: str
    started_s: float
    org: str = ""
    """the running site's organisation (what it lends)"""


@dataclass(frozen=True)
class Completion:
    """A completion a site made: its number among the site's completions, and what it counted
    into the summaries (``core_seconds`` lent by the site's organisation to the request's; 0
    when they are the same organisation)."""

    seq: int
    name: str
    request: Request
    core_seconds: float


@dataclass(frozen=True)
class SiteRecord:
    """What ZooKeeper keeps of one site's completions: how many, and the last."""

    seq: int
    last: Completion | None
    version: int | None
    """the node's version (None: no node yet)"""


@dataclass(frozen=True)
class OrgStanding:
    """One organisation in the federation now: its summary, its priority, and its requests
    queued, running anywhere, lent (other organisations' requests its sites run) and borrowed
    (its requests other organisations' sites run); its sites that are members."""

    org: str
    contributed: float
    used: float
    priority: float
    queued: int
    running: int
    lent: int
    borrowed: int
    sites: int


@dataclass(frozen=True)
class Claim:
    """A broker's claim on a queued request: its ephemeral claim node."""

    name: str
    """the request's node name (``req-<seq>``)"""
    path: str
    """the claim node (``claims/req-<seq>-c-<seq>``)"""


@dataclass(frozen=True)
class Moved:
    """A request the site-lost rule moved: its node's name then, and the request."""

    name: str
    request: Request


@dataclass(frozen=True)
class Queued:
    name: str
    request: Request


def _failed(results: Sequence[object]) -> bool:
    return any(isinstance(r, Exception) for r in results)


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _load(data: bytes, what: str) -> Any:
    if len(data) > MAX_DATA_BYTES:
        raise FederationError(f"{what}: {len(data)} bytes, more than a broker reads")
    try:
        return json.loads(data)
    except ValueError:
        raise FederationError(f"{what}: not JSON") from None


def _running(data: bytes, name: str) -> Running | None:
    """A running node's record; None for one that is not (it can stop no broker)."""
    try:
        doc = _load(data, f"running/{name}")
        request = Request(**doc["request"])
        return Running(request, str(doc["site"]), float(doc["started_s"]), str(doc.get("org", "")))
    except (TypeError, KeyError, ValueError, FederationError):
        return None


def read_request(data: bytes, what: str) -> Request:
    doc = _load(data, what)
    if not isinstance(doc, dict):
        raise FederationError(f"{what}: not a request")
    try:
        return Request(**doc)
    except TypeError as exc:
        raise FederationError(f"{what}: {exc}") from None


@dataclass
class Federation:
    """One site's view of and moves in the federation's state."""

    zk: KazooClient
    site: str
    org: str
    root: str = ROOT
    timeout_s: float = CALL_TIMEOUT_S
    _paths: dict[str, str] = field(init=False, repr=False)
    _queue_cache: dict[str, Request | None] = field(init=False, repr=False, default_factory=dict)
    _running_cache: dict[str, Running | None] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._paths = {
            k: f"{self.root}/{k}"
            for k in ("members", "queue", "claims", "running", "summaries", "sites", "published")
        }

    def _wait(self, async_result: Any) -> Any:
        return async_result.get(timeout=self.timeout_s)

    def path(self, kind: str, name: str = "") -> str:
        base = self._paths[kind]
        return f"{base}/{name}" if name else base

    def sync(self) -> None:
        """Bring this client's server up to the leader: a read after it sees every write
        committed before it. ZooKeeper orders reads per session only, and a session's server
        can be behind writes it did not hear back about (a lost answer) or another client's."""
        self._wait(self.zk.sync_async(self.root))

    def ensure(self) -> None:
        """The layout's top nodes (idempotent)."""
        for p in self._paths.values():
            self.zk.ensure_path(p)

    # -- membership ---------------------------------------------------------------------------

    def join(self, free_cores: float = 0.0) -> None:
        """Announce this site (ephemeral: it goes with this broker's session). A node left by
        this site's previous session is replaced; one held by another live session means two
        brokers claim one site: refused."""
        path = self.path("members", self.site)
        data = _dump({"site": self.site, "org": self.org, "free_cores": free_cores})
        try:
            self._wait(self.zk.create_async(path, data, ephemeral=True))
            return
        except NodeExistsError:
            pass
        _, stat = self._wait(self.zk.get_async(path))
        if stat.ephemeralOwner != self.zk.client_id[0]:
            raise FederationError(
                f"site {self.site!r} is already a member (another broker's session holds it)"
            ) from None

    def members(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name in self._wait(self.zk.get_children_async(self.path("members"))):
            try:
                data, _ = self._wait(self.zk.get_async(self.path("members", name)))
            except NoNodeError:
                continue
            out[name] = _load(data, f"member {name}")
        return out

    # -- the queue ----------------------------------------------------------------------------

    def publish(self, request: Request) -> str | None:
        """Put ``request`` in the global queue; its node's name, or None when this site's
        marker says it was published already (an earlier publish's answer was lost: see the
        module's notes). The marker stays until :meth:`published`."""
        if request.site != self.site:
            raise FederationError(f"site {self.site!r} cannot publish {request.site!r}'s request")
        for _ in range(2):
            tx = self.zk.transaction()
            tx.create(self._marker(request), b"")
            tx.create(self.path("queue", "req-"), _dump(asdict(request)), sequence=True)
            results = self._wait(tx.commit_async())
            if isinstance(results[0], NodeExistsError):
                return None
            if not isinstance(results[0], NoNodeError):
                break
            # the site's first publish: its markers' parent made once
            self._create_quietly(self.path("published", self.site), b"")
        if _failed(results):
            raise FederationError(f"publishing {request.id}: {results}")
        return str(results[1]).rsplit("/", 1)[1]

    def published(self, request: Request) -> None:
        """This site knows ``request``'s publish made: its marker is no longer needed."""
        self._delete_quietly(self._marker(request))

    def forget_published(self, keep: Collection[str] = ()) -> int:
        """Delete every marker of this site but those of the request ids ``keep`` (a broker
        starting: no publish of its is pending, but those of the requests an earlier process
        took from the inbox and never said were handed on, which it publishes again: their
        markers refuse a publish that was made); how many deleted."""
        base = self.path("published", self.site)
        try:
            names = self._wait(self.zk.get_children_async(base))
        except NoNodeError:
            return 0
        gone = [name for name in names if name not in keep]
        for name in gone:
            self._delete_quietly(f"{base}/{name}")
        return len(gone)

    def _marker(self, request: Request) -> str:
        return self.path("published", f"{self.site}/{request.id}")

    def queued(self, names: Iterable[str] | None = None) -> list[Queued]:
        """The requests waiting, oldest node first; a node that is not a request is skipped
        (it can stop no broker). ``names``: the queue's children as a watch last gave them
        (else they are listed). A queue node is never changed (a requeue makes a new one), so
        each is read once: only names not seen before are read, all at once."""
        if names is None:
            names = self._wait(self.zk.get_children_async(self.path("queue")))
        listed = sorted(names)
        cache = self._queue_cache
        new = [n for n in listed if n not in cache]
        for name, got in zip(new, self._get_many("queue", new), strict=True):
            try:
                cache[name] = None if got is None else read_request(got[0], f"queue/{name}")
            except FederationError:
                cache[name] = None
        for gone in set(cache) - set(listed):
            cache.pop(gone, None)  # another thread reading too may have dropped it
        return [Queued(n, r) for n in listed if (r := cache.get(n)) is not None]

    def _get_many(self, kind: str, names: Sequence[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """Each node's data and stat (None: gone), the reads sent together (pipelined, in
        slices), each bounded."""
        out: list[tuple[bytes, ZnodeStat] | None] = []
        for at in range(0, len(names), 1000):
            pending = [self.zk.get_async(self.path(kind, n)) for n in names[at : at + 1000]]
            for result in pending:
                try:
                    data, stat = self._wait(result)
                    out.append((data, stat))
                except NoNodeError:
                    out.append(None)
        return out

    def claim(self, name: str) -> Claim | None:
        """Claim queued request ``name``: None when another broker's claim came first. The
        claims are flat (``claims/<name>-c-<seq>``): a claim is one create and one listing,
        and no per-request node is left behind by a claim that came late."""
        created = self._wait(
            self.zk.create_async(
                self.path("claims", f"{name}-c-"),
                self.site.encode(),
                ephemeral=True,
                sequence=True,
            )
        )
        mine = str(created).rsplit("/", 1)[1]
        prefix = f"{name}-c-"
        claimants = sorted(
            c
            for c in self._wait(self.zk.get_children_async(self.path("claims")))
            if c.startswith(prefix)
        )
        if claimants and claimants[0] != mine:
            self._delete_quietly(str(created))
            return None
        return Claim(name, str(created))

    def release(self, claim: Claim) -> None:
        self._delete_quietly(claim.path)

    def withdraw_claims(self) -> int:
        """Delete every claim this session holds; how many. A broker holds a claim only while it
        takes one request, so one found outside that is left by a call whose answer never came
        (the create made, or the withdrawal or the consume not, when the connection dropped).
        Such a claim stands first for its request as long as the session lives, and every later
        claim, this broker's own included, withdraws before it: the request would wait for
        good."""
        session = self.zk.client_id
        if session is None:
            raise ConnectionLoss("no session")
        names = self._wait(self.zk.get_children_async(self.path("claims")))
        withdrawn = 0
        for name, got in zip(names, self._get_many("claims", names), strict=True):
            if got is not None and got[1].ephemeralOwner == session[0]:
                self._delete_quietly(self.path("claims", name))
                withdrawn += 1
        return withdrawn

    def consume(
        self, claim: Claim, now_s: float | None = None, request: Request | None = None
    ) -> Running | None:
        """Take the claimed request from the queue to run it here: exactly once (see the
        module's notes). ``request``: the queue node's request, when the caller read it
        already (a queue node never changes). None: the claim was lost (session expired) or
        the request is gone."""
        if request is None:
            try:
                data, _ = self._wait(self.zk.get_async(self.path("queue", claim.name)))
            except NoNodeError:
                self.release(claim)
                return None
            request = read_request(data, f"queue/{claim.name}")
        running = Running(request, self.site, time.time() if now_s is None else now_s, self.org)
        tx = self.zk.transaction()
        tx.check(claim.path, 0)
        tx.delete(self.path("queue", claim.name))
        tx.create(self.path("running", claim.name), _dump(asdict(running)))
        tx.delete(claim.path)
        results = self._wait(tx.commit_async())
        if _failed(results):
            self.release(claim)
            return None
        return running

    # -- running and done ---------------------------------------------------------------------

    def running(self) -> dict[str, tuple[Running, ZnodeStat]]:
        """Every running request with its node's stat (what a requeue is fenced by), read
        now."""
        names = self._wait(self.zk.get_children_async(self.path("running")))
        out = {}
        for name, got in zip(names, self._get_many("running", names), strict=True):
            if got is not None and (running := _running(got[0], name)) is not None:
                out[name] = (running, got[1])
        return out

    def running_one(self, name: str) -> tuple[Running, ZnodeStat] | None:
        (got,) = self._get_many("running", [name])
        if got is None or (running := _running(got[0], name)) is None:
            return None
        return running, got[1]

    def running_requests(self) -> list[Running]:
        """What runs now, for the standings: as :meth:`queued`, each node read once (a
        running node is never changed: a requeue or a completion deletes it)."""
        names = self._wait(self.zk.get_children_async(self.path("running")))
        cache = self._running_cache
        new = [n for n in names if n not in cache]
        for name, got in zip(new, self._get_many("running", new), strict=True):
            cache[name] = None if got is None else _running(got[0], name)
        for gone in set(cache) - set(names):
            cache.pop(gone, None)
        return [r for n in sorted(names) if (r := cache.get(n)) is not None]

    def complete(
        self,
        name: str,
        used_s: float,
        before: Callable[[Completion], None] | None = None,
    ) -> Completion | None:
        """Record that this site finished running request ``name`` after ``used_s`` seconds:
        its runner's organisation contributed ``cores × used_s`` and the request's used it
        (when they differ); the request completed, as this site's next completion. ``before``
        is called with the completion about to be made (the ledger files it first); it may be
        called again with the same number if the transaction is retried. None when it is no
        longer this site's to complete (requeued as a lost site's); retried on a concurrent
        summary update. A completion made whose answer was lost (the connection dropped after
        the transaction) is this site's last one: asked again, it is returned, not refused,
        and ``before`` is not called (the ledger's row is settled from the site's record).
        Raises :class:`Contended` when every try lost to other sites' writes.

        A try lost to another site's write reads again only after a sync: ZooKeeper serves a
        session's reads from its own server, which may not have applied the write that beat
        it yet (a follower starved on a busy machine can lag), and reading that
        server again would read the same stale version and lose again, every try."""
        path = self.path("running", name)
        for _ in range(COMPLETE_TRIES):
            try:
                data, stat = self._wait(self.zk.get_async(path))
            except NoNodeError:
                last = self.site_record().last
                return last if last is not None and last.name == name else None
            doc = _load(data, f"running/{name}")
            if doc.get("site") != self.site:
                return None
            request = Request(**doc["request"])
            amount = request.cores * max(used_s, 0.0) if request.org != self.org else 0.0
            record = self.site_record()
            completion = Completion(record.seq + 1, name, request, amount)
            if before is not None:
                before(completion)
            tx = self.zk.transaction()
            tx.check(path, stat.version)
            tx.delete(path)
            if amount > 0:
                self._add_to_summary(tx, self.org, contributed=amount)
                self._add_to_summary(tx, request.org, used=amount)
            self._write_site_record(tx, completion, record.version)
            if not _failed(self._wait(tx.commit_async())):
                return completion
            self.sync()
        raise Contended(
            f"completing {name}: other sites' writes won all {COMPLETE_TRIES} tries: later"
        )

    def site_record(self) -> SiteRecord:
        """This site's completion count and last completion, as ZooKeeper keeps them."""
        try:
            data, stat = self._wait(self.zk.get_async(self.path("sites", self.site)))
        except NoNodeError:
            return SiteRecord(0, None, None)
        doc = _load(data, f"sites/{self.site}")
        try:
            last = doc.get("last")
            completion = None
            if last is not None:
                completion = Completion(
                    int(last["seq"]),
                    str(last["name"]),
                    Request(**last["request"]),
                    float(last["core_seconds"]),
                )
            return SiteRecord(int(doc["seq"]), completion, stat.version)
        except (TypeError, KeyError, ValueError, AttributeError):
            raise FederationError(f"sites/{self.site}: not a site record") from None

    def _write_site_record(
        self, tx: Any, completion: Completion | None, version: int | None, seq: int | None = None
    ) -> None:
        doc = {
            "seq": completion.seq if completion is not None else seq,
            "last": None if completion is None else asdict(completion),
        }
        path = self.path("sites", self.site)
        if version is None:
            tx.create(path, _dump(doc))
        else:
            tx.set_data(path, _dump(doc), version=version)

    def reseed(
        self, seq: int, lent: dict[str, float], contributed: float, version: int | None = None
    ) -> bool:
        """Put back what this site's ledger says it counted, into a ZooKeeper that has no
        record of the site (its data was lost, or the federation was started anew), or whose
        record is behind the ledger's (``version``: the record's, as read; ZooKeeper lost some
        of its writes): the site's organisation contributed ``contributed`` core-seconds more,
        each organisation of ``lent`` used its figure more, and the site made ``seq``
        completions. One transaction that creates the site's record, or changes it at the
        version read, so that it is done once. False: the record exists, or changed (or a
        summary changed meanwhile: try again)."""
        tx = self.zk.transaction()
        self._write_site_record(tx, None, version, seq=seq)
        if contributed > 0:
            self._add_to_summary(tx, self.org, contributed=contributed)
        for org, amount in sorted(lent.items()):
            if amount > 0:
                self._add_to_summary(tx, org, used=amount)
        return not _failed(self._wait(tx.commit_async()))

    def _add_to_summary(
        self, tx: Any, org: str, contributed: float = 0.0, used: float = 0.0
    ) -> None:
        path = self.path("summaries", org)
        try:
            data, stat = self._wait(self.zk.get_async(path))
            old = self._summary(org, data)
        except NoNodeError:
            self._create_quietly(path, _dump(asdict(Summary(org))))
            data, stat = self._wait(self.zk.get_async(path))
            old = self._summary(org, data)
        new = old.plus(contributed, used)
        tx.set_data(path, _dump(asdict(new)), version=stat.version)

    def _summary(self, org: str, data: bytes) -> Summary:
        doc = _load(data, f"summaries/{org}")
        try:
            return Summary(org, float(doc["contributed"]), float(doc["used"]))
        except (TypeError, KeyError, ValueError):
            raise FederationError(f"summaries/{org}: not a summary") from None

    def summaries(self) -> dict[str, Summary]:
        out = {}
        for org in self._wait(self.zk.get_children_async(self.path("summaries"))):
            try:
                data, _ = self._wait(self.zk.get_async(self.path("summaries", org)))
                out[org] = self._summary(org, data)
            except (NoNodeError, FederationError):
                continue
        return out

    def standings(self) -> list[OrgStanding]:
        """Every organisation the federation knows now (by summary, member, or request), by
        priority, highest first."""
        summaries = self.summaries()
        members = self.members()
        site_org = {site: str(doc.get("org", "")) for site, doc in members.items()}
        queued = [q.request for q in self.queued()]
        running = self.running_requests()
        orgs = set(summaries) | set(site_org.values()) | {r.org for r in queued}
        orgs |= {r.request.org for r in running} | {r.org for r in running if r.org}
        orgs.discard("")
        pairs = [(r.request.org, r.org or site_org.get(r.site, "")) for r in running]
        rows = []
        for org in orgs:
            s = summaries.get(org, Summary(org))
            rows.append(
                OrgStanding(
                    org=org,
                    contributed=s.contributed,
                    used=s.used,
                    priority=s.priority,
                    queued=sum(1 for r in queued if r.org == org),
                    running=sum(1 for r in running if r.request.org == org),
                    lent=sum(1 for owner, runner in pairs if runner == org != owner),
                    borrowed=sum(1 for owner, runner in pairs if owner == org != runner),
                    sites=sum(1 for o in site_org.values() if o == org),
                )
            )
        return sorted(rows, key=lambda r: (-r.priority, r.org))

    # -- a site lost --------------------------------------------------------------------------

    def site_lost(self, site: str, now_s: float) -> tuple[list[Moved], list[Moved]]:
        """The paper's rule for a site that left: "jobs that were computed by the disconnected
        organization are treated as if they were just submitted" (its running foreign requests
        go back to the queue, as new nodes submitted at ``now_s``); "jobs submitted by the
        lost site are removed, apart from those which are already being executed" (its queued
        requests; and the records of its own requests it ran itself, which went with it).
        Each move is one transaction, so two brokers applying the rule at once move each
        request once; in node order, so that requests requeued together keep their order.
        Returns the (requeued, removed) requests."""
        requeued, removed = [], []
        for name, (running, stat) in sorted(self.running().items()):
            if running.site != site:
                continue
            if running.request.site != site:
                if self.requeue(name, running, stat, now_s):
                    requeued.append(Moved(name, running.request))
                continue
            # its own request it ran itself went with it: the record goes too
            tx = self.zk.transaction()
            tx.check(self.path("running", name), stat.version)
            tx.delete(self.path("running", name))
            if not _failed(self._wait(tx.commit_async())):
                removed.append(Moved(name, running.request))
        for queued in self.queued():
            if queued.request.site != site:
                continue
            try:
                self._wait(self.zk.delete_async(self.path("queue", queued.name)))
                removed.append(Moved(queued.name, queued.request))
            except NoNodeError:
                continue
        return requeued, removed

    def requeue(self, name: str, running: Running, stat: ZnodeStat, now_s: float) -> bool:
        """Put a running request back in the queue as if just submitted (a new node, submitted
        at ``now_s``), if its running node is still at the version read: one transaction, so
        that it moves once however many brokers try."""
        again = replace(running.request, submitted_s=now_s)
        tx = self.zk.transaction()
        tx.check(self.path("running", name), stat.version)
        tx.delete(self.path("running", name))
        tx.create(self.path("queue", "req-"), _dump(asdict(again)), sequence=True)
        return not _failed(self._wait(tx.commit_async()))

    # -- helpers ------------------------------------------------------------------------------

    def _delete_quietly(self, path: str) -> None:
        # gone already (a claim whose session ended, a request another site removed)
        with contextlib.suppress(NoNodeError):
            self._wait(self.zk.delete_async(path))

    def _create_quietly(self, path: str, data: bytes) -> None:
        with contextlib.suppress(NodeExistsError):
            self._wait(self.zk.create_async(path, data))


def ordered(queued: Iterable[Queued], priorities: dict[str, float]) -> list[Queued]:
    """The paper's choice order (:func:`gmd.fairness.federation.choice_order`)."""
    return choice_order(queued, priorities, lambda q: q.request, lambda q: q.name)
