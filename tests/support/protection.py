"""The protection gmd gives, measured on real QEMU guests: a moderate customer's work beside a
greedy customer's spinning VMs, with gmd off, in dry-run and on (issue 43).

One owner for what ``bench/protection.py`` (the figures) and
``tests/realvm/test_protection_realvm.py`` (the direction) run:

- **The host** (:func:`booted`): the real libvirtd of tests/scripts/libvirt.sh; a greedy project
  whose ``greedy_vms`` guests spin every vCPU (``gmd.role=spin``), and ``moderates`` projects of
  one guest each that run work of a known size in bursts (``gmd.role=job``: count to
  ``job_loops`` in the shell, print the job's start and end with the guest's uptime on the
  serial console, sleep ``job_pause_s``; tests/support/guest_image.py). Every domain gets the
  scheduler's default weight, as Nova's do (Nova sets ``cpu_shares`` only from a flavor's
  ``quota:cpu_shares``): a project running more VMs holds more of the host.
- **gmd** (:func:`gmd_running`): a real ``gmd-daemon`` (SQLite, a ledger of its own per phase,
  the read API on loopback) and a real ``gmd-agent`` with its default collector and applier,
  as processes, on short intervals (:data:`ACCOUNTING`) and a level table whose thresholds a
  greedy project of this host crosses within a minute (:func:`enforcement`).
- **A phase** (:func:`run_phase`): which guests run (the greedy ones resumed or paused, the
  moderate ones likewise) and gmd's mode, for ``seconds``; a sampler reads every domain's CPU
  time and the greedy guests' live scheduler settings each second, and gmd's standings every two.
  After the phase the agent puts back every setting it changed (``gmd-agent --restore-all``),
  checked against the settings read before it started.

Each phase's ledger starts empty, so that "the time from the greedy load's start to the first
cap" is measured from a greedy project gmd has not seen before, as it would be on its first day.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import itertools
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gmd.wire import PlanMode
from tests.support.cloud_demo import answers, free_port, process
from tests.support.cloud_story import toml_document
from tests.support.guest_image import build_guest_image
from tests.support.realvm import (
    Guest,
    RealVMError,
    _libvirt,
    _new_guest,
    _remove_domains,
    _wait_ready,
    domain_xml,
    remove_stale_domains,
    start_libvirt,
)

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
HOST = "protection-host"
INTERVAL_S = 10
ACCOUNTING: dict[str, Any] = {
    "interval_s": INTERVAL_S,
    "grace_s": 3,
    "endowment": "equal",
    "consumer": "customer",
    # A day's half-life in a cloud of 300 s intervals is 288 intervals; here three: the bench
    # has minutes, not days, for a balance to build and decay.
    "half_life_s": 30,
}
JOB = re.compile(r"gmd-job: (start|end) (\d+) ([0-9.]+)")
SETTLE_S = 6.0
"""seconds between gmd's start and a phase's, so that the agent's start is not measured"""
BOUND = 1.25
"""Issue 43: with enforcement on, a moderate job completes within 1.25× its uncontended time."""


def stop_on_sigterm() -> None:
    """SIGTERM ends the run as Ctrl-C does: the guests are removed and gmd stopped (and the
    greedy guests' settings put back) on the way out, not left behind."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


class Knobs(enum.StrEnum):
    """Which of a level's knobs a phase lets gmd use."""

    both = "both"
    """weights and caps, as etc/gmd.toml's level table"""
    weights = "weights"
    """no cap at any level"""
    caps = "caps"
    """weight factors 1: the caps alone"""


def enforcement(mode: PlanMode, knobs: Knobs = Knobs.both, **overrides: Any) -> dict[str, Any]:
    """``[enforcement]`` of a phase: gmd's level table (weights from level 1, caps from
    ``cap_level``, as etc/gmd.toml), its thresholds scaled to the bench's minutes.

    ``knobs``: which of the level table's knobs are left in it (:class:`Knobs`).
    """
    section: dict[str, Any] = {
        "mode": mode.value,
        # A greedy project of this host adds ~0.2 a 10 s interval to its balance, which its
        # 30 s half-life holds near 1: level 1 within ~20 s of accounting, level 3 within ~60 s.
        "enter": [0.2, 0.4, 0.6],
        "leave": [0.1, 0.3, 0.5],
        "dwell_s": 20,
        "max_step": 1,
        "weight_factors": [0.5, 0.25, 0.1],
        "cap_level": 2,
        "cpu_cap_fractions": [1.0, 0.75, 0.5],
        "disk_caps_bytes_per_s": [0, 0, 0],
        "contended_above": 0.8,
        "contention_intervals": 3,
        "quota_level": 4,  # no cloud here: never
    }
    if knobs is Knobs.weights:
        section["cap_level"] = 4
    elif knobs is Knobs.caps:
        section["weight_factors"] = [1.0, 1.0, 1.0]
    section.update(overrides)
    return section


