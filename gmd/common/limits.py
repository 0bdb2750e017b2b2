"""The process's own limits, raised where a service needs more than a login shell gives.

A daemon keeps a connection open per agent (thousands on a large cloud) and a file per
database connection; the soft limit of open files a shell hands it is often 1024, which such
a daemon meets under load as "Too many open files". systemd's unit sets ``LimitNOFILE``; a
daemon started any other way (a terminal, runit, a container) raises its own soft limit up to
the hard one, as Go's runtime and nginx do, and says when even that is low.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

WANTED_OPEN_FILES = 65536
"""What the systemd units set (``LimitNOFILE``), and what the daemon raises itself to."""
LOW_OPEN_FILES = 4096
"""Below this the daemon says so at start: a few thousand agents would not fit."""


def raise_open_files(wanted: int = WANTED_OPEN_FILES) -> int:
    """Raise the soft limit of open files to ``wanted``, or to the hard limit if lower; the
    limit now in force. A warning when it stays under :data:`LOW_OPEN_FILES`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the limit of open files from %d to %d: %s", soft, target, exc)
    if soft != resource.RLIM_INFINITY and soft < LOW_OPEN_FILES:
        log.warning(
            "at most %d open files (the hard limit): a cloud of more agents than that fails with"
            " 'Too many open files'; raise it (ulimit -Hn, or LimitNOFILE= as the unit does)",
            soft,
        )
    return soft
