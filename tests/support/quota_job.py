"""The quota job's daemon, shared by its tests against the real cloud and the fake one: a
configuration whose greedy customer reaches the quota level, and intervals that drive it there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from gmd.daemon.config import Config
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from tests.support.daemon_support import (
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    make_config,
)

HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)


def config_for(tmp_path: Path, mode: str, cloud: str = "fake", backend: str = "auto") -> Config:
    return make_config(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        {HOST.name: "operator"},
        accounting={"endowment": "equal", "half_life_s": 60},
        enforcement={
            "mode": mode,
            "enter": [0.15, 0.2, 0.8],
            "leave": [0.1, 0.15, 0.6],
            "dwell_s": 0,
            "quota_level": 2,
            "quota": {
                "cloud": cloud,
                "backend": backend,
                "floor_instances": 8,
                "timeout_s": 30 if cloud != "fake" else 2,
                "retries": 0,
            },
        },
        # The quotas are what is tested; the host is made up, not one of a cloud's.
        placement={"verify": "off"},
    )


def drive(
    config: Config,
    d: Any,
    a_cpu: list[float],
    first_ago: int,
    a: str = "proj-a",
    b: str = "proj-b",
) -> None:
    """Post intervals in which a's VM uses ``a_cpu[k]`` of 120 core-seconds and b's the rest,
    then account them (levels decided after each), and only them."""
    for k, cpu in enumerate(a_cpu):
        start = aligned_past(first_ago - k)
        body = batch(HOST, start, [cpu_only("vm-a", a, cpu), cpu_only("vm-b", b, 120 - cpu)])
        assert httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name)).is_success
    end = aligned_past(first_ago - len(a_cpu))
    account_due(d.engine, config.accounting, now_s=end, after=after_interval(config.enforcement))
