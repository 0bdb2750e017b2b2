"""gmd-admin demo: a small cloud on one machine, replayed from real VM traces, end to end.

What a newcomer should see in a few minutes is the real thing, not a mock-up: a real
``gmd-daemon`` process on the embedded SQLite ledger, one real ``gmd-agent`` process per
simulated compute host replaying Bitbrains VMs (``agent.collector = "replay"``, token auth,
spool, HTTP), the accountant's own code deciding throttle levels after every interval
(dry-run), and the operators' commands run as an operator would type them.

**Why accounting waits for the replay.** The agents replay the days that just ended, as fast
as they can; a daemon accounting meanwhile would close every interval up to the *real* present
at once and take the replayed batches as late. So the daemon runs ``--no-accounting`` while the
agents replay, and the accountant then catches up interval by interval, exactly as a daemon
does after an outage (:func:`gmd.daemon.ledger.accounting.account_due`, with the level decisions in
the same transaction). Levels are decided with each interval's end as "now", so the outcome is
the one a daemon accounting in real time would have reached.

**The cloud.** The Bitbrains VMs are dealt round-robin over the hosts; the customers own
blocks of consecutive trace numbers (in the trace, neighbouring VMs tend to be one service's,
with one profile), so that the customers differ as real ones do. Hosts are overcommitted
(``cores_per_host`` physical cores under far more vCPUs, as OpenStack's default CPU allocation
ratio of 16 allows), so flavors are scaled down to what the host can give, and customers that
use their VMs fully are over their endowment whenever others leave room. The last host belongs
to ``lab``, an organization that is also a customer (DirectContr: contributing a host earns it
priority). A replayed host gives its VMs no more than its cores: where their traces together ask
more, each gets the same fraction of what it asks (the host is saturated).

**One busy host.** The first host is a small, older one (:data:`BUSY_HOST_SHARE` of the others'
cores) under the same share of VMs, so it runs flat out while the others idle. A throttled
customer's hard caps apply only on a host contended for the capped resource (``[enforcement]
contended_above``), weights on every host: the greediest customer ends capped on the busy host
and not on the idle ones, and the demo says so after ``enforce --plan``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import httpx

from gmd import GmdError
from gmd.common.timespec import iso
from gmd.common.units import DAY_S
from gmd.traces import TraceError, trace_extent, trace_file, trace_ranges

MARKER = ".gmd-demo"
"""A file that marks a directory as the demo's own, so that a rerun may empty it."""

CUSTOMER_BLOCKS: tuple[tuple[str, int, int], ...] = (
    ("acme", 1, 20),
    ("globex", 21, 40),
    ("initech", 41, 53),
    ("umbrella", 54, 70),
    ("hooli", 71, 85),
    ("lab", 86, 100),
)
"""Customer → the Bitbrains trace numbers (inclusive) its VMs replay. 41-53 are a batch
cluster running flat out; 1-20 small, mostly idle web VMs."""

LAB = "lab"
"""The organization that contributes the last host and is also a customer."""

BUSY_HOST_SHARE = 0.25
"""The first host's cores as a share of the others' (with more than one host): small enough
that its round-robin share of the VMs keeps it contended, where the others idle."""


class DemoError(GmdError, RuntimeError):
    """The demo cannot go on; the message says what failed and where its log is."""


PACKAGED_TRACES = Path(__file__).resolve().parent / "demo_data" / "2013-7"
"""The traces the demo replays by default, shipped in the package (``N.csv.gz``): the first
three days (and an hour) of the GWA-T-12 Bitbrains Rnd sample; ``demo_data/README.md`` says
where they come from, their terms and how they were cut. ``--traces DIR`` takes others."""


@dataclass(frozen=True)
class Cloud:
    """What the demo simulates: which trace runs on which host for which customer, and when."""

    hosts: tuple[str, ...]
    placement: dict[str, str]
    """trace name → host"""
    owners: dict[str, str]
    """trace name → customer"""
    start_s: int
    end_s: int
    interval_s: int
    tick_s: int
    cores: dict[str, float]
    """host → its physical cores"""

    @property
    def intervals(self) -> int:
        return (self.end_s - self.start_s) // self.interval_s

    def traces_on(self, host: str) -> list[str]:
        return [t for t, h in self.placement.items() if h == host]


