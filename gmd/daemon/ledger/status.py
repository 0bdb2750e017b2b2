"""What the daemon's gauges start from, read from the ledger: a daemon restarted knows no
more than the ledger does, and a gauge that began empty would hide a host gone silent before
the restart, or customers throttled since long ago."""

from __future__ import annotations

from sqlalchemy import Connection, func, select

from gmd.ledger_schema.tables import hosts as _hosts, levels as _levels


def hosts_last_seen(conn: Connection) -> dict[str, int]:
    """Host → when (Unix time) its latest batch was stored, for hosts that ever sent one."""
    rows = conn.execute(
        select(_hosts.c.name, _hosts.c.last_seen_s).where(_hosts.c.last_seen_s.is_not(None))
    )
    return {str(name): int(seen) for name, seen in rows}


def level_counts(conn: Connection) -> dict[int, int]:
    """Throttle level above 0 → how many customers are at it now."""
    rows = conn.execute(
        select(_levels.c.level, func.count()).where(_levels.c.level > 0).group_by(_levels.c.level)
    )
    return {int(level): int(n) for level, n in rows}
