"""gmd-agent: samples VMs through libvirt and pushes per-interval usage to the daemon.

Wiring only: the loop is :class:`gmd.agent.loop.AgentLoop`; ``/metrics`` and ``/healthz`` are
:mod:`gmd.agent.endpoints`.
With ``agent.collector = "replay"`` the host is simulated from recorded traces
(:mod:`gmd.agent.collect.replay`): the agent replays its simulated time span, then exits.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gmd.agent import reload
from gmd.agent.apply.state import EnforceBackend
from gmd.agent.client import DaemonClient, Delivery
from gmd.agent.collect.base import Collector
from gmd.agent.config import AgentConfig, CollectorKind, load_agent
from gmd.agent.endpoints import EndpointError, EndpointServer, TickHealth
from gmd.agent.loop import AgentLoop, dry_run_batch, new_key
from gmd.agent.metrics import AgentMetrics
from gmd.agent.sender import Sender
from gmd.agent.spool import Spool, SpoolError
from gmd.common import logs
from gmd.common.cli import ExitCode, LogLevelOption, fail, run, version_option
from gmd.common.config import DEFAULT_PATH, ConfigError
from gmd.common.timespec import iso
from gmd.wire import MAX_REPORT_RESULTS, PlanReport, VmApplyResult

if TYPE_CHECKING:
    from gmd.agent.apply.base import PlanApplier
    from gmd.agent.capabilities import HostProbe
    from gmd.agent.collect.replay import ReplayClock, ReplayCollector

log = logging.getLogger("gmd.agent")

app = typer.Typer(add_completion=False, rich_markup_mode=None)


class CheckFormat(StrEnum):
    """How ``--check`` prints the host's knobs."""

    table = "table"
    json = "json"


def _applier(config: AgentConfig) -> PlanApplier | None:
    """The configured applier (``agent.enforce_backend``), or None for "none"."""
    if config.enforce_backend == EnforceBackend.none:
        log.info("agent.enforce_backend = none: no throttling plan is fetched or applied")
        return None
    if config.collector == CollectorKind.replay:
        log.info("agent.collector = replay: the VMs are recorded traces, no plan is applied")
        return None
    from gmd.agent.apply.cgroup import CgroupApplier
    from gmd.agent.apply.cgroupfs import CgroupError
    from gmd.agent.apply.libvirt import LibvirtApplier
    from gmd.agent.apply.state import EnforcementStateError

    try:
        if config.enforce_backend == EnforceBackend.cgroup:
            return CgroupApplier(
                config.cgroup_root,
                config.cgroup_template,
                state_path=config.enforcement_state_path,
                libvirt_conn_or_uri=config.libvirt_uri,
                domains=config.domains,
            )
        return LibvirtApplier(
            config.libvirt_uri, state_path=config.enforcement_state_path, domains=config.domains
        )
    except (EnforcementStateError, CgroupError) as exc:
        raise fail(f"enforcement: {exc}", ExitCode.UNAVAILABLE) from None


def _libvirt_collector(config: AgentConfig) -> Collector:
    """The collector that reads the host through libvirt, from the registry
    (:mod:`gmd.agent.collectors`): the kernel's files for the counters
    (``agent.collector = "kernel"``, and ``"auto"`` where they can be read), else bulk stats
    (``"libvirt"``)."""
    from gmd.agent.collectors import CollectorUnavailable, host_collector

    try:
        collector, why = host_collector(config)
    except CollectorUnavailable as exc:
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None
    log.info("%s", why)
    log.info(
        "measuring and throttling %s%s",
        config.domains.words(),
        ""
        if config.domains.prefixes or config.domains.only_nova
        else " of libvirt's (agent.domain_prefixes and agent.only_nova limit them)",
    )
    return collector


def _replay_collector(config: AgentConfig) -> tuple[ReplayCollector, ReplayClock]:
    """The replay collector and its clock; exit 1 when the traces cannot be used."""
    from gmd.agent.replay_run import REPLAY_FAILURES, replay_from_config

    try:
        return replay_from_config(config)
    except REPLAY_FAILURES as exc:
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None


