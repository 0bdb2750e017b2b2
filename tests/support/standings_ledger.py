"""The hand-worked ledger of gmd-admin's tests (its numbers are in the fixture's docstring): built
through the daemon's real API on each kind of database, read by gmd-admin's commands."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gmd.daemon.ledger.accounting import account_due
from tests.support.daemon_support import (
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
)

HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)


def last_interval(config: Path) -> int:
    """The start of the ledger's last accounted interval, as the fixture wrote it: a test that
    recomputed it from the clock would name the next interval once a minute had turned."""
    return int(config.with_name("last_interval").read_text())


@pytest.fixture
def ledger_config(database_url: str, tmp_path: Path) -> Path:
    """Two intervals on one 2-core host: a's VM uses 90 of 120 core-seconds, b's 30.

    Equal endowments: 60 each. CPU: a is over by 30, b under by 30, so κ = 1 and b is
    credited γ·30 = 15. One customer's share is 120/2 = 60 core-seconds, m = 4 resources
    (the idle ones add nothing): G_a = 30/(4·60) = 0.125, G_b = −15/240 = −0.0625 per
    interval; no decay, so balances 0.25 and −0.125. Work (ψ″): a 90/240 = 0.375 per interval,
    b 0.125; all on the operator's host, so priorities are −0.75 and −0.25.
    """
    path = tmp_path / "gmd.toml"
    path.write_text(
        f'[database]\nurl = "{database_url}"\n'
        '[accounting]\ninterval_s = 60\ngrace_s = 0\nendowment = "equal"\nhalf_life_s = "none"\n'
        "gamma = 0.5\n"
    )
    config = make_config(
        database_url,
        {HOST.name: "operator"},
        accounting={"endowment": "equal", "half_life_s": "none"},
    )
    with serving(config) as d:
        last = aligned_past(3)
        for start in (last - 60, last):
            body = batch(HOST, start, [cpu_only("vm-a", "a", 90.0), cpu_only("vm-b", "b", 30.0)])
            assert httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name)).is_success
        account_due(d.engine, config.accounting, now_s=last + 60)
    path.with_name("last_interval").write_text(str(last))
    return path