@dataclass(frozen=True)
class Vm:
    """A guest of the story: its libvirt domain, its serial console's file, its vCPUs."""

    name: str
    console_log: Path
    vcpus: int = 1


@dataclass(frozen=True)
class Host:
    """The guests of one run, booted and running their roles, and how gmd's agent finds them."""

    uri: str
    greedy: tuple[Vm, ...]
    moderate: tuple[Vm, ...]
    greedy_project: str
    name: str = HOST
    """the compute host's name in gmd (the agent's ``host``)"""
    domain_prefixes: tuple[str, ...] = ()
    """the agent's ``domain_prefixes``: the domains it measures (empty: every domain)"""
    switch: Callable[[Vm, bool], None] | None = field(default=None, compare=False)
    """how a guest is paused (False) or let run (True) where not through libvirt (a cloud's
    member asks Nova); it returns once the domain's state shows it"""

    @property
    def guests(self) -> tuple[Vm, ...]:
        return self.greedy + self.moderate


def vm(guest: Guest) -> Vm:
    return Vm(guest.name, guest.console_log, guest.vcpus)


@contextlib.contextmanager
def booted(
    workdir: Path,
    *,
    greedy_vms: int = 3,
    greedy_vcpus: int = 1,
    moderates: int = 2,
    job_loops: int = 200_000,
    job_pause_s: float = 2.0,
) -> Iterator[Host]:
    """Boots the greedy project's spinning guests (then pauses them) and the moderate projects'
    job guests; removes them all however the block ends."""
    libvirt = _libvirt()
    uri = start_libvirt()
    image = build_guest_image()
    conn = libvirt.open(uri)
    try:
        remove_stale_domains(conn)
        made: dict[str, Guest] = {}
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(_remove_domains, conn, made)
            pid = os.getpid()
            greedy_project = uuid.uuid4().hex  # as Keystone writes it
            greedy = tuple(
                replace(
                    _new_guest("spin", pid, workdir, index=k),
                    project_uuid=greedy_project,
                    vcpus=greedy_vcpus,
                )
                for k in range(greedy_vms)
            )
            moderate = tuple(_new_guest("job", pid, workdir, index=k) for k in range(moderates))
            cmdline = f"gmd.job_loops={job_loops} gmd.job_pause={job_pause_s:g}"
            for guest in greedy + moderate:
                made[guest.name] = guest
                xml = domain_xml(guest, image.kernel, image.initrd, cmdline=cmdline)
                try:
                    conn.defineXML(xml).create()
                except libvirt.libvirtError as e:
                    raise RealVMError(f"could not define and start {guest.name}: {e}") from e
            _wait_ready(conn, list(made.values()))
            for guest in greedy:
                conn.lookupByName(guest.name).suspend()
            yield Host(
                uri,
                tuple(vm(g) for g in greedy),
                tuple(vm(g) for g in moderate),
                greedy_project,
                # these guests only (not another test's gmd-test-spin-PID)
                domain_prefixes=tuple(g.name.rsplit("-", 1)[0] + "-" for g in greedy + moderate),
            )
    finally:
        conn.close()


# --- gmd, as processes -----------------------------------------------------------------------