def _replay_key(config: AgentConfig, clock: ReplayClock) -> Callable[[str, int], str]:
    """The replay's deterministic batch keys (:func:`gmd.agent.replay_run.replay_key`);
    exit 1 when the traces cannot be read again to tell which replay this is."""
    from gmd.agent.replay_run import REPLAY_FAILURES, replay_id, replay_key

    try:
        return replay_key(replay_id(config, clock), clock)
    except REPLAY_FAILURES as exc:
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None


@app.command()
def agent(
    config_path: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="GMD_CONFIG",
            metavar="FILE",
            help="Configuration file (default /etc/gmd/gmd.toml); the [agent] section.",
        ),
    ] = None,
    once: Annotated[
        bool,
        typer.Option(
            "--once",
            help="Run one tick, then exit (with agent.collector = replay: replay the first"
            " interval).",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the batch one tick would send (two readings tick_s apart; with"
            " agent.collector = replay, the first replayed interval) as JSON on stdout; write"
            " and send nothing. Implies --once.",
        ),
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Probe which knobs this host can hold a VM to (CPU weight and cap, disk weight"
            " and limit, network limit), through agent.enforce_backend, and print them with"
            " the reason for each missing one; change nothing and exit. Exit 0 when the probe"
            " ran (the table says what is missing), 1 when the host cannot be probed. With"
            " --format json, the document the agent sends the daemon.",
        ),
    ] = False,
    output: Annotated[
        CheckFormat,
        typer.Option("--format", help="--check's output: table or json."),
    ] = CheckFormat.table,
    restore_all: Annotated[
        bool,
        typer.Option(
            "--restore-all",
            help="Put every VM gmd throttled back to the settings it had before (from"
            " agent.enforcement_state_path), then exit. For taking a host out of enforcement;"
            " a running agent would throttle them again at its next plan.",
        ),
    ] = False,
    log_level: LogLevelOption = logs.LogLevel.info,
    _version: Annotated[bool, version_option("gmd-agent")] = False,
) -> None:
    """Sample the VMs of this host through libvirt and send their use to gmd-daemon.

    Usage is measured every agent.tick_s, summed per agent.interval_s, spooled on disk and
    posted to agent.daemon_url; a spool left by a previous run is replayed first. Every
    agent.plan_every_s the host's throttling plan is fetched and applied (agent.enforce_backend);
    stopping the agent leaves throttled VMs as they are (the originals stay on disk for the next
    start; --restore-all puts them back). With agent.collector = replay the VMs are recorded
    traces replayed over simulated time (agent.replay_*), and the agent exits when the replay
    is done. SIGTERM stops it; SIGHUP reads the configuration again (the daemon, token, timeouts,
    post and plan timing, bandwidths change live; the log names what takes a restart). Exit codes:
    0 stopped cleanly (or the replay is done), 1 the host, the traces, the spool or the
    enforcement state cannot be used (or --restore-all left VMs unrestored, or a replay's batches
    were not all delivered), 2 bad configuration or option. Why it stopped is
    one line on stderr: gmd-agent: error: WHAT.
    \f
    For the reader, not --help (Click and Typer stop at the form feed): this function's length
    is its option declarations, each with its help text; what it does is the lines below,
    which hand each way of running to a function of its own.
    """
    logs.setup(log_level.value, quiet=("httpx",))
    try:
        config = load_agent(config_path)
    except ConfigError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    if restore_all:
        _restore_all(config)
        return
    if check:
        _check(config, output)
        return
    collector: Collector
    clock: ReplayClock | None = None
    replayed: ReplayCollector | None = None
    if config.collector == CollectorKind.replay:
        replayed, clock = _replay_collector(config)
        collector = replayed
    else:
        collector = _libvirt_collector(config)
    if dry_run:
        _dry_run(config, collector, replayed, clock)
    else:
        _serve(config, collector, clock, once=once)


