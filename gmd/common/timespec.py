"""Times as operators type them: ISO dates and times (UTC unless an offset is given), ``now``,
``now-7d``, ``now-12h``, ``now-30m``, or Unix seconds (``1764547200``, ``@0``).

Eight digits are an ISO date (``20261101``), as ``datetime.fromisoformat`` reads them; Unix
seconds of that length (1970-04 to 1973-03) are written with ``@``. Every time is between the
epoch and the end of year 9999, the range every format gmd prints a time in can show.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from gmd import OptionError
from gmd.common.units import DAY_S, HOUR_S, MINUTE_S, WEEK_S

_RELATIVE = re.compile(r"^now(?:-(\d+(?:\.\d+)?)([smhdw]))?$")
_UNIT_S = {"s": 1, "m": MINUTE_S, "h": HOUR_S, "d": DAY_S, "w": WEEK_S}


class NotATime(OptionError):
    """A time as typed is not one gmd can read or show; the message quotes it and says what
    is accepted."""


LAST_S = 253_402_300_799
"""9999-12-31T23:59:59Z: the last second an ISO date can name."""


def parse_time(text: str, now_s: float) -> float:
    """Unix seconds for ``text``; :class:`NotATime` names what was not understood, or a time
    before 1970 or after year 9999."""
    t = text.strip()
    m = _RELATIVE.match(t)
    if m:
        amount, unit = m.groups()
        return _bounded(text, now_s - (float(amount) * _UNIT_S[unit] if amount else 0.0))
    digits = re.fullmatch(r"@?(\d+(\.\d+)?)", t)
    if digits and (t.startswith("@") or len(t) != 8):
        return _bounded(text, float(digits.group(1)))
    try:
        moment = datetime.fromisoformat(t)
    except ValueError:
        raise NotATime(
            f"{text!r} is not a time: give an ISO date (2026-11-01 or 2026-11-01T12:00),"
            " now, now-7d / now-12h / now-30m, or Unix seconds (1764547200, @0)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return _bounded(text, moment.timestamp())


def _bounded(text: str, t: float) -> float:
    if t < 0:
        raise NotATime(f"{text!r} is before 1970-01-01T00:00:00Z, where the ledger begins")
    if t > LAST_S:
        raise NotATime(f"{text!r} is after 9999-12-31T23:59:59Z, the last time gmd can show")
    return t


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_as_sent(t: float) -> str:
    """:func:`iso` of a time someone else sent, or the number as sent where no calendar date
    has it (a host may post any Unix time the wire takes, up to 2**53 - 1): text written from
    it must never fail on what it quotes."""
    try:
        return iso(t)
    except (ValueError, OverflowError, OSError):
        return str(t)
