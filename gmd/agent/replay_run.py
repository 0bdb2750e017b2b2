"""Running a replay: the collector and clock an agent's configuration describes, the plan kept
beside the spool so that a killed replay resumes, and the runner that ticks the agent through
simulated time (:mod:`gmd.agent.collect.replay` holds the collector and the clocks; see its
notes on the three clocks and on resuming).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gmd.agent.collect.aggregate import AgentState, advance, batch_document
from gmd.agent.collect.capacity import Bandwidth
from gmd.agent.collect.replay import (
    DEFAULT_HISTORY_S,
    ReplayClock,
    ReplayCollector,
    ReplayError,
    plan_clock,
    replay_vms,
)
from gmd.agent.config import AgentConfig
from gmd.common.timespec import iso
from gmd.common.units import DAY_S
from gmd.traces import TraceError, read_trace, trace_names, trace_paths, traces_digest

if TYPE_CHECKING:
    from gmd.agent.loop import AgentLoop

log = logging.getLogger(__name__)

REPLAY_FAILURES: tuple[type[Exception], ...] = (ReplayError, TraceError)
"""What stops a replay, each with a message that says why and where: its plan or its
traces. gmd-agent turns them into its one-line error."""


# -- from the configuration -------------------------------------------------------------------


def replay_from_config(
    config: AgentConfig, now_s: float | None = None
) -> tuple[ReplayCollector, ReplayClock]:
    """The collector and clock ``[agent] collector = "replay"`` describes (what gmd-agent
    runs). :class:`ReplayError` when the traces cannot be used."""
    if config.replay_dir is None:
        raise ReplayError("agent.replay_dir is not set: which traces should be replayed?")
    now = time.time() if now_s is None else now_s
    names = list(config.replay_vms) or trace_names(config.replay_dir)
    traces = [read_trace(p) for p in trace_paths(config.replay_dir, names)]
    customers = config.replay_customers or None
    vms = replay_vms(traces, config.host, customers, config.default_customer)
    clock = load_plan(config)
    if clock is None:
        start = now - DEFAULT_HISTORY_S if config.replay_start_s is None else config.replay_start_s
        clock = plan_clock(
            traces,
            start_s=start,
            interval_s=config.interval_s,
            end_s=config.replay_end_s,
            speed=config.replay_speed,
            offset_s=config.replay_offset_s,
            now_s=now,
        )
    collector = ReplayCollector(
        vms, clock, cores=config.replay_host_cores, memory_bytes=config.replay_host_memory_bytes
    )
    log.info(
        "%s %d VMs (%d ever running) of %s as host %s: simulated %s → %s (%.1f days),"
        " trace from %.0f, %s; capacity %g cores, %.1f GiB",
        "resuming the replay of" if clock.resumed else "replaying",
        len(vms),
        sum(1 for vm in vms if vm.trace.runs),
        config.replay_dir,
        config.host,
        iso(clock.start_s),
        iso(clock.end_s),
        (clock.end_s - clock.start_s) / DAY_S,
        clock.trace_start_s,
        "as fast as possible" if clock.speed is None else f"{clock.speed:g}× real time",
        collector.resources().cpu_cores,
        collector.resources().memory_bytes / 2**30,
    )
    return collector, clock


# -- the plan of a replay, kept beside the spool ------------------------------------------------


def plan_path(config: AgentConfig) -> Path:
    """Where a replay's plan (its clock and what it replays) is kept: beside the spool, whose
    state is only meaningful with it."""
    return Path(f"{config.spool_path}.replay.json")


def _identity(config: AgentConfig) -> dict[str, Any]:
    """What makes two runs the same replay: the host, the traces (their contents too), the
    owners and what the counters are read and folded with. Not the start and end: ``now-7d``
    means another instant at every start, and a restarted replay must go on with the clock it
    had. Nor the speed, which paces the replay but changes no figure."""
    customers = config.replay_customers
    directory = config.replay_dir
    names = list(config.replay_vms) or ([] if directory is None else trace_names(directory))
    return {
        "host": config.host,
        "replay_dir": str(directory),
        "vms": list(config.replay_vms),
        "traces_sha256": None if directory is None else traces_digest(directory, names),
        "customers": dict(customers) if isinstance(customers, Mapping) else list(customers),
        "default_customer": config.default_customer,
        "interval_s": config.interval_s,
        "tick_s": config.tick_s,
        "offset_s": config.replay_offset_s,
        "host_cores": config.replay_host_cores,
        "host_memory_bytes": config.replay_host_memory_bytes,
    }


def _as_json(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` as it reads back from the plan file (tuples become lists, keys strings)."""
    result: dict[str, Any] = json.loads(json.dumps(value))
    return result


