"""The short soak (issue 44): gmd's real processes under faults drawn from fixed seeds, against
the oracle of tests/support/soak.py. The long one is ``make soak`` (docs/benchmarks.md).

Each run's schedule is drawn before it starts, and the test first checks that the draw covers
many kinds of faults, so that a run that met none cannot pass for one that met them all.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.soak import (
    INTERVAL_S,
    Backend,
    can_fill_disks,
    check,
    draw,
    figures,
    kinds_for,
    soak,
    teardown,
)

pytestmark = pytest.mark.soak

RUNS = [
    pytest.param(Backend.postgres, 11, 150.0, id="postgres"),
    pytest.param(Backend.sqlite, 12, 120.0, id="sqlite"),
]


@pytest.mark.parametrize(("backend", "seed", "seconds"), RUNS)
def test_nothing_is_lost_or_counted_twice_and_every_figure_recomputes_under_drawn_faults(
    tmp_path: Path, backend: Backend, seed: int, seconds: float
) -> None:
    if backend is Backend.postgres and not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        pytest.skip("no PostgreSQL server installed (make test's bootstrap installs it)")
    if shutil.which("runuser") is None and os.geteuid() == 0:
        pytest.skip("no runuser to start PostgreSQL as its own user")
    daemons = 2 if backend is Backend.postgres else 1
    kinds = kinds_for(backend, can_fill_disks())
    hosts = [f"soak-{h}" for h in range(3)]
    drawn = draw(seed, seconds, kinds, hosts, daemons)
    assert len({f.kind for f in drawn}) >= 5, [f.kind for f in drawn]

    run = soak(tmp_path / "run", seed, seconds, backend, say=lambda _m: None)
    try:
        found = check(run)
    finally:
        teardown(run.world)
    result = figures(run, found, 0.0)
    assert run.faults == drawn  # the schedule was the one drawn above
    print(json.dumps({k: v for k, v in result.items() if k != "reproduce"}))
    assert found.samples_expected == 12 * ((run.world.end_s - run.world.start_s) // INTERVAL_S)
    assert found.figures_checked > 0
    assert found.violations == 0, json.dumps(result.get("examples"), indent=1)
