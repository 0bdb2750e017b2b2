"""What a SIGHUP changes in a running gmd-agent: where and how it posts, how often it asks for
its plan, and the bandwidths it reports; the rest (its host's name, the interval and tick,
the spool, libvirt, the enforcement backend and state, the metrics port, which domains it
measures, a replay) keeps its running value until a restart, and the log names each. A file
it would refuse at start changes nothing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gmd.agent.config import AgentConfig

LIVE = (
    "daemon_url",
    "token",
    "timeout_s",
    "post_jitter_s",
    "plan_every_s",
    "disk_bytes_per_s",
    "network_bytes_per_s",
)
"""The ``[agent]`` keys a SIGHUP changes."""

CLIENT = frozenset({"daemon_url", "token", "timeout_s"})
"""Those that need a new connection to the daemon."""


@dataclass(frozen=True)
class AgentReload:
    """The configuration now in force, the keys changed live, those that take a restart."""

    config: AgentConfig
    applied: tuple[str, ...]
    kept: tuple[str, ...]


def plan(running: AgentConfig, new: AgentConfig) -> AgentReload:
    """``running`` with ``new``'s live settings."""
    changed = [
        f.name
        for f in dataclasses.fields(AgentConfig)
        if getattr(running, f.name) != getattr(new, f.name) and f.name != "path"
    ]
    applied = tuple(k for k in changed if k in LIVE)
    kept = tuple(k for k in changed if k not in LIVE)
    config = dataclasses.replace(running, **{k: getattr(new, k) for k in applied})
    return AgentReload(config, applied, kept)