def plan_cloud(
    traces: Sequence[str],
    hosts: int,
    days: float,
    *,
    interval_s: int = 900,
    tick_s: int = 300,
    now_s: float | None = None,
    cores_per_host: float = 32.0,
) -> Cloud:
    """Deal ``traces`` round-robin over ``hosts`` hosts and give each to its block's customer;
    the replay covers the ``days`` before the last interval boundary before now. Each host has
    ``cores_per_host`` cores, but the first of several only :data:`BUSY_HOST_SHARE` of them."""
    if hosts < 1:
        raise DemoError("at least one host is needed")
    if not traces:
        raise DemoError("no traces to replay")
    owners = {}
    for name in traces:
        n = int(name) if name.isdigit() else -1
        owner = next((c for c, lo, hi in CUSTOMER_BLOCKS if lo <= n <= hi), None)
        if owner is None:
            raise DemoError(f"trace {name} is outside the demo's customers' blocks (1-100)")
        owners[name] = owner
    names = [f"cmp-{k + 1:02d}" for k in range(hosts)]
    placement = {name: names[i % hosts] for i, name in enumerate(traces)}
    now = time.time() if now_s is None else now_s
    end = math.floor(now / interval_s) * interval_s
    start = end - max(1, round(days * DAY_S / interval_s)) * interval_s
    cores = dict.fromkeys(names, float(cores_per_host))
    if hosts > 1:
        cores[names[0]] = cores_per_host * BUSY_HOST_SHARE
    return Cloud(tuple(names), placement, owners, start, end, interval_s, tick_s, cores)


def check_coverage(traces: Path, cloud: Cloud, days: float) -> None:
    """Refuse a replay longer than the traces: an agent would stop at its traces' end (see
    :func:`gmd.agent.collect.replay.plan_clock`) and the demo would account a shorter span than
    asked. Each host's replay starts at its traces' earliest first row and ends at their latest
    last row; unreadable traces are left to the agent, which names file and line."""
    covered = math.inf
    for host in cloud.hosts:
        extents = []
        for name in cloud.traces_on(host):
            with contextlib.suppress(TraceError):
                extents.append(trace_extent(trace_file(traces, name)))
        found = [e for e in extents if e is not None]
        if found:
            covered = min(covered, max(e[1] for e in found) - min(e[0] for e in found))
    if covered < cloud.end_s - cloud.start_s:
        most = math.floor(max(covered, 0) / cloud.interval_s) * cloud.interval_s / DAY_S
        shipped = " (the demo's own, the first days of GWA-T-12 Rnd)"
        raise DemoError(
            f"--days {days:g}: the traces in {traces}{shipped if traces == PACKAGED_TRACES else ''}"
            f" cover {max(covered, 0) / DAY_S:.2f} days: give --days"
            f" {math.floor(most * 100) / 100:g} or fewer, or --traces DIR with longer traces"
        )


def parse_traces(spec: str) -> list[str]:
    """``"1-100"`` or ``"1-20,41-53"`` → trace names, in order."""
    try:
        return list(trace_ranges(spec))
    except ValueError as exc:
        raise DemoError(f"--vms {spec!r}: {exc}") from None


# -- the configuration files ------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """The demo's files, all under one directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "gmd.toml"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.db"

    @property
    def plot(self) -> Path:
        return self.root / "standings.png"

    def agent_config(self, host: str) -> Path:
        return self.root / f"agent-{host}.toml"

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"


def prepare(root: Path) -> Layout:
    """An empty demo directory: made, or emptied when an earlier demo left it (a replay needs
    fresh spools, and the ledger must hold this run only). Refuses any other non-empty
    directory rather than delete what is not the demo's."""
    root = root.resolve()
    if root.exists() and any(root.iterdir()):
        if not (root / MARKER).exists():
            raise DemoError(f"{root} is not empty and not a demo directory: give another --dir")
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("made by gmd-admin demo; emptied by the next demo run\n")
    return Layout(root)


