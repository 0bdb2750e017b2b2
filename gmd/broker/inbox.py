"""The broker's inbox: local submits as files, one JSON request each.

``gmd-broker submit`` writes ``<inbox>/<id>.json`` (to a temporary name first, then renamed, so
that the broker never reads half a file); the running broker takes each file in name order
and submits it. A file that is not a request of this site is moved to ``<inbox>/rejected/``
with a log line saying why: it stops nothing.

**A taken request stays on disk until it is handed on.** :func:`take` moves its file to
``<inbox>/taken/``, and the broker deletes it there (:func:`handed`) only once the request is
in ZooKeeper's queue, or its publish marker says it was put there, or it runs here. Before
(issue 44), the file was deleted when read: a request the broker held in memory, because
ZooKeeper could not be reached, was lost when the broker was killed, though its submit had
said yes. A broker that starts submits the requests an earlier process left there
(:func:`held`) before any new one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from gmd.broker.coordination import FederationError, Request

LOG = logging.getLogger(__name__)
MAX_BYTES = 64 * 1024
TAKEN = "taken"
"""the subdirectory of the requests the broker took and has not handed on yet"""


def write(inbox: Path, request: Request) -> Path:
    """Leave ``request`` in ``inbox`` for the broker; the file written."""
    inbox.mkdir(parents=True, exist_ok=True)
    final = inbox / f"{request.id}.json"
    if final.exists() or (inbox / TAKEN / final.name).exists():
        raise FederationError(f"{final}: request {request.id!r} is already waiting")
    temporary = inbox / f".{request.id}.json.tmp"
    temporary.write_text(json.dumps(request.__dict__))
    os.replace(temporary, final)
    return final


def take(inbox: Path, site: str, org: str) -> list[Request]:
    """The requests waiting in ``inbox``, each file moved to ``taken/`` once read (the broker
    calls :func:`handed` once it has handed the request on)."""
    if not inbox.is_dir():
        return []
    taken = inbox / TAKEN
    out = []
    for path in sorted(inbox.glob("*.json")):
        request = _accepted(inbox, path, site, org)
        if request is None:
            continue
        taken.mkdir(exist_ok=True)
        os.replace(path, taken / path.name)
        out.append(request)
    return out


def held(inbox: Path, site: str, org: str) -> list[Request]:
    """The requests an earlier broker process took from ``inbox`` and never handed on (it was
    killed, or stopped with them unpublished), in name order; their files stay until
    :func:`handed`."""
    taken = inbox / TAKEN
    if not taken.is_dir():
        return []
    return [
        request
        for path in sorted(taken.glob("*.json"))
        if (request := _accepted(inbox, path, site, org)) is not None
    ]


def handed(inbox: Path, request_id: str) -> None:
    """The broker handed ``request_id`` on (published it, or started it here): its file goes."""
    (inbox / TAKEN / f"{request_id}.json").unlink(missing_ok=True)


def _accepted(inbox: Path, path: Path, site: str, org: str) -> Request | None:
    """``path``'s request; None, the file moved to ``rejected/``, when it is not one of this
    site's."""
    try:
        return _read(path, site, org)
    except FederationError as exc:
        rejected = inbox / "rejected"
        rejected.mkdir(exist_ok=True)
        os.replace(path, rejected / path.name)
        LOG.warning("%s: rejected: %s", path, exc)
        return None


def _read(path: Path, site: str, org: str) -> Request:
    try:
        raw = path.read_bytes()[: MAX_BYTES + 1]
        doc = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except (OSError, ValueError) as exc:
        raise FederationError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise FederationError("not a JSON object")
    doc.setdefault("site", site)
    doc.setdefault("org", org)
    doc.setdefault("submitted_s", time.time())
    try:
        request = Request(**doc)
    except TypeError as exc:
        raise FederationError(str(exc)) from None
    if request.site != site:
        raise FederationError(f"a request of site {request.site!r}, not this one ({site!r})")
    return request