def _host_probe(config: AgentConfig) -> HostProbe:
    from gmd.agent.capabilities import HostProbe

    return HostProbe(config.enforce_backend)


def _check(config: AgentConfig, output: CheckFormat) -> None:
    """--check: the host's knobs, probed now, printed; nothing changed."""
    from gmd.agent.capabilities import text_table

    if config.collector == CollectorKind.replay:
        raise fail(
            "agent.collector = replay: the VMs are recorded traces, there is no host to check"
        )
    applier = _applier(config) if config.enforce_backend != EnforceBackend.none else None
    names: list[str] = []
    uuids: list[str] = []
    try:
        if config.enforce_backend != EnforceBackend.none:
            names, uuids = _running(config)
        caps = _host_probe(config).through(applier, names, uuids)
    finally:
        if applier is not None:
            applier.close()
    if output == CheckFormat.json:
        print(caps.model_dump_json(indent=2))
        return
    where = f"a running VM's group ({names[0]})" if names else "the hierarchies' roots (no VM runs)"
    print(
        f"host {config.host}: backend {caps.backend}, cgroup {caps.cgroup}, probed in {where};"
        f" disks: {', '.join(f'{d} [{s}]' for d, s in caps.schedulers.items()) or 'none seen'}"
    )
    print(text_table(caps), end="")


def _running(config: AgentConfig) -> tuple[list[str], list[str]]:
    """The names and uuids of the running domains this agent may touch, from libvirt."""
    import libvirt

    from gmd.agent.libvirt_conn import open_connection, refused

    try:
        conn = open_connection(config.libvirt_uri, read_only=True)
    except libvirt.libvirtError as exc:
        raise fail(refused(config.libvirt_uri, exc), ExitCode.UNAVAILABLE) from None
    try:
        doms = conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
        kept = [d for d in doms if config.domains.admits_name(d.name())]
        return [d.name() for d in kept], [d.UUIDString() for d in kept]
    finally:
        conn.close()


def _restore_all(config: AgentConfig) -> None:
    """--restore-all: every VM gmd changed back to its saved settings; exit 1 if any is left."""
    applier = _applier(config)
    if applier is None:
        return
    try:
        results = applier.restore_all()
        left = applier.remembered
    finally:
        applier.close()
    for r in results:
        print(json.dumps(r.model_dump()))
    _report_restore(config, results, everything=not left)
    if left:
        raise fail(
            f"{len(left)} VM(s) could not be restored (still in"
            f" {config.enforcement_state_path}): {', '.join(sorted(left))}",
            ExitCode.UNAVAILABLE,
        )
    log.info("every VM gmd had changed is back to its original settings")


def _report_restore(config: AgentConfig, results: list[VmApplyResult], *, everything: bool) -> None:
    """Tell the daemon what --restore-all put back (``restore_all`` when it put back every VM
    gmd had changed), so that its log and standings stop counting them as throttled. The
    restore stands whether or not the daemon hears of it: a failure is a warning."""
    if config.daemon_url is None:
        log.warning(
            "agent.daemon_url is not set: the daemon was not told of the restore, and still"
            " counts these VMs as throttled until this host's agent reports again"
        )
        return
    client = DaemonClient(config.daemon_url, config.token, timeout_s=config.timeout_s)
    chunks = [
        results[k : k + MAX_REPORT_RESULTS] for k in range(0, len(results), MAX_REPORT_RESULTS)
    ]
    try:
        for k, chunk in enumerate(chunks or [[]]):
            last = k == max(len(chunks) - 1, 0)
            report = PlanReport(
                generated_s=int(time.time()), results=chunk, restore_all=everything and last
            )
            outcome = client.post_report(config.host, report)
            if outcome.kind != Delivery.delivered:
                break
    finally:
        client.close()
    if outcome.kind == Delivery.delivered:
        log.info("the restore is recorded in the daemon's enforcement log")
    else:
        log.warning(
            "the daemon was not told of the restore (%s%s): it counts these VMs as throttled"
            " until this host's agent reports again",
            f"HTTP {outcome.status}: " if outcome.status else "",
            outcome.detail,
        )