def _toml(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def write_configs(
    layout: Layout,
    cloud: Cloud,
    traces: Path,
    port: int,
    *,
    memory_per_host: float,
    database_url: str | None = None,
) -> None:
    """The daemon's gmd.toml and one agent file per host.

    Token auth as in production: each agent reads its token from a file, the daemon keeps
    only its SHA-256.
    """
    tokens = {h: secrets.token_urlsafe(24) for h in cloud.hosts}
    lab_host = cloud.hosts[-1] if len(cloud.hosts) > 1 else None
    lines = _daemon_lines(layout, cloud, port, database_url)
    for host in cloud.hosts:
        digest = hashlib.sha256(tokens[host].encode()).hexdigest()
        owner = LAB if host == lab_host else "operator"
        lines += [f"[hosts.{host}]", f"owner = {_toml(owner)}", f"token_sha256 = {_toml(digest)}"]
        lines.append("")
    layout.config.write_text("\n".join(lines))
    for host in cloud.hosts:
        token_file = layout.root / f"{host}.token"
        token_file.write_text(tokens[host] + "\n")
        token_file.chmod(0o600)
        _write_agent_config(layout, cloud, traces, port, host, token_file, memory_per_host)


def _daemon_lines(layout: Layout, cloud: Cloud, port: int, database_url: str | None) -> list[str]:
    """The daemon's gmd.toml but its hosts: dry-run enforcement, balances halving daily, late
    intervals taken for as long as the replay runs."""
    lines = [
        "# Written by gmd-admin demo: the daemon's and gmd-admin's configuration.",
        "[database]",
        f"url = {_toml(database_url or 'sqlite:///' + str(layout.ledger))}",
        "",
        "[accounting]",
        f"interval_s = {cloud.interval_s}",
        "grace_s = 30",
        "# balances halve every day: a few days of replay show levels rising and falling",
        f"half_life_s = {DAY_S}",
        "",
        "[daemon]",
        'bind = "127.0.0.1"',
        f"port = {port}",
        'auth = "token"',
        "accounting = false",
        "# the replay posts days-old intervals: take them however long the replay runs",
        f"max_late_s = {cloud.end_s - cloud.start_s + DAY_S}",
        "",
        "[enforcement]",
        'mode = "dry-run"',
        "enter = [2.0, 4.0, 8.0]",
        "leave = [1.0, 3.0, 6.0]",
        "dwell_s = 3600",
        "# hard caps only where the host used 80 % of the capped resource over 3 intervals",
        "contended_above = 0.8",
        "contention_intervals = 3",
        "",
        "[organizations]",
        'default_owner = "operator"',
        "",
        "[organizations.customers]",
        f"{LAB} = {_toml(LAB)}",
        "",
    ]
    return lines


def _write_agent_config(
    layout: Layout,
    cloud: Cloud,
    traces: Path,
    port: int,
    host: str,
    token_file: Path,
    memory_per_host: float,
) -> None:
    """One simulated host's agent file: replaying its VMs' traces as fast as it can."""
    names = cloud.traces_on(host)
    agent = {
        "daemon_url": f"http://127.0.0.1:{port}",
        "token_file": token_file.name,
        "host": host,
        "tick_s": cloud.tick_s,
        "interval_s": cloud.interval_s,
        "spool_path": f"spool-{host}.db",
        "metrics_port": 0,
        "enforce_backend": "none",
        "network_bytes_per_s": 1.25e9,
        "collector": "replay",
        "replay_dir": str(traces),
        "replay_vms": names,
        "replay_customers": {n: cloud.owners[n] for n in names},
        "replay_start": cloud.start_s,
        "replay_end": cloud.end_s,
        "replay_speed": "max",
        "replay_host_cores": cloud.cores[host],
        "replay_host_memory_bytes": memory_per_host,
    }
    body = "\n".join(f"{k} = {_toml(v)}" for k, v in agent.items())
    layout.agent_config(host).write_text(
        f"# Written by gmd-admin demo: simulated compute host {host}.\n[agent]\n{body}\n"
    )


# -- processes --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tool(name: str) -> str:
    """The gmd command beside this Python (the virtualenv's), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise DemoError(f"{name} is not installed (pip install gmd)")
    return found


def typed(name: str) -> str:
    """How an operator here types the gmd command ``name``: its name where that is on PATH,
    else its path (``.venv/bin/gmd-admin`` after ``make demo``, whose virtualenv is not
    activated)."""
    tool = _tool(name)
    found = shutil.which(name)
    if found is not None and os.path.samefile(found, tool):
        return name
    relative = os.path.relpath(tool)
    return relative if not relative.startswith("..") else tool


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def daemon(layout: Layout, port: int, timeout_s: float = 60.0) -> Iterator[subprocess.Popen]:
    """``gmd-daemon --no-accounting`` on the demo's configuration, up and answering
    /healthz, stopped with SIGTERM at the end."""
    log = layout.log("daemon").open("w")
    proc = subprocess.Popen(
        [_tool("gmd-daemon"), "--config", str(layout.config), "--no-accounting"],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=layout.root,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise DemoError(
                    f"gmd-daemon exited ({proc.returncode}); {layout.log('daemon')}:\n"
                    + _tail(layout.log("daemon"))
                )
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise DemoError(f"gmd-daemon did not answer within {timeout_s:g} s")
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def stored_batches(port: int) -> int:
    """Batches the daemon has stored, from its /metrics (what a Prometheus would scrape)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith('gmd_ingest_batches_total{outcome="accepted"}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


class Progress:
    """A rich bar on a terminal; a line every quarter when the output is piped (CI logs)."""

    def __init__(self, out: TextIO, what: str, total: int) -> None:
        self.out, self.what, self.total = out, what, max(total, 1)
        self._bar = None
        self._task = None
        self._quarter = -1
        if out.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress as Bar,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=out),
            )
            self._bar.start()
            self._task = self._bar.add_task(what, total=self.total)

    def update(self, done: int, note: str = "") -> None:
        if self._bar is not None and self._task is not None:
            desc = f"{self.what} {note}" if note else self.what
            self._bar.update(self._task, completed=done, description=desc)
            return
        quarter = min(4, 4 * done // self.total)
        if quarter > self._quarter:
            self._quarter = quarter
            print(f"  {self.what}: {done}/{self.total} {note}".rstrip(), file=self.out, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def replay(layout: Layout, cloud: Cloud, port: int, out: TextIO) -> float:
    """Run one ``gmd-agent`` per host until each has replayed its days and delivered every
    batch; the progress is what the daemon has stored. Returns the wall seconds."""
    began = time.monotonic()
    procs: dict[str, tuple[subprocess.Popen, TextIO]] = {}
    total = cloud.intervals * len(cloud.hosts)
    bar = Progress(out, "replaying", total)
    try:
        for host in cloud.hosts:
            log = layout.log(f"agent-{host}").open("w")
            cmd = [_tool("gmd-agent"), "--config", str(layout.agent_config(host))]
            procs[host] = (
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=layout.root),
                log,
            )
        while True:
            running = [h for h, (p, _) in procs.items() if p.poll() is None]
            failed = [h for h, (p, _) in procs.items() if p.poll() not in (None, 0)]
            if failed:
                host = failed[0]
                path = layout.log(f"agent-{host}")
                raise DemoError(
                    f"gmd-agent for {host} failed (exit {procs[host][0].returncode}); {path}:\n"
                    + _tail(path)
                )
            stored = stored_batches(port)
            days = stored / len(cloud.hosts) * cloud.interval_s / DAY_S
            bar.update(stored, f"({days:.1f} simulated days)")
            if not running:
                break
            time.sleep(0.25)
        # the last poll came after every agent had exited: it is the final count
        if stored < total:
            raise DemoError(f"the daemon stored {stored} of the {total} batches the agents made")
    finally:
        bar.close()
        for p, output in procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait()
            output.close()
    return time.monotonic() - began


def account(layout: Layout, cloud: Cloud, out: TextIO) -> tuple[int, float]:
    """The accountant catching up on the replayed intervals, oldest first, each with its
    level decisions in the same transaction. Returns (intervals accounted, wall seconds)."""
    from gmd.daemon.config import load
    from gmd.daemon.enforce.levels import after_interval
    from gmd.daemon.ledger.accounting import account_next, close_all_due
    from gmd.ledger_schema import migrate

    began = time.monotonic()
    config = load(layout.config)
    engine = migrate.engine_for(config.database_url)
    hook = after_interval(config.enforcement)
    bar = Progress(out, "accounting", cloud.intervals)
    done = 0
    try:
        # close every replayed interval as the accountant would once its grace period is over
        close_all_due(engine, cloud.end_s + config.accounting.grace_s, config.accounting.grace_s)
        while account_next(engine, config.accounting, hook) is not None:
            done += 1
            bar.update(done)
    finally:
        bar.close()
        engine.dispose()
    return done, time.monotonic() - began


def admin(layout: Layout, out: TextIO, *args: str, show: bool = True) -> str:
    """Run ``gmd-admin ARGS`` on the demo's configuration, printed as an operator would type
    it (with GMD_CONFIG set), and its output; :class:`DemoError` when it fails."""
    env = {**os.environ, "GMD_CONFIG": str(layout.config)}
    shown = " ".join(a if re.fullmatch(r"[\w@%+=:,./-]+", a) else repr(a) for a in args)
    result = subprocess.run(
        [_tool("gmd-admin"), *args], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise DemoError(f"gmd-admin {shown} failed ({result.returncode}):\n{result.stderr}")
    if show:
        print(f"\n$ {typed('gmd-admin')} {shown}", file=out)
        out.write(result.stdout)
        if result.stderr.strip():
            out.write(result.stderr)
        out.flush()
    return result.stdout


def where_capped(plan_json: str) -> dict[str, dict[str, str]]:
    """Customer → host → whether its level's caps apply there and why, from ``enforce --plan
    --format json`` (one entry per host: the caps depend on the host, not the VM)."""
    out: dict[str, dict[str, str]] = {}
    for row in json.loads(plan_json)["plans"]:
        out.setdefault(str(row["customer"]), {})[str(row["host"])] = str(row["caps"])
    return out


def caps_walkthrough(customer: str, caps: dict[str, str]) -> str:
    """What ``enforce --plan`` showed of the customer's caps, in words."""
    if not caps:
        return f"  {customer} is not throttled: nothing is set on its VMs."
    applied = sorted(h for h, why in caps.items() if why.startswith("applied"))
    withheld = sorted(h for h, why in caps.items() if why.startswith("not applied"))
    if not applied and not withheld:
        return (
            f"  {customer}'s VMs get lower weights on every host ({', '.join(sorted(caps))});"
            " its level sets no hard cap."
        )

    def listed(hosts: list[str]) -> str:
        return "; ".join(f"{h} ({caps[h]})" for h in hosts)

    lines = [
        f"  {customer}'s VMs get lower weights on every host (they only bite where a host is"
        " busy); its hard caps apply only where the host is contended:"
    ]
    if applied:
        lines.append(f"  capped on {listed(applied)}")
    if withheld:
        lines.append(f"  not capped on {listed(withheld)}: a cap there would protect nobody")
    return "\n".join(lines)


# -- the whole demo ---------------------------------------------------------------------------


def run(
    root: Path,
    traces: Path = PACKAGED_TRACES,
    *,
    vms: str = "1-100",
    hosts: int = 4,
    days: float = 3.0,
    cores_per_host: float = 32.0,
    memory_per_host: float = 512 * 2**30,
    out: TextIO = sys.stdout,
    database_url: str | None = None,
) -> dict[str, object]:
    """The demo, start to end; returns its figures (for the tests and the README).
    ``database_url``: an empty database to grow the ledger in instead of the directory's
    SQLite file (the tests grow one on PostgreSQL too)."""
    began = time.monotonic()
    names = _traces_of(traces, vms)
    cloud = plan_cloud(names, hosts, days, cores_per_host=cores_per_host)
    check_coverage(traces, cloud, days)
    layout = prepare(root)
    port = free_port()
    write_configs(
        layout,
        cloud,
        traces.resolve(),
        port,
        memory_per_host=memory_per_host,
        database_url=database_url,
    )
    _say_cloud(out, names, cloud, layout, cores_per_host)
    ledger = "the ledger database given" if database_url else f"SQLite ledger {layout.ledger.name}"
    with daemon(layout, port):
        print(
            f"\n[1/4] gmd-daemon on 127.0.0.1:{port}, {ledger}"
            " (ingest only while the agents replay)",
            file=out,
            flush=True,
        )
        print(
            f"[2/4] {hosts} gmd-agent processes replay their VMs' traces"
            f" ({cloud.tick_s} s ticks, {cloud.interval_s} s intervals) as fast as they can",
            file=out,
            flush=True,
        )
        replay_s = replay(layout, cloud, port, out)
    print(
        f"[3/4] accounting {cloud.intervals} intervals; throttle levels decided after each"
        " (enforcement.mode = dry-run: recorded, not applied)",
        file=out,
        flush=True,
    )
    accounted, account_s = account(layout, cloud, out)
    print("[4/4] what the operators' commands say", file=out, flush=True)
    span = ("--from", iso(cloud.start_s), "--to", iso(cloud.end_s))
    greediest, caps = _operators_commands(layout, out, span)
    total_s = time.monotonic() - began
    command = typed("gmd-admin")
    print(
        f"\nDone in {total_s:.0f} s (replay {replay_s:.1f} s, accounting {account_s:.1f} s)."
        f" Look further with:\n  export GMD_CONFIG={layout.config}\n"
        f"  {command} report --group-by host {' '.join(span)}\n"
        f"  {command} explain acme\n"
        f"  {command} report --format csv {' '.join(span)} > report.csv",
        file=out,
        flush=True,
    )
    return {
        "vms": len(names),
        "hosts": hosts,
        "simulated_days": cloud.intervals * cloud.interval_s / DAY_S,
        "intervals": accounted,
        "batches": cloud.intervals * hosts,
        "replay_s": round(replay_s, 2),
        "accounting_s": round(account_s, 2),
        "total_s": round(total_s, 2),
        "greediest": greediest,
        "caps": caps.get(greediest, {}) if greediest is not None else {},
        "config": str(layout.config),
        "plot": str(layout.plot),
    }


def _traces_of(traces: Path, vms: str) -> list[str]:
    """The VMs' trace names of ``vms`` (``1-100``), each found in ``traces``; DemoError
    saying which is missing."""
    if not traces.is_dir():
        raise DemoError(
            f"no Bitbrains traces in {traces}: give --traces DIR (the N.csv or N.csv.gz files"
            " of GWA-T-12 Rnd)"
        )
    names = parse_traces(vms)
    for name in names:
        try:
            trace_file(traces, name)
        except TraceError as exc:
            raise DemoError(str(exc)) from None
    return names


def _say_cloud(
    out: TextIO, names: list[str], cloud: Cloud, layout: Layout, cores_per_host: float
) -> None:
    """The demo's first lines: what it replays, on what, and where its files are."""
    customers = sorted(set(cloud.owners.values()))
    hosts = len(cloud.hosts)
    small = ""
    if hosts > 1:
        first = cloud.hosts[0]
        small = f" ({first}: {cloud.cores[first]:g}, a small busy one)"
    print(
        f"gmd demo: {len(names)} Bitbrains VMs of {len(customers)} customers"
        f" ({', '.join(customers)}) on {hosts} simulated hosts of {cores_per_host:g} cores{small},"
        f" replaying the {cloud.intervals * cloud.interval_s / DAY_S:.3g} days up to"
        f" {iso(cloud.end_s)}\n  files: {layout.root} (configuration: {layout.config.name})",
        file=out,
        flush=True,
    )


def _operators_commands(
    layout: Layout, out: TextIO, span: tuple[str, ...]
) -> tuple[str | None, dict[str, dict[str, str]]]:
    """Step 4: what gmd-admin says of the replayed days (standings, reports, the greediest
    customer's explanation and actions, the plan, the plot); the greediest customer and where
    each customer is capped."""
    standings = admin(layout, out, "standings", "--format", "json", show=False)
    rows = json.loads(standings)["customers"]
    greediest = str(rows[0]["customer"]) if rows else None
    if rows and float(rows[0]["balance"]) <= 0:
        print(f"  (nobody's balance is positive: {greediest} is the least moderate)", file=out)
    admin(layout, out, "standings")
    admin(layout, out, "report", *span)
    admin(layout, out, "report", *span, "--group-by", "day")
    if greediest is not None:
        admin(layout, out, "explain", greediest)
        admin(layout, out, "actions", "--customer", greediest, "--limit", "12")
    admin(layout, out, "enforce", "--plan")
    caps = where_capped(admin(layout, out, "enforce", "--plan", "--format", "json", show=False))
    if greediest is not None:
        print(f"\n{caps_walkthrough(greediest, caps.get(greediest, {}))}", file=out, flush=True)
    admin(layout, out, "plot", *span, "-o", str(layout.plot))
    return greediest, caps
