"""``make cloud-protection``: does gmd protect a moderate project's work in a real OpenStack
cloud? The story of bench/protection.py told with Nova-booted guests, in words an operator reads.

In the small cloud of tests/scripts/nova_cloud.sh (Keystone, Placement, Glance, RabbitMQ, Nova
on libvirt/QEMU), acme's member boots three servers that spin their CPU and initech's member
one that runs a job of a known size again and again (tests/support/guest_image.py's ``job``
role: the guest prints each job's start and end on its console, which Nova keeps in the
instance's console.log). gmd-daemon (checking every batch against the cloud's Placement) and
gmd-agent run as on a compute host. Three phases on the same servers, gmd started anew for each
(tests/support/protection.py):

1. initech alone (acme's member has paused its servers through Nova): the job's own time;
2. acme's servers unpaused, gmd off: initech's job beside them;
3. the same, gmd on: when gmd throttled acme, and initech's job once it had.

    python -m tests.support.cloud_protection CLOUD_JSON [--dir DIR]

Exit codes: 0 the story was told; 1 a step did not happen (one line says which, and where its
log is).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from gmd.wire import PlanMode
from tests.support.cloud_story import server_action
from tests.support.nova_support import NovaCloud, Server
from tests.support.protection import (
    BOUND,
    Console,
    Host,
    Phase,
    PhaseResult,
    Vm,
    quantile,
    run_phase,
    stop_on_sigterm,
)
from tests.support.realvm import RealVMError, _libvirt

REPO = Path(__file__).resolve().parents[2]
GREEDY_SERVERS = 3
PHASES = (
    Phase("alone", 40, greedy=False),
    Phase("gmd-off", 90, greedy=True, mode=PlanMode.off),
    Phase("gmd-on", 150, greedy=True, protected_jobs=5, max_seconds=400),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.cloud_protection", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "cloud_json", type=Path, help="the cloud.json tests/scripts/nova_cloud.sh printed"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=REPO / "var" / "cloud-protection",
        help="where gmd's ledgers, configurations and logs go (default var/cloud-protection)",
    )
    args = parser.parse_args(argv)
    try:
        info = json.loads(args.cloud_json.read_text())
    except (OSError, ValueError) as exc:
        parser.error(f"cannot read {args.cloud_json}: {exc}")
    stop_on_sigterm()
    try:
        run(NovaCloud(info, Path(info["clouds_yaml"])), args.dir, sys.stdout)
    except (RealVMError, AssertionError, OSError, KeyError) as exc:
        print(f"\ncloud protection: {exc}", file=sys.stderr)
        return 1
    return 0


def run(nova: NovaCloud, root: Path, out: TextIO) -> dict[str, Any]:
    """Boots the servers, runs the three phases, says what they showed; returns the figures."""
    root.mkdir(parents=True, exist_ok=True)
    os.environ["OS_CLIENT_CONFIG_FILE"] = str(nova.clouds_yaml)

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    acme = nova.projects["acme"]
    say(
        f"gmd cloud protection: a real OpenStack cloud on this machine (Nova"
        f" {nova.info['compute_host']}, libvirt/QEMU, {os.cpu_count()} cores); files in {root}"
    )
    servers: list[Server] = []
    try:
        say("\n[1/4] project members boot servers through the Nova API")
        servers += [nova.boot("acme", "spin") for _ in range(GREEDY_SERVERS)]
        servers.append(nova.boot("initech", "job"))
        for s in servers:
            role = (
                "spins its CPU"
                if s.project == "acme"
                else "runs a job of a known size, rests 2 s, again"
            )
            say(f"  {s.project:<8} {s.name:<34} {role}")
        host = cloud_host(nova, servers, acme)
        console = Console(host.moderate)
        sections = placement(nova)
        results: dict[str, PhaseResult] = {}
        for phase in PHASES:
            results[phase.name] = run_phase(root, host, phase, console, sections=sections)
        figures = tell(results, say)
    finally:
        for s in servers:
            with contextlib.suppress(AssertionError):
                nova.delete(s)
    return figures


def cloud_host(nova: NovaCloud, servers: list[Server], greedy_project: str) -> Host:
    """The compute host as tests/support/protection.py runs it: acme's servers paused and
    unpaused by acme's member through Nova, initech's job read from Nova's console.log."""
    instances = Path(nova.info["run"]) / "instances"
    vms = {s.domain: Vm(s.domain, instances / s.id / "console.log") for s in servers}
    by_domain = {s.domain: s for s in servers}
    libvirt = _libvirt()

    def switch(guest: Vm, running: bool) -> None:
        server = by_domain[guest.name]
        server_action(nova, server.id, server.project, "unpause" if running else "pause")
        conn = libvirt.open(nova.info["libvirt_uri"])
        try:
            dom = conn.lookupByName(guest.name)
            deadline = time.monotonic() + 60
            while (dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING) != running:
                if time.monotonic() > deadline:
                    raise RealVMError(f"Nova did not {'un' if running else ''}pause {server.name}")
                time.sleep(0.2)
        finally:
            conn.close()

    for s in servers:
        if s.project == "acme":
            switch(vms[s.domain], False)
    return Host(
        uri=nova.info["libvirt_uri"],
        greedy=tuple(vms[s.domain] for s in servers if s.project == "acme"),
        moderate=tuple(vms[s.domain] for s in servers if s.project != "acme"),
        greedy_project=greedy_project,
        name=nova.info["compute_host"],
        domain_prefixes=(nova.domain_prefix,),
        switch=switch,
    )


