"""The federation's soak (issue 44): gmd-broker processes over a private ZooKeeper ensemble,
under faults drawn from a fixed seed (brokers killed and paused, the ensemble's leader killed
and a follower stopped), against the oracle of tests/support/soak_federation.py: every
accepted request counted once, none lost but those the site-lost rule removes by design, none
run twice but a lost site's.

The schedule is drawn before the run starts, and the test first checks that it meets every
kind of fault more than once, so that a run that met none cannot pass for one that met them
all. The oracle itself is checked first on evidence made by hand, where it must name each
violation (no processes: not part of the soak)."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path

import pytest

from gmd.ledger_schema import migrate
from tests.support.soak import Service
from tests.support.soak_federation import (
    HOME,
    Federation,
    FedKind,
    Site,
    Submitted,
    Window,
    draw,
    figures,
    site_names,
    soak_federation,
)

SEED = 11
"""drawn: 20 faults, 5 of each kind; home killed three times and paused past its session
(before the inbox's mend, this seed lost a request home held while ZooKeeper had no quorum)"""
SECONDS = 150.0


@pytest.mark.soak
@pytest.mark.deadline  # 2 s sessions: starved by the busy tier, runs repeated no fault explains
def test_every_federation_request_is_counted_once_under_drawn_faults(tmp_path: Path) -> None:
    drawn = draw(SEED, SECONDS, site_names(3))
    kinds = Counter(f.kind for f in drawn)
    assert all(kinds[k] >= 2 for k in FedKind), kinds

    run = soak_federation(tmp_path / "fed", SEED, SECONDS, say=lambda _m: None)
    try:
        found = run.fed.check()
    finally:
        run.fed.teardown()
    result = figures(run, found)
    print(json.dumps({k: v for k, v in result.items() if k != "trail"}))
    if found.zookeeper_rolled_back:
        # Not gmd's to pass or fail: exactly once rests on ZooKeeper keeping what it
        # acknowledged (docs/federation.md). Said, with the evidence, rather than failed.
        pytest.skip(
            "ZooKeeper lost writes it had acknowledged (see"
            " tests/support/soak_federation.py): this run says nothing of gmd\n"
            + json.dumps(result, indent=1)
        )
    assert run.faults == drawn
    assert found.requests_accepted == found.requests_submitted > 60
    assert found.requests_completed >= found.requests_accepted // 2
    assert found.violations == 0, json.dumps(result, indent=1)


def test_the_oracle_names_each_violation_and_allows_what_a_lost_site_allows(
    tmp_path: Path,
) -> None:
    t = 1_000_000.0
    fed = Federation(tmp_path, contextlib.ExitStack())
    fed.began = t
    for name in site_names(3):
        d = tmp_path / name
        d.mkdir()
        url = f"sqlite:///{d / 'ledger.db'}"
        migrate.upgrade(migrate.engine_for(url))
        fed.sites[name] = Site(name, 0.0, d, d / "gmd.toml", url, Service(d, "broker", ["true"]))
    fed.submitted = [Submitted(f"q{k}", t + k, t + k + 0.3, True) for k in range(1, 11)]
    journal = [
        ("lend-1", "q1", "start"), ("lend-1", "q1", "end"),
        ("lend-1", "q2", "start"), ("lend-1", "q2", "end"),
        ("lend-1", "q6", "start"),  # line 4: lend-1 paused past its session meanwhile
        ("lend-2", "q6", "start"), ("lend-2", "q6", "end"),
        ("lend-1", "q7", "start"),  # line 7: no fault explains the second start
        ("lend-2", "q7", "start"), ("lend-2", "q7", "end"),
        ("lend-1", "q8", "start"), ("lend-1", "q8", "end"),
        ("lend-2", "q8", "start"),  # line 12: no fault drawn, but lend-2 requeued it
    ]  # fmt: skip
    fed.journal.write_text("".join(" ".join(line) + "\n" for line in journal))
    fed.windows = [
        Window(FedKind.broker_kill, HOME, t + 4.5, 0, t + 10.0, 0),
        Window(FedKind.broker_pause, "lend-1", t + 20.0, 4, t + 25.0, 5),
        Window(FedKind.broker_pause, "lend-2", t + 30.0, 7, t + 30.5, 8),  # within its session
        Window(FedKind.broker_pause, HOME, t + 40.0, 12, t + 45.0, 12),
    ]
    rows: dict[str, list[tuple[str, str, float, int | None, bool | None]]] = {
        "home": [
            ("published", "q4", t + 4.4, None, None),  # before home was killed
            ("published", "q5", t + 11.0, None, None),  # by the next process: not removable
            ("published", "q10", t + 45.2, None, None),  # known after the pause: made before
        ],
        "lend-1": [
            ("completed", "q1", t + 12, 1, True),
            ("completed", "q2", t + 13, 2, True),
            ("completed", "q7", t + 14, 3, False),
            ("completed", "q8", t + 15, 4, None),
            ("requeued", "q7", t + 14.5, None, None),  # its own: says nothing of a lost site
        ],
        "lend-2": [
            ("completed", "q2", t + 13, 1, True),
            ("removed", "q4", t + 7.0, None, None),
            ("removed", "q5", t + 12.0, None, None),
            ("removed", "q10", t + 43.0, None, None),  # while home was frozen
            ("completed", "q6", t + 16, 2, True),
            ("completed", "q7", t + 17, 3, True),
            ("completed", "q9", t + 18, 4, True),
            ("requeued", "q8", t + 19, None, None),  # ZooKeeper lost lend-1: the rule moved it
        ],
    }  # fmt: skip
    for name, events in rows.items():
        engine = migrate.engine_for(fed.sites[name].ledger)
        with engine.begin() as c:
            for choice, rid, at_s, seq, counted in events:
                c.exec_driver_sql(
                    "INSERT INTO federation_events (at_s, site, choice, request, org,"
                    " request_site, cores, core_seconds, seq, counted)"
                    " VALUES (?, ?, ?, ?, 'org-home', 'home', 1, 0, ?, ?)",
                    (at_s, name, choice, rid, seq, counted),
                )
        engine.dispose()
    (fed.sites["lend-2"].dir / "broker.log").write_text(
        "x INFO gmd.broker.broker: lend-2: completed q6 (org-home of home)\n" * 2
    )
    found = fed.check()
    assert found.requests_accepted == 10 and found.requests_completed == 5
    assert [d.split(":")[0] for d in found.doubled] == ["q2", "q6"]
    assert found.removed_allowed == ["q10", "q4"]  # published before home was lost
    assert [x.split(":")[0] for x in found.lost] == ["q3", "q5", "q8"]
    assert found.runs_repeated_allowed == 2
    assert found.runs_repeated_lost_undrawn == [
        "q8: at lend-1 (journal line 10), requeued by lend-2, then at lend-2 (line 12)"
    ]
    assert [x.split(":")[0] for x in found.runs_repeated_unexplained] == ["q7"]
    assert found.unsettled == ["lend-1 #4 q8"]
    assert found.counted_unrun == ["q2: counted by lend-2", "q9: counted by lend-2"]
    assert found.violations == 2 + 3 + 1 + 1 + 2
