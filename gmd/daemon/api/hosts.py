"""``/v1/hosts``: every compute host and the knobs its agent can set, for operators (the read
API's ``gmd-admin hosts``). A member reads none of it: where the cloud's hosts are, and what
they can do, is the operators' (Nova hides hosts from members too)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gmd.daemon.api.deps import ServicesDep
from gmd.daemon.api.errors import Refused
from gmd.daemon.api.read import ReaderDep
from gmd.daemon.reports.host_knobs import hosts
from gmd.wire import Problem

router = APIRouter(prefix="/v1", tags=["read"], responses={404: {"model": Problem}})


@router.get("/hosts", summary="Every host and the knobs it can set (gmd-admin hosts)")
def get_hosts(who: ReaderDep, services: ServicesDep) -> dict[str, Any]:
    """Per host: its owner, last batch, enforcement backend, cgroup layout, disks' schedulers,
    and per knob whether its agent can set it ("yes", "no" with why, "?" when it said
    nothing), with the whole of what it said under ``capabilities``. Operators only."""
    _operators_only(who)
    with services.engine.connect() as conn:
        return {"hosts": hosts(conn)}


@router.get("/hosts/{host}", summary="One host and the knobs it can set")
def get_host(host: str, who: ReaderDep, services: ServicesDep) -> dict[str, Any]:
    """One host of ``/v1/hosts``; 404 when neither the ledger nor its agent knows it."""
    _operators_only(who)
    with services.engine.connect() as conn:
        rows = hosts(conn, host)
    if not rows:
        raise Refused(404, f"no host {host!r}: no batch from it, and it said nothing of its knobs")
    return rows[0]


def _operators_only(who: Any) -> None:
    if not who.everyone:
        raise Refused(403, f"{who.name} may not read the hosts: they are the operators'")
