"""The read API: standings, a customer's report, its explanation and its balance plot, over
HTTP for operators and customers (``[read_api]``; off unless configured).

Each answer is the document ``gmd-admin … --format json`` prints, from the same query
(:mod:`gmd.daemon.reports`). Who may read what is :mod:`gmd.daemon.api.access`'s: an
operator reads every customer; a project member reads only its own project, and gets 403 for
any other, whether the ledger knows it or not (so a member cannot probe which projects exist).
An explanation read by a member names no other project and none of its VMs: the hosts'
figures are aggregates of every consumer on them. What a member reads of an answer is
:func:`~gmd.daemon.api.members.for_member`'s: its hosts as Nova's hostId, no host's owner, no
host's own words (:func:`_seen_by`, on every answer of a customer's figures).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from gmd import OptionError
from gmd.common.timespec import NotATime, parse_time
from gmd.daemon.api.access import ReadCaller, Unauthenticated
from gmd.daemon.api.deps import ServicesDep
from gmd.daemon.api.errors import Refused
from gmd.daemon.api.members import for_member
from gmd.daemon.api.services import Services
from gmd.daemon.ledger.lookup import UnknownCustomer, customer_uuid
from gmd.daemon.reports.standings import standings
from gmd.daemon.reports.standings_columns import SortKey
from gmd.wire import PlanMode, Problem, canonical_customer

log = logging.getLogger(__name__)

# 404: an operator asked for a customer the ledger has never seen, or a range with nothing in it.
# A customer's name may hold any visible character, "/" too: its routes take the rest of the
# path up to their last segment ({customer:path}), so "team/a" is /v1/customers/team/a/explain
# (or team%2Fa: the server decodes the path before routing). Links quote it whole (segment).
router = APIRouter(prefix="/v1", tags=["read"], responses={404: {"model": Problem}})


class CustomerGrouping(StrEnum):
    """How a customer's report is grouped (gmd-admin report --customer's groupings)."""

    day = "day"
    week = "week"
    host = "host"
    resource = "resource"


TIME_HELP = "ISO 8601 (UTC unless an offset is given), now, now-3d / now-12h, or Unix seconds"


def segment(name: str) -> str:
    """``name`` as one segment of a link's path: every character but letters, digits and
    ``_.-~`` percent-encoded ("/" and "%" too), so that any customer name opens its page."""
    return quote(name, safe="")


def reader(
    services: ServicesDep, x_auth_token: Annotated[str | None, Header()] = None
) -> ReadCaller:
    """The caller, before anything is read (a plain function: it may ask Keystone, so
    FastAPI runs it on a worker thread)."""
    access = services.read_access
    if access is None:  # the router is only mounted with an access; kept for type checkers
        raise Refused(404, "the read API is off ([read_api] auth)")
    try:
        return access.reader(x_auth_token)
    except Unauthenticated as exc:
        raise Refused(401, str(exc), challenge=exc.challenge) from None


ReaderDep = Annotated[ReadCaller, Depends(reader)]


def _customer(services: ServicesDep, who: ReadCaller, customer: str) -> str:
    """The project uuid of ``customer`` (a uuid or a project name) that ``who`` may read."""
    with services.engine.connect() as conn:
        try:
            uuid = customer_uuid(conn, customer)
        except UnknownCustomer as exc:
            if not who.everyone:
                uuid = canonical_customer(customer)  # no hint whether other projects exist
            else:
                raise Refused(404, str(exc)) from None
    if not who.may_read(uuid):
        raise Refused(403, f"{who.name} may read only its own project's figures, not {customer!r}")
    return uuid


def _seen_by(who: ReadCaller, services: ServicesDep, project: str, document: Any) -> Any:
    """``document`` as ``who`` may see it: as it is for an operator, a member's view
    (:func:`~gmd.daemon.api.members.for_member`: no host's name, owner or words) of ``project``
    for a member."""
    if who.everyone:
        return document
    with services.engine.connect() as conn:
        return for_member(conn, project, document)


def _times(services: ServicesDep, *given: tuple[str, str | None]) -> list[float | None]:
    """Each ``(name, value)``'s time in seconds, all against one "now" (None stays None); a
    400 naming the first that is not a time."""
    now = services.clock()
    out: list[float | None] = []
    for name, value in given:
        try:
            out.append(None if value is None else parse_time(value, now))
        except NotATime as exc:
            raise Refused(400, f"{name}: {exc}") from None
    return out


@router.get("/standings", summary="Where every customer stands (gmd-admin standings)")
def get_standings(
    who: ReaderDep,
    services: ServicesDep,
    sort: SortKey = SortKey.balance,
    reverse: bool = False,
    everyone: Annotated[bool, Query(alias="all")] = False,
) -> dict[str, Any]:
    """The standings after the latest accounted interval: the whole cloud for an operator,
    the caller's own project for a member."""
    with services.engine.connect() as conn:
        result = standings(
            conn,
            sort=sort.value,
            reverse=reverse,
            everyone=everyone,
            enforcement=services.config.enforcement,
        )
    document = result.document()
    if not who.everyone:
        rows = [r for r in result.rows if who.may_read(str(r["customer"]))]
        document["customers"] = rows
        document["reset_since"] = [c for c in result.reset if who.may_read(c)]
    return dict(_seen_by(who, services, who.project_id or "", document))


@router.get("/customers/{customer:path}/explain", summary="Why a customer stands where it stands")
def get_explanation(
    customer: str,
    who: ReaderDep,
    services: ServicesDep,
    at: Annotated[
        str | None, Query(description=f"an interval holding this time; {TIME_HELP}")
    ] = None,
    from_: Annotated[str | None, Query(alias="from", description=TIME_HELP)] = None,
    to: Annotated[str | None, Query(description=TIME_HELP)] = None,
) -> dict[str, Any]:
    """gmd-admin explain's document for the latest accounted interval (or the one holding
    ``at``, or the range ``from``–``to``), with its summary in plain words."""
    from gmd.daemon.reports.explain import NothingToExplain, explain

    uuid = _customer(services, who, customer)
    at_s, from_s, to_s = _times(services, ("at", at), ("from", from_), ("to", to))
    try:
        with services.engine.connect() as conn:
            result = explain(conn, services.config, uuid, at_s=at_s, from_s=from_s, to_s=to_s)
    except NothingToExplain as exc:
        raise Refused(404, str(exc)) from None
    if who.everyone:
        return result.document()
    # a member's summary is written from what a member may read: the explanation, not its
    # document, is made a member's
    return dict(_seen_by(who, services, uuid, result))


@router.get(
    "/customers/{customer:path}/report", summary="A customer's use and standing over a range"
)
def get_report(
    customer: str,
    who: ReaderDep,
    services: ServicesDep,
    from_: Annotated[str, Query(alias="from", description=TIME_HELP)] = "now-7d",
    to: Annotated[str, Query(description=TIME_HELP)] = "now",
    group_by: CustomerGrouping = CustomerGrouping.day,
) -> dict[str, Any]:
    """gmd-admin report --customer's document: the customer's intervals, GM, balance and
    throttled time per day (or week, host, resource) over ``from``–``to``."""
    from gmd.daemon.reports.usage import report

    uuid = _customer(services, who, customer)
    from_s, to_s = _times(services, ("from", from_), ("to", to))
    assert from_s is not None and to_s is not None  # both have a default
    try:
        with services.engine.connect() as conn:
            result = report(conn, group_by.value, from_s, to_s, customer=uuid)
    except OptionError as exc:
        raise Refused(400, str(exc)) from None
    return dict(_seen_by(who, services, uuid, result.document()))


@router.get("/enforcement", summary="The enforcement log (gmd-admin actions)")
def get_enforcement(
    who: ReaderDep,
    services: ServicesDep,
    customer: Annotated[
        str | None, Query(description="a project uuid or name (a member: its own, the default)")
    ] = None,
    from_: Annotated[str | None, Query(alias="from", description=TIME_HELP)] = None,
    to: Annotated[str | None, Query(description=TIME_HELP)] = None,
    limit: Annotated[int | None, Query(ge=1, le=100_000, description="the newest N")] = None,
) -> dict[str, Any]:
    """Every level change, plan, host report and quota change gmd made (or, in dry-run,
    would have made), oldest first: an operator's whole log, a member's own project's."""
    from gmd.daemon.reports.actions import actions

    uuid: str | None = None
    if customer is not None:
        uuid = _customer(services, who, customer)
    elif not who.everyone:
        if who.project_id is None:
            raise Refused(403, f"{who.name}: a project-scoped token is needed to read its log")
        uuid = _customer(services, who, who.project_id)
    from_s, to_s = _times(services, ("from", from_), ("to", to))
    with services.engine.connect() as conn:
        rows = actions(conn, from_s=from_s, to_s=to_s, customer=uuid, limit=limit)
    return {"actions": _seen_by(who, services, uuid or "", rows)}


@router.get("/federation", summary="The federation's standings (gmd-admin federation)")
def get_federation(who: ReaderDep, services: ServicesDep) -> dict[str, Any]:
    """Every organisation of the federation this cloud's gmd-broker belongs to, by priority:
    what its sites lent and its requests borrowed (core-seconds), and its requests queued,
    running, lent and borrowed now, as the broker last read them (``as_of``). Operators'."""
    from gmd.daemon.reports.federation import standings as federation_standings

    _operator(who, "the federation's standings")
    with services.engine.connect() as conn:
        return federation_standings(conn)


@router.get("/federation/events", summary="The broker's decisions (gmd-admin federation log)")
def get_federation_events(
    who: ReaderDep,
    services: ServicesDep,
    org: Annotated[str | None, Query(description="only this organisation's requests")] = None,
    from_: Annotated[str | None, Query(alias="from", description=TIME_HELP)] = None,
    to: Annotated[str | None, Query(description=TIME_HELP)] = None,
    limit: Annotated[int | None, Query(ge=1, le=100_000, description="the newest N")] = None,
) -> dict[str, Any]:
    """This cloud's broker's decisions, oldest first: what it published, took, completed
    (and whether ZooKeeper counted it), requeued and removed. Operators'."""
    from gmd.daemon.reports.federation import events as federation_events

    _operator(who, "the federation's history")
    from_s, to_s = _times(services, ("from", from_), ("to", to))
    with services.engine.connect() as conn:
        rows = federation_events(conn, from_s=from_s, to_s=to_s, org=org, limit=limit)
    return {"events": rows}


def _operator(who: ReadCaller, what: str) -> None:
    if not who.everyone:
        raise Refused(403, f"{who.name} may not read {what}: it is the operators'")


@router.get("/whatif", summary="The record replayed under other settings (gmd-admin whatif)")
async def get_whatif(
    request: Request,
    who: ReaderDep,
    services: ServicesDep,
    from_: Annotated[str, Query(alias="from", description=TIME_HELP)],
    to: Annotated[str, Query(description=TIME_HELP)] = "now",
    changes: Annotated[
        list[str] | None,
        Query(
            alias="set",
            description="KEY=VALUE, as gmd-admin whatif --set (accounting.gamma=0.3,"
            " enforcement.enter=[1, 3, 6]); repeat for several",
        ),
    ] = None,
) -> dict[str, Any]:
    """The accounted intervals in [from, to) replayed from their raw samples under the
    daemon's configuration with ``set``'s changes, beside what was recorded. It replays every
    customer's record, so only an operator may ask; it is bounded (the intervals within raw
    retention, at most ``[read_api] whatif_max_intervals``, at most 20 changes, each value at
    most 1,000 characters, ``[read_api] whatif_max_s`` of replay: 503 past it) and writes
    nothing. It stops when its client goes."""
    return await whatif_document(request, who, services, from_, to, changes or [])


async def whatif_document(
    request: Request,
    who: ReadCaller,
    services: Services,
    from_: str,
    to: str,
    sets: list[str],
) -> dict[str, Any]:
    """The what-if's document (``GET /v1/whatif``, and the web page's), replayed on a worker
    thread within its budget, stopped at the next interval once its client has gone."""
    from gmd.daemon.reports.whatif import (
        WhatIfRefused,
        WhatIfStopped,
        document,
        replay,
        with_overrides,
    )

    if not who.everyone:
        raise Refused(403, f"{who.name}: a what-if replays every customer's record: operators only")
    from_s, to_s = _times(services, ("from", from_), ("to", to))
    assert from_s is not None and to_s is not None  # both are given
    budget = services.config.read_api
    gone = threading.Event()
    deadline = time.monotonic() + budget.whatif_max_s

    def stop() -> str | None:
        if gone.is_set():
            return "its client has gone"
        if time.monotonic() > deadline:
            return f"it ran for [read_api] whatif_max_s = {budget.whatif_max_s:g} s"
        return None

    def run() -> dict[str, Any]:
        config = with_overrides(services.config, sets)
        with services.engine.connect() as conn:
            result = replay(
                conn,
                config,
                from_s,
                to_s,
                sets,
                max_intervals=budget.whatif_max_intervals,
                stop=stop,
            )
        return document(result)

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(WATCH_S)
        gone.set()

    watcher = asyncio.create_task(watch())
    try:
        return await run_in_threadpool(run)
    except WhatIfRefused as exc:
        raise Refused(400, str(exc)) from None
    except WhatIfStopped as exc:
        if gone.is_set():
            log.info("what-if of [%s, %s) %s", from_, to, exc)
        raise Refused(503, f"{exc}: give a shorter range") from None
    finally:
        watcher.cancel()


WATCH_S = 0.5
"""How often a what-if looks whether its client is still there."""


@router.get(
    "/hosts/utilization",
    summary="Each host's measured utilisation and a project's level (for placement)",
)
def get_host_utilization(
    who: ReaderDep,
    services: ServicesDep,
    intervals: Annotated[
        int, Query(ge=1, le=60, description="how many of the latest accounted intervals to sum")
    ] = 3,
    project: Annotated[
        str | None,
        Query(max_length=255, description="a project uuid: its throttle level is given too"),
    ] = None,
    hosts: Annotated[
        bool,
        Query(
            description="false: no host listed, only the project's level (a scheduler that"
            " holds the hosts already)"
        ),
    ] = True,
) -> dict[str, Any]:
    """Per host, what its VMs used of each resource over the latest accounted intervals,
    over what it offered (:mod:`gmd.daemon.reports.host_utilization`); with ``project``, that
    project's level now (0 when unknown). Every host's figures: operators only (the Nova
    scheduler's service account)."""
    from gmd.daemon.reports.host_utilization import host_utilization

    if not who.everyone:
        raise Refused(403, f"{who.name}: every host's utilisation is for operators only")
    enforcement = services.config.enforcement
    policy = enforcement.policy if enforcement.mode == PlanMode.on else None
    with services.engine.connect() as conn:
        return host_utilization(
            conn, intervals=intervals, project=project, policy=policy, with_hosts=hosts
        ).document()


@router.get(
    "/customers/{customer:path}/plot.svg",
    summary="A customer's balance, level and use over time, as SVG",
    response_class=Response,
    responses={200: {"content": {"image/svg+xml": {}}}},
)
def get_plot(
    customer: str,
    who: ReaderDep,
    services: ServicesDep,
    from_: Annotated[str, Query(alias="from", description=TIME_HELP)] = "now-7d",
    to: Annotated[str, Query(description=TIME_HELP)] = "now",
) -> Response:
    """The three panels of gmd-admin plot for this one customer."""
    from gmd.daemon.reports import plot
    from gmd.daemon.reports.series import EmptyRange, collect

    uuid = _customer(services, who, customer)
    from_s, to_s = _times(services, ("from", from_), ("to", to))
    try:
        with services.engine.connect() as conn:
            data = collect(conn, customers=[uuid], from_s=from_s, to_s=to_s)
    except EmptyRange as exc:
        raise Refused(404, str(exc)) from None
    figure = plot.draw(data, services.config.enforcement.policy, services.config.enforcement.mode)
    return Response(plot.svg(figure), media_type="image/svg+xml")
