"""Times as operators type them: ISO dates and times (UTC unless an offset is given), ``now``,
``now-7d``, ``now-12h``, ``now-30m``, or Unix seconds."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_RELATIVE = re.compile(r"^now(?:-(\d+(?:\.\d+)?)([smhdw]))?$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(text: str, now_s: float) -> float:
    """Unix seconds for ``text``; ValueError names what was not understood."""
    t = text.strip()
    m = _RELATIVE.match(t)
    if m:
        amount, unit = m.groups()
        return now_s - (float(amount) * _UNIT_S[unit] if amount else 0.0)
    if re.fullmatch(r"\d+(\.\d+)?", t) and len(t) >= 9:
        return float(t)
    try:
        moment = datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: give an ISO date (2026-11-01 or 2026-11-01T12:00),"
            " now, now-7d / now-12h / now-30m, or Unix seconds"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