@dataclass
class Gmd:
    root: Path
    url: str
    agent_config: Path

    def standings(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/v1/standings?all=true", timeout=5) as answer:
            body = json.loads(answer.read())
        return body["customers"] if isinstance(body, dict) else body


@contextlib.contextmanager
def gmd_running(
    root: Path, host: Host, section: dict[str, Any], sections: dict[str, Any] | None = None
) -> Iterator[Gmd]:
    """gmd-daemon (a new SQLite ledger in ``root``) and gmd-agent on this host, until the block
    ends; then the agent's --restore-all puts back whatever it changed. ``sections``: more of
    the daemon's configuration (a cloud's Placement, say)."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    token = secrets.token_urlsafe(24)
    digest = hashlib.sha256(token.encode()).hexdigest()
    (root / "agent.token").write_text(token + "\n")
    (root / "agent.token").chmod(0o600)
    daemon_doc = {
        "database": {"url": f"sqlite:///{root / 'ledger.db'}"},
        "daemon": {"bind": "127.0.0.1", "port": port, "auth": "token", "account_every_s": 0.5},
        "accounting": ACCOUNTING,
        "enforcement": section,
        "read_api": {"auth": "local"},
        **(sections or {}),
        "hosts": {host.name: {"owner": "operator", "token_sha256": digest}},
    }
    (root / "gmd.toml").write_text(toml_document(daemon_doc))
    agent_doc = {
        "agent": {
            "daemon_url": f"http://127.0.0.1:{port}",
            "token_file": "agent.token",
            "host": host.name,
            "libvirt_uri": host.uri,
            "domain_prefixes": list(host.domain_prefixes),
            "tick_s": 1,
            "interval_s": INTERVAL_S,
            "post_jitter_s": 0,
            "plan_every_s": 0,
            "spool_path": str(root / "spool.db"),
            "enforcement_state_path": str(root / "enforcement.json"),
            "network_bytes_per_s": 1_250_000_000,
            "metrics_port": 0,
        }
    }
    agent_config = root / "agent.toml"
    agent_config.write_text(toml_document(agent_doc))
    url = f"http://127.0.0.1:{port}"
    with process(root, "gmd-daemon", "--config", str(root / "gmd.toml")):
        _wait("gmd-daemon answers", lambda: answers(f"{url}/healthz"), root / "gmd-daemon.log")
        try:
            with process(root, "gmd-agent", "--config", str(agent_config)):
                yield Gmd(root, url, agent_config)
        finally:
            done = subprocess.run(
                [str(BIN / "gmd-agent"), "--config", str(agent_config), "--restore-all"],
                capture_output=True,
                text=True,
                cwd=root,
                timeout=120,
            )
            if done.returncode != 0:
                raise RealVMError(
                    f"gmd-agent --restore-all exited {done.returncode}: {done.stderr.strip()}"
                )


def _wait(what: str, check: Any, log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RealVMError(f"no {what} after {timeout_s:.0f} s; see {log}")
        time.sleep(0.2)


# --- what a phase measures -------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    greedy: bool  # the greedy project's guests run
    moderate: bool = True  # the moderate projects' guests run
    mode: PlanMode = PlanMode.on  # gmd's enforcement mode
    knobs: Knobs = Knobs.both
    protected_jobs: int = 0
    """go on past ``seconds`` (up to ``max_seconds``) until this many moderate jobs have
    started while the greedy project stood at ``protected_level`` or above (and had for an
    interval, so that the agent had applied it): on a busy machine gmd takes longer to get
    there, and a test waits for the state rather than a time"""
    protected_level: int = 1
    max_seconds: float = 0.0


def protected(levels: Sequence[tuple[float, int]], t: float, level: int) -> bool:
    """Whether the greedy project stood at ``level`` or above ``t`` seconds into a phase, and
    an interval before (the agent applies a plan at its next post)."""
    return min(level_at(levels, t), level_at(levels, t - INTERVAL_S)) >= level


def level_at(levels: Sequence[tuple[float, int]], t: float) -> int:
    """The greedy project's level ``t`` seconds into a phase, as its standings last said
    (``levels``: (seconds into the phase, level) as read)."""
    level = 0
    for at, lv in levels:
        if at > t:
            break
        level = lv
    return level


@dataclass
class Job:
    guest: str
    k: int
    seconds: float  # guest's own uptime, end − start
    started: float  # host monotonic, when its start line was first seen
    ended: float


@dataclass
class PhaseResult:
    phase: Phase
    began: float
    ended: float
    jobs: list[Job]
    cores: dict[str, float]  # per project (greedy, each moderate): mean cores over the phase
    first_throttle_s: float | None  # greedy load's start → a greedy guest's settings changed
    first_cap_s: float | None  # → a greedy guest's vcpu_quota set
    greedy_capped_cores: float | None  # the greedy project's cores while a cap held
    greedy_cap_cores: float | None  # what its caps allowed, summed (vcpu_quota / period × vCPUs)
    max_level: int
    levels: list[tuple[float, int]] = field(default_factory=list)
    greedy_cpu: list[tuple[float, float]] = field(default_factory=list)
    """(host monotonic time, the greedy project's CPU seconds so far), a sample a second"""

    def level_at(self, job: Job) -> int:
        """The greedy project's level when ``job`` started."""
        return level_at(self.levels, job.started - self.began)

    def ratios(self, baseline_s: float, at_level: int = 0) -> list[float]:
        """Each completed job's time over the baseline median, of the jobs started while the
        greedy project stood at ``at_level`` or above and had an interval before."""
        return [
            j.seconds / baseline_s
            for j in self.jobs
            if protected(self.levels, j.started - self.began, at_level)
        ]


class Console:
    """Follows the job guests' serial consoles: each job's start and end as the guest's uptime
    said, with the host's monotonic time at which the line was first seen."""

    def __init__(self, guests: Sequence[Vm]) -> None:
        self.guests = list(guests)
        self.offsets = {g.name: 0 for g in self.guests}
        self.partial = {g.name: "" for g in self.guests}
        self.starts: dict[tuple[str, int], tuple[float, float]] = {}
        self.jobs: list[Job] = []

    def poll(self) -> None:
        now = time.monotonic()
        for g in self.guests:
            try:
                with g.console_log.open("rb") as f:
                    f.seek(self.offsets[g.name])
                    data = f.read()
            except FileNotFoundError:
                continue
            self.offsets[g.name] += len(data)
            text = self.partial[g.name] + data.decode(errors="replace")
            lines = text.split("\n")
            self.partial[g.name] = lines.pop()
            for line in lines:
                m = JOB.search(line)
                if not m:
                    continue
                kind, k, up = m.group(1), int(m.group(2)), float(m.group(3))
                if kind == "start":
                    self.starts[(g.name, k)] = (up, now)
                elif (g.name, k) in self.starts:
                    up0, seen0 = self.starts.pop((g.name, k))
                    self.jobs.append(Job(g.name, k, up - up0, seen0, now))


def _sched(dom: Any) -> dict[str, int]:
    libvirt = _libvirt()
    return dom.schedulerParametersFlags(libvirt.VIR_DOMAIN_AFFECT_LIVE)


def run_phase(
    root: Path,
    host: Host,
    phase: Phase,
    console: Console,
    overrides: dict[str, Any] | None = None,
    sections: dict[str, Any] | None = None,
) -> PhaseResult:
    """Runs one phase on ``host`` (gmd started anew with the phase's mode) and measures it;
    ``overrides``: of the phase's ``[enforcement]``; ``sections``: more of the daemon's
    configuration."""
    libvirt = _libvirt()
    conn = libvirt.open(host.uri)
    try:
        doms = {g.name: conn.lookupByName(g.name) for g in host.guests}
        originals = {g.name: _sched(doms[g.name]) for g in host.greedy}
        project_of = {g.name: ("greedy" if g in host.greedy else g.name) for g in host.guests}
        section = enforcement(phase.mode, phase.knobs, **(overrides or {}))
        with gmd_running(root / phase.name, host, section, sections) as gmd:
            # gmd-agent's start (its imports, the host's probe) takes a core for seconds: the
            # phase begins once it has passed.
            time.sleep(SETTLE_S)
            for group, wanted in ((host.greedy, phase.greedy), (host.moderate, phase.moderate)):
                for g in group:
                    _set_running(host, g, doms[g.name], wanted)
            began = time.monotonic()
            console.poll()
            first_jobs = len(console.jobs)
            cpu0 = {n: d.info()[4] for n, d in doms.items()}
            samples: list[tuple[float, dict[str, int], dict[str, dict[str, int]]]] = []
            levels: list[tuple[float, int]] = []
            next_levels = began

            def more() -> bool:
                now = time.monotonic()
                if now < began + phase.seconds:
                    return True
                if now >= began + phase.max_seconds or not phase.protected_jobs:
                    return False
                jobs = sum(
                    j.started >= began
                    and protected(levels, j.started - began, phase.protected_level)
                    for j in console.jobs
                )
                return jobs < phase.protected_jobs

            while more():
                now = time.monotonic()
                console.poll()
                cpu = {n: d.info()[4] for n, d in doms.items()}
                sched = {g.name: _sched(doms[g.name]) for g in host.greedy}
                samples.append((now, cpu, sched))
                if now >= next_levels:
                    next_levels = now + 2.0
                    with contextlib.suppress(OSError, ValueError, KeyError):
                        row = next(
                            (
                                c
                                for c in gmd.standings()
                                if c.get("customer") == host.greedy_project
                            ),
                            None,
                        )
                        if row is not None:
                            levels.append((now - began, int(row.get("level") or 0)))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
            ended = time.monotonic()
            console.poll()
            cpu1 = {n: d.info()[4] for n, d in doms.items()}
        for g in host.greedy:  # paused between phases; the moderates go on with their jobs
            _set_running(host, g, doms[g.name], False)
        restored = {g.name: _sched(doms[g.name]) for g in host.greedy}
        if restored != originals:
            raise RealVMError(f"{phase.name}: the greedy guests were not restored: {restored}")
    finally:
        conn.close()
    jobs = [j for j in console.jobs[first_jobs:] if j.started >= began and j.ended <= ended]
    span = ended - began
    cores: dict[str, float] = {}
    for name, c1 in cpu1.items():
        cores[project_of[name]] = cores.get(project_of[name], 0.0) + (c1 - cpu0[name]) / 1e9 / span

    def throttled(s: dict[str, int], name: str) -> bool:
        return s != originals[name]

    first_throttle = next(
        (t - began for t, _, sched in samples if any(throttled(s, n) for n, s in sched.items())),
        None,
    )
    first_cap = next(
        (
            t - began
            for t, _, sched in samples
            if any(s.get("vcpu_quota", 0) > 0 for s in sched.values())
        ),
        None,
    )
    capped_cores = cap_cores = None
    if first_cap is not None:
        # Windows between consecutive samples in which every greedy guest held a cap.
        used = allowed = span_capped = 0.0
        for (t0, c0, s0), (t1, c1, _s1) in itertools.pairwise(samples):
            if not all(s.get("vcpu_quota", 0) > 0 for s in s0.values()):
                continue
            span_capped += t1 - t0
            used += sum((c1[n] - c0[n]) / 1e9 for n in s0)
            allowed += (t1 - t0) * sum(
                s["vcpu_quota"] / s["vcpu_period"] * _vcpus(host, n) for n, s in s0.items()
            )
        if span_capped > 0:
            capped_cores = used / span_capped
            cap_cores = allowed / span_capped
    return PhaseResult(
        phase=phase,
        began=began,
        ended=ended,
        jobs=jobs,
        cores=cores,
        first_throttle_s=first_throttle,
        first_cap_s=first_cap,
        greedy_capped_cores=capped_cores,
        greedy_cap_cores=cap_cores,
        max_level=max((lv for _, lv in levels), default=0),
        levels=levels,
        greedy_cpu=[(t, sum(cpu[g.name] for g in host.greedy) / 1e9) for t, cpu, _ in samples],
    )


def _set_running(host: Host, guest: Vm, dom: Any, wanted: bool) -> None:
    libvirt = _libvirt()
    if (dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING) == wanted:
        return
    if host.switch is not None:
        host.switch(guest, wanted)
    elif wanted:
        dom.resume()
    else:
        dom.suspend()


def _vcpus(host: Host, name: str) -> int:
    return next(g.vcpus for g in host.guests if g.name == name)


def quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]


def recovery_s(result: PhaseResult, baseline_s: float, run: int = 5) -> float | None:
    """Seconds from the phase's start (the greedy load's) to the end of the first job, started
    after gmd first throttled the greedy project, from which the median of ``run`` jobs in a
    row completed within :data:`BOUND` of the baseline (one job's luck is not a recovery, nor
    is one slow job beside a level that moved its end)."""
    if result.first_throttle_s is None:
        return None
    after = result.began + result.first_throttle_s
    jobs = sorted((j for j in result.jobs if j.started >= after), key=lambda j: j.started)
    for i in range(len(jobs) - run + 1):
        if statistics.median(j.seconds for j in jobs[i : i + run]) <= BOUND * baseline_s:
            return jobs[i].ended - result.began
    return None
