"""The broker's inbox: local submits as files, one JSON request each.

``gmd-broker submit`` writes ``<inbox>/<id>.json`` (to a temporary name first, then renamed, so
that the broker never reads half a file); the running broker takes each file in name order,
submits it and deletes it. A file that is not a request of this site is moved to
``<inbox>/rejected/`` with a log line saying why: it stops nothing.
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


def write(inbox: Path, request: Request) -> Path:
    """Leave ``request`` in ``inbox`` for the broker; the file written."""
    inbox.mkdir(parents=True, exist_ok=True)
    final = inbox / f"{request.id}.json"
    if final.exists():
        raise FederationError(f"{final}: request {request.id!r} is already waiting")
    temporary = inbox / f".{request.id}.json.tmp"
    temporary.write_text(json.dumps(request.__dict__))
    os.replace(temporary, final)
    return final


def take(inbox: Path, site: str, org: str) -> list[Request]:
    """The requests waiting in ``inbox`` (each file removed once read)."""
    if not inbox.is_dir():
        return []
    out = []
    for path in sorted(inbox.glob("*.json")):
        try:
            request = _read(path, site, org)
        except FederationError as exc:
            rejected = inbox / "rejected"
            rejected.mkdir(exist_ok=True)
            os.replace(path, rejected / path.name)
            LOG.warning("%s: rejected: %s", path, exc)
            continue
        path.unlink(missing_ok=True)
        out.append(request)
    return out


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
