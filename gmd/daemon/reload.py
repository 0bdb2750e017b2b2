"""What a SIGHUP changes in a running daemon: the settings that can change live do, the others
keep their running value until a restart, and the log names each.

Live: the hosts and their tokens and owners, the organizations, the enforcement policy (mode,
thresholds, caps, weights; not its quota job's cloud and timing), the plausibility bounds and
the hosts' bounds (``[daemon.limits]``: their counts start afresh), the accounting settings
that apply to the intervals accounted from now on (gamma, endowment, utility, half-life,
weights), and the what-if's budget. Everything else (the database, the address, TLS, the
interval's length, the read API's authentication, Placement, retention's and the jobs'
timing, …) is read once at start: changed in the file, it is named in the log and keeps its
running value.

The file is checked whole before anything changes: a file the daemon would refuse at start
changes nothing, and the log says why.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gmd.daemon.config import Config, parse

LIVE = (
    "hosts",
    "organizations",
    "enforcement",
    "daemon.limits",
    "daemon.plausibility_margin",
    "daemon.max_host_cores",
    "daemon.max_host_memory_bytes",
    "daemon.max_host_disk_bytes_per_s",
    "daemon.max_host_network_bytes_per_s",
    "accounting.gamma",
    "accounting.endowment",
    "accounting.consumer",
    "accounting.utility",
    "accounting.half_life_s",
    "accounting.weights",
    "read_api.whatif_max_s",
    "read_api.whatif_max_intervals",
)
"""The settings a SIGHUP changes (a table's name stands for every key in it)."""

NOT_LIVE = ("enforcement.quota",)
"""Within a live table, what still takes a restart (the quota job's cloud and timing)."""


def live(key: str) -> bool:
    """Whether the dotted ``key`` can change while the daemon runs."""

    def within(prefix: str) -> bool:
        return key == prefix or key.startswith(prefix + ".")

    return any(within(p) for p in LIVE) and not any(within(p) for p in NOT_LIVE)


@dataclass(frozen=True)
class Reload:
    """A reload's outcome: the configuration now in force, the keys that changed live, and
    those that changed in the file but keep their running value."""

    config: Config
    applied: tuple[str, ...]
    kept: tuple[str, ...]


def _flat(document: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in document.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flat(value, path + ".")
        else:
            yield path, value


def plan(running: Config, document: dict[str, Any], source: str) -> Reload:
    """The configuration a reload to ``document`` puts in force: its live settings, the
    running ones elsewhere. Raises :class:`~gmd.common.config.ConfigError` when the result
    (or the file) is not a configuration the daemon would start with."""
    parse(document, source, running.path)  # the file as it is: refused as a start would
    old, new = dict(_flat(running.document)), dict(_flat(document))
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    applied = tuple(k for k in changed if live(k))
    kept = tuple(k for k in changed if not live(k))
    merged = copy.deepcopy(document)
    for key in kept:
        *tables, name = key.split(".")
        table = merged
        for part in tables:
            table = table.setdefault(part, {})
        if key in old:
            table[name] = copy.deepcopy(old[key])
        else:
            table.pop(name, None)
    return Reload(parse(merged, source, running.path), applied, kept)