def save_plan(config: AgentConfig, clock: ReplayClock) -> None:
    """Record the replay's clock beside its spool (atomically and durably, before the first
    tick commits a state that needs it), so that an agent restarted after a crash or SIGKILL
    resumes the same simulated span instead of starting another."""
    document = {
        "replay": _identity(config),
        "clock": {
            "start_s": clock.start_s,
            "end_s": clock.end_s,
            "trace_start_s": clock.trace_start_s,
            "speed": clock.speed,
            "live": clock.live,
        },
    }
    path = plan_path(config)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w") as f:
            f.write(json.dumps(document, indent=1))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as exc:
        raise ReplayError(f"cannot record the replay's plan in {path}: {exc.strerror}") from None


def load_plan(config: AgentConfig) -> ReplayClock | None:
    """The clock an earlier run of this same replay recorded, or None when there is none.
    :class:`ReplayError` when the spool's plan is another replay's. The speed is the one
    configured now: it only paces the replay, and a replay resumed at another speed counts
    the same."""
    path = plan_path(config)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ReplayError(f"cannot read the replay plan {path}: {exc}") from None
    recorded = document.get("replay") if isinstance(document, dict) else None
    identity = _as_json(_identity(config))
    if recorded != identity:
        differ = [k for k, v in identity.items() if (recorded or {}).get(k) != v]
        raise ReplayError(
            f"spool {config.spool_path} holds another replay (it differs in"
            f" {', '.join(differ) or 'its format'}; plan {path}): use a new agent.spool_path"
        )
    try:
        c = document["clock"]
        return ReplayClock(
            float(c["start_s"]),
            float(c["end_s"]),
            float(c["trace_start_s"]),
            config.replay_speed,
            resumed=True,
            live=bool(c.get("live", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplayError(f"the replay plan {path} has no usable clock ({exc!r})") from None


def replay_id(config: AgentConfig, clock: ReplayClock) -> str:
    """A short digest of what is replayed and on which clock: the same replay, run again or
    resumed, has the same id; another (other traces, host, owners, start, mapping onto the
    traces) has another."""
    document = {
        "replay": _as_json(_identity(config)),
        "start_s": clock.start_s,
        "trace_start_s": clock.trace_start_s,
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]


def replay_key(replay: str, clock: ReplayClock) -> Callable[[str, int], str]:
    """The batch keys of a replay (``AgentLoop(key=…)``): host, interval, the replay
    (:func:`replay_id`) and the simulated instant of the tick that closed the batch.

    Deterministic, where a live agent's keys are random: a replay reads the same counters at
    the same instants every time, so a batch made again (a spool lost after its batches were
    delivered, a resumed agent) is the same batch under the same key, which the daemon
    acknowledges as a duplicate instead of counting it twice. The closing tick tells apart
    the batches of one interval that different ticks close (a late part). At most 128
    printable characters, like :func:`gmd.agent.loop.new_key`'s."""

    def key(host: str, interval_start_s: int) -> str:
        name = "".join(c if "!" <= c <= "~" else "_" for c in host)[:64]
        return f"{name}/{interval_start_s}/replay-{replay}/{round(clock.now_s * 1000)}"

    return key


# -- driving an agent -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayReport:
    ticks: int
    start_s: float
    reached_s: float
    """simulated time of the last tick"""
    end_s: float
    batches: int
    """batches made (one per host and interval)"""
    waiting: int
    """batches left in the spools after the final send (the daemon could not take them)"""
    stopped: bool
    """interrupted before the end"""
    resumed_s: float | None = None
    """the simulated time of the earlier run's last reading this run went on from (the
    earliest over the agents); ``None`` when it started from the clock's start"""

    @property
    def finished_before(self) -> bool:
        """The replay had been done to its end by an earlier run: nothing was left to tick."""
        return self.resumed_s is not None and self.resumed_s >= self.end_s


def tick_times(start_s: float, end_s: float, tick_s: float) -> Iterator[float]:
    """``start_s``, every ``tick_s`` after it, and ``end_s`` itself (so that a reading is
    taken at the end and closes the last interval). Multiplied, not summed, so that no
    rounding error piles up over a week of ticks."""
    k = 0
    while (t := start_s + k * tick_s) < end_s:
        yield t
        k += 1
    yield end_s


def replay_run(
    agents: AgentLoop | Sequence[AgentLoop],
    clock: ReplayClock,
    *,
    stop: threading.Event | None = None,
    on_tick: Callable[[ReplayClock], None] | None = None,
    wall: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Any] = time.sleep,
    resume: bool = False,
    present: Callable[[], float] = time.time,
) -> ReplayReport:
    """Tick ``agents`` (the hosts of one replay, sharing ``clock``) through simulated time.

    Every ``tick_s`` of simulated time from the clock's start to its end, the clock is set and
    each agent ticks once (``agent.tick(now_s=…)``: read, fold, spool, send), in lock step, so
    that at any moment the daemon has every host's batches up to the same instant. Without a
    speed nothing sleeps; with one, tick k waits until ``k × tick_s / speed`` wall seconds
    after the first; a live replay's (:attr:`ReplayClock.live`) until ``present()`` reaches
    its instant. ``stop`` ends the run early (between ticks); ``on_tick`` is called after
    each tick (a progress bar: ``clock.fraction``). At the end each spool is sent once more.

    An agent whose spool holds the state of an earlier run either resumes it (``resume``: the
    caller has checked that it is the same replay, with the same clock — :func:`load_plan`)
    or is refused (:class:`ReplayError`): measuring another replay from those counters, or
    the same simulated span again, would count twice. Resuming, the clock starts at the
    state's last reading (``last_ok_s``, one of the ticks of :func:`tick_times`), and each
    agent ticks only the later ticks: its next reading is measured from the saved counters
    (a VM that stopped in between is reported once more, as :meth:`ReplayCollector.resume_at`
    says), the intervals it closed before are in its spool or already delivered and are not
    made again, and the open ones in the state go on. The batches still spooled are sent by
    the first tick (or the final send, when the replay had already reached its end).
    """
    agents = [agents] if not isinstance(agents, Sequence) else list(agents)
    done = _resume_points(agents, clock, resume)
    tick_s = agents[0].config.tick_s
    resumed_at = min((d for d in done if d is not None), default=None)
    if resumed_at is not None:
        clock.now_s = resumed_at
        log.info(
            "resuming the replay at simulated %s (%.0f%% done), where the spools left off",
            iso(resumed_at),
            clock.fraction * 100,
        )
    wall_start = wall()
    first = clock.start_s if resumed_at is None else resumed_at
    ticks = batches = 0
    stopped = False
    for t in tick_times(clock.start_s, clock.end_s, tick_s):
        if all(d is not None and t <= d for d in done):
            continue  # ticked before the interruption
        delay = 0.0
        if clock.live:
            delay = t - present()
        elif clock.speed is not None:
            delay = wall_start + (t - first) / clock.speed - wall()
        if delay > 0:
            if stop is not None:
                stop.wait(delay)
            else:
                sleep(delay)
        if stop is not None and stop.is_set():
            stopped = True
            break
        clock.now_s = t
        for agent, d in zip(agents, done, strict=True):
            if d is None or t > d:
                batches += agent.tick(now_s=t).batches
        ticks += 1
        if on_tick is not None:
            on_tick(clock)
    waiting = 0
    for agent in agents:  # the final send
        if agent.sender is not None:
            agent.sender.drain()
        waiting += agent.spool.size()[0]
    return ReplayReport(
        ticks, clock.start_s, clock.now_s, clock.end_s, batches, waiting, stopped, resumed_at
    )


def _resume_points(
    agents: Sequence[AgentLoop], clock: ReplayClock, resume: bool
) -> list[float | None]:
    """Each agent's last reading of an earlier run, from its spool's state (``None``: it
    starts afresh), its collector set to resume there; :class:`ReplayError` when the agents
    cannot replay together or a spool's state is not this replay's to resume (see
    :func:`replay_run`)."""
    if not agents:
        raise ReplayError("no agent to replay")
    tick_s = agents[0].config.tick_s
    done: list[float | None] = []
    for agent in agents:
        if agent.config.tick_s != tick_s or agent.config.interval_s != agents[0].config.interval_s:
            raise ReplayError("the agents of one replay must share tick_s and interval_s")
        last = agent.state.last_ok_s
        if last is not None and not resume:
            raise ReplayError(
                f"spool {agent.spool.path} holds the state of an earlier run (host"
                f" {agent.config.host}) but not the plan of this replay: use a new"
                " agent.spool_path"
            )
        if last is not None and not clock.start_s <= last <= clock.end_s:
            raise ReplayError(
                f"spool {agent.spool.path} holds a reading at {iso(last)}, outside this replay"
                f" ({iso(clock.start_s)} → {iso(clock.end_s)}): use a new agent.spool_path"
            )
        if last is not None and isinstance(agent.collector, ReplayCollector):
            agent.collector.resume_at(last)
        done.append(last)
    return done


def replay_dry_run(
    config: AgentConfig, collector: ReplayCollector, clock: ReplayClock
) -> dict[str, Any]:
    """The batch of the replay's first interval, read every ``tick_s`` of simulated time as
    the agent would; nothing is written or sent (``gmd-agent --dry-run``)."""
    resources = collector.resources()
    capacity = Bandwidth.of(config.disk_bytes_per_s, config.network_bytes_per_s).capacity(resources)
    state = AgentState()
    for t in tick_times(clock.start_s, clock.end_s, config.tick_s):
        clock.now_s = t
        result = advance(state, collector.collect(), config.interval_s)
        state = result.state
        if result.closed:
            first = result.closed[0]
            return batch_document(
                first,
                key=f"dry-run/{first.start_s}",
                host=config.host,
                capacity=capacity.as_wire(),
            )
    raise ReplayError("the replay is shorter than one interval")  # plan_clock prevents it