def placement(nova: NovaCloud) -> dict[str, Any]:
    """``[placement]``: every batch of the compute host checked against the cloud's Placement."""
    info = nova.info
    return {
        "placement": {
            "verify": "on",
            "cloud": "admin",
            "refresh_s": 5,
            "providers": {info["compute_host"]: info["hypervisor_hostname"]},
        }
    }


def tell(results: dict[str, PhaseResult], say: Any) -> dict[str, Any]:
    alone, off, on = (results[p.name] for p in PHASES)
    if not alone.jobs:
        raise RealVMError("initech's server completed no job alone: see its console.log")
    base = statistics.median(j.seconds for j in alone.jobs)
    off_r = off.ratios(base)
    top = on.max_level
    on_r = on.ratios(base, at_level=top) if top else []
    cores = os.cpu_count() or 1

    def share(r: PhaseResult, project: str) -> str:
        return f"{r.cores.get(project, 0.0) / cores:.0%}"

    initech = next(p for p in on.cores if p != "greedy")
    say(
        f"\n[2/4] initech alone (acme's member paused its servers): its job takes {base:.2f} s"
        f" (median of {len(alone.jobs)})"
    )
    say(
        f"\n[3/4] acme's servers running, gmd off: initech's job takes"
        f" {_times(off_r, base)}; acme took {share(off, 'greedy')} of the host, initech"
        f" {share(off, initech)}"
    )
    throttled = (
        f"gmd throttled acme {on.first_throttle_s:.0f} s after its servers started"
        if on.first_throttle_s is not None
        else "gmd never throttled acme"
    )
    capped = f", capped it at {on.first_cap_s:.0f} s" if on.first_cap_s is not None else ""
    say(
        f"\n[4/4] the same, gmd on: {throttled}{capped} (level {on.max_level} at most);"
        f" while acme stood at level {top}, initech's job took {_times(on_r, base)}; acme took"
        f" {share(on, 'greedy')} of the host over the phase (the weights are work-conserving:"
        " acme keeps what initech leaves between its jobs)"
    )
    off_m = statistics.median(off_r) if off_r else None
    on_m = statistics.median(on_r) if on_r else None
    if off_m is not None and on_m is not None:
        verdict = "within" if on_m <= BOUND else "beyond"
        say(
            f"\nIn words: beside acme's {GREEDY_SERVERS} spinning servers, initech's job took"
            f" {off_m:.1f}× as long as alone with gmd off, and {on_m:.2f}× with gmd on ({verdict}"
            f" the {BOUND}× gmd aims for)."
        )
    return {
        "alone_job_s": round(base, 3),
        "off_ratio_median": None if off_m is None else round(off_m, 3),
        "on_ratio_median": None if on_m is None else round(on_m, 3),
        "first_throttle_s": on.first_throttle_s,
        "first_cap_s": on.first_cap_s,
    }


def _times(ratios: list[float], base: float) -> str:
    if not ratios:
        return "(no job completed)"
    median = statistics.median(ratios)
    p90 = quantile(ratios, 0.9) or median
    return f"{median * base:.2f} s, {median:.2f}× as long (p90 {p90:.2f}×, {len(ratios)} jobs)"


if __name__ == "__main__":
    sys.exit(main())