def _dry_run(
    config: AgentConfig,
    collector: Collector,
    replayed: ReplayCollector | None,
    clock: ReplayClock | None,
) -> None:
    """--dry-run: the batch one tick (or the first replayed interval) would send, on stdout."""
    try:
        if replayed is not None and clock is not None:
            from gmd.agent.replay_run import replay_dry_run

            doc = replay_dry_run(config, replayed, clock)
            span_s = float(config.interval_s)
        else:
            doc, span_s = dry_run_batch(config, collector)
    except RuntimeError as exc:
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None
    finally:
        collector.close()
    log.info(
        "dry run: %d VMs, use over %.2f s; nothing was sent or written", len(doc["vms"]), span_s
    )
    print(json.dumps(doc, indent=2))


def _serve(
    config: AgentConfig, collector: Collector, clock: ReplayClock | None, *, once: bool
) -> None:
    """The agent proper: spool, client and applier around the collector, then one tick, the
    replay, or ticks until SIGTERM; everything it opened is closed however it ends."""
    where = str(config.path) if config.path else f"{DEFAULT_PATH} (absent: all defaults)"
    if config.daemon_url is None:
        raise fail(f"{where}: agent.daemon_url is not set: where should batches go?")
    try:
        spool = Spool(
            config.spool_path,
            max_bytes=config.spool_max_bytes,
            max_batches=config.spool_max_batches,
        )
    except SpoolError as exc:
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None
    key = new_key if clock is None else _replay_key(config, clock)
    client = DaemonClient(config.daemon_url, config.token, timeout_s=config.timeout_s)
    metrics = AgentMetrics()
    try:
        applier = _applier(config)
    except typer.Exit:
        spool.close()
        client.close()
        collector.close()
        raise
    server = None
    reloader: AgentReloader | None = None
    try:
        runner = AgentLoop(
            config,
            collector,
            spool,
            Sender(spool, client),
            metrics,
            key=key,
            applier=applier,
            plans=client if applier is not None else None,
            probe=_host_probe(config) if applier is not None else None,
        )
        if once and clock is not None:
            clock.end_s = clock.start_s + config.interval_s
            _replay(runner, clock, None, once=True)
            return
        if once:
            report = runner.tick()
            if not report.reading.ok:
                raise fail(
                    "the tick could not read this host (the log above says why)",
                    ExitCode.UNAVAILABLE,
                )
            return
        if config.metrics_port:
            server = _endpoints(config, runner)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda _n, _f: stop.set())
        reloader = AgentReloader(runner)
        signal.signal(signal.SIGHUP, lambda _n, _f: reloader.start())
        _log_start(config, replaying=clock is not None, enforcing=applier is not None)
        if clock is not None:
            _replay(runner, clock, stop)
            return
        runner.run(stop)
        log.info("stopping: %d batches left in the spool for the next start", spool.size()[0])
    except SpoolError as exc:
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None
    finally:
        if server is not None:
            server.stop()
        spool.close()
        client.close()
        if reloader is not None:
            reloader.close()
        collector.close()
        if applier is not None:
            applier.close()


