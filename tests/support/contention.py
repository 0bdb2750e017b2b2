"""The two hosts of the work-conserving caps' tests (the numbers are in
tests/unit/daemon/enforce/test_contention.py): the daemon's configuration, the VMs each host
runs, and posting, accounting and fetching a host's plan through the daemon's real API."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx

from gmd.daemon.config import Config
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from gmd.wire import HostPlan
from tests.support.appliers import UUID_A
from tests.support.daemon_support import (
    INTERVAL_S,
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    token_of,
)

BUSY = HostSpec("cmp-busy", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
IDLE = HostSpec("cmp-idle", cpu_cores=16, memory_bytes=64e9, disk_bytes_per_s=1e6)
DISK_CAP = 200_000


def write_config(path: Path, url: str, mode: str = "on") -> Path:
    hosts = "".join(
        f'[hosts."{h.name}"]\nowner = "operator"\n'
        f'token_sha256 = "{hashlib.sha256(token_of(h.name).encode()).hexdigest()}"\n'
        for h in (BUSY, IDLE)
    )
    path.write_text(
        f'[database]\nurl = "{url}"\n'
        f"[accounting]\ninterval_s = {INTERVAL_S}\ngrace_s = 0\n"
        'endowment = "equal"\nhalf_life_s = "none"\n'
        f'[enforcement]\nmode = "{mode}"\n'
        "enter = [0.01, 0.02, 100]\nleave = [0.005, 0.015, 90]\ndwell_s = 0\nmax_step = 1\n"
        "weight_factors = [0.5, 0.25, 0.1]\ncap_level = 2\ncpu_cap_fractions = [1.0, 0.5, 0.5]\n"
        f"disk_caps_bytes_per_s = [0, {DISK_CAP}, {DISK_CAP}]\nquota_level = 4\n"
        "contended_above = 0.8\ncontention_intervals = 3\n" + hosts
    )
    return path


def busy_vms(a_cpu_s: float = 90.0, b_cpu_s: float = 30.0) -> list[dict[str, Any]]:
    return [
        cpu_only(UUID_A, "a", a_cpu_s, vcpus=2.0),
        cpu_only("vm-b", "b", b_cpu_s, vcpus=2.0),
    ]


def idle_vms(
    read_bytes: float = 48e6, b_read_bytes: float = 6e6, b_cpu_s: float = 0.0
) -> list[dict[str, Any]]:
    """a's VM reads most of the disk, b's some of it: with ``others_above`` = 5 %, a's disk
    cap has someone to protect (b's 10 %)."""
    vm = cpu_only("vm-a2", "a", 60.0, vcpus=4.0)
    vm["disk_read_bytes"] = read_bytes
    other = cpu_only("vm-b2", "b", b_cpu_s, vcpus=1.0)
    other["disk_read_bytes"] = b_read_bytes
    return [vm, other]


def post(d: Any, host: HostSpec, start: int, vms: list[dict[str, Any]]) -> None:
    r = httpx.post(f"{d.url}/v1/samples", json=batch(host, start, vms), headers=auth(host.name))
    assert r.is_success, r.text


def account(d: Any, config: Config, now_s: int) -> None:
    account_due(d.engine, config.accounting, now_s=now_s, after=after_interval(config.enforcement))


def fetch(d: Any, host: HostSpec) -> HostPlan:
    r = httpx.get(f"{d.url}/v1/plan/{host.name}", headers=auth(host.name))
    assert r.status_code == 200, r.text
    return HostPlan.model_validate_json(r.content)


FIRST = aligned_past(8)