class AgentReloader:
    """SIGHUP's work, on a thread of its own: read the file again and put its live settings
    in force (:mod:`gmd.agent.reload`), one reload at a time, each said in the log. A client
    replaced is closed when the agent stops (a post may still be using it)."""

    def __init__(self, runner: AgentLoop) -> None:
        self.runner = runner
        self._lock = threading.Lock()
        self._old: list[DaemonClient] = []

    def start(self) -> None:
        threading.Thread(target=self.run, name="reload", daemon=True).start()

    def run(self) -> None:
        with self._lock:
            running = self.runner.config
            where = running.path or DEFAULT_PATH
            try:
                outcome = reload.plan(running, load_agent(running.path))
            except ConfigError as exc:
                log.error("SIGHUP: not reloaded, the running configuration stays: %s", exc)
                return
            c = outcome.config
            if c.daemon_url is None:
                log.error(
                    "SIGHUP: not reloaded, the running configuration stays: %s: agent.daemon_url"
                    " is not set: where should batches go?",
                    where,
                )
                return
            client = None
            if reload.CLIENT & set(outcome.applied):
                client = DaemonClient(c.daemon_url, c.token, timeout_s=c.timeout_s)
                if self.runner.sender is not None:
                    self._old.append(self.runner.sender.client)
            self.runner.reconfigure(outcome.config, client)
            log.info(
                "SIGHUP: reloaded %s: %s",
                where,
                ", ".join(f"agent.{k}" for k in outcome.applied) + " changed live"
                if outcome.applied
                else "no change",
            )
            if outcome.kept:
                log.warning(
                    "SIGHUP: %s changed in %s but take(s) a restart: the running value stays",
                    ", ".join(f"agent.{k}" for k in outcome.kept),
                    where,
                )

    def close(self) -> None:
        for client in self._old:
            client.close()


def _endpoints(config: AgentConfig, runner: AgentLoop) -> EndpointServer:
    """``/metrics`` and ``/healthz`` on ``agent.metrics_bind:metrics_port``; exit 1 if the
    port cannot be had."""
    try:
        return EndpointServer(
            config.metrics_bind, config.metrics_port, runner.metrics.registry, TickHealth(runner)
        )
    except EndpointError as exc:
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None


def _log_start(config: AgentConfig, *, replaying: bool, enforcing: bool) -> None:
    log.info(
        "gmd-agent for host %s: %s, tick %g s, interval %d s, daemon %s, spool %s,"
        " enforcement %s%s",
        config.host,
        f"replaying traces from {config.replay_dir}"
        if replaying
        else f"libvirt {config.libvirt_uri}",
        config.tick_s,
        config.interval_s,
        config.daemon_url,
        config.spool_path,
        f"through {config.enforce_backend} every {config.plan_every_s:g} s, state in"
        f" {config.enforcement_state_path}"
        if enforcing
        else "off",
        f", /metrics and /healthz on {config.metrics_bind}:{config.metrics_port}"
        if config.metrics_port
        else "",
    )


def _replay(
    runner: AgentLoop, clock: ReplayClock, stop: threading.Event | None, *, once: bool = False
) -> None:
    """Replay the clock's span through the agent; exit 1 if its spool is another run's or
    batches are left undelivered (a replay that silently misses intervals misleads).

    The replay's plan is recorded beside the spool before the first tick (not for --once), so
    that after a crash or SIGKILL the agent started again resumes where its spool left off; a
    replay an earlier run had finished has nothing left to tick, and exits 0 once the batches
    its spool still held are delivered."""
    from gmd.agent.replay_run import REPLAY_FAILURES, replay_run, save_plan

    try:
        if not clock.resumed and not once:
            save_plan(runner.config, clock)
        report = replay_run(runner, clock, stop=stop, resume=clock.resumed)
    except REPLAY_FAILURES as exc:
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None
    if report.finished_before:
        log.info(
            "the replay had already finished (simulated %s → %s, spool %s): nothing to replay",
            iso(report.start_s),
            iso(report.end_s),
            runner.spool.path,
        )
    else:
        log.info(
            "replay %s after %d ticks of simulated time (%.1f of %.1f hours%s): %d batches made",
            "stopped" if report.stopped else "done",
            report.ticks,
            (report.reached_s - report.start_s) / 3600,
            (report.end_s - report.start_s) / 3600,
            ""
            if report.resumed_s is None
            else f", resumed at {(report.resumed_s - report.start_s) / 3600:.1f}",
            report.batches,
        )
    if report.waiting:
        raise fail(
            f"{report.waiting} batches of the replay could not be delivered (the daemon did not"
            f" take them); they are kept in {runner.spool.path}",
            ExitCode.UNAVAILABLE,
        )


def main() -> None:
    run(app, "gmd-agent")


if __name__ == "__main__":
    main()
