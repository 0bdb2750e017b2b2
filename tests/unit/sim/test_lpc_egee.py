"""SPAA Table 1 on the shipped four weeks of LPC-EGEE, as the reproductions' protocol runs it.

The protocol (docs/reproduction-protocol.toml, study ``spaa-shipped``) runs 16 one-day windows
on each of its 8 seeds, fixed before any run, through Ref and four policies. This test runs
them again and asserts:

- every window's Δψ/p is the value docs/reproduction-results.json holds, so the document's
  table (tests/repository/test_reproduction.py) is this code's;
- the paper's orderings that the pooled draws resolve, and only those: an ordering the
  protocol leaves unresolved is asserted by no test, and none rests on one seed.

The span (weeks 24-27 after the trace's first job; tests/data/pwa/README.md) keeps the
repository small; docs/reproduction.md has the whole trace.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gmd.sim.protocol import load_protocol
from gmd.sim.report import PaperVerdict, draws, pairs
from gmd.sim.reproduce import PROTOCOL, RESULTS, run_study

RESOLVED_AS_THE_PAPER = {
    ("ORIG_DIRECT", "FairShare"),
    ("ORIG_DIRECT", "UtFairShare"),
    ("ORIG_DIRECT", "RoundRobin"),
    ("FairShare", "RoundRobin"),
    ("UtFairShare", "RoundRobin"),
}
"""What the protocol's pooled draws on the shipped weeks settle, in the paper's direction."""


def test_the_shipped_weeks_give_the_protocols_values_and_orderings(tmp_path) -> None:
    protocol = load_protocol(PROTOCOL)
    study = protocol.study("spaa-shipped")
    assert len(study.seeds) >= 8
    runs = run_study(study, protocol, None, tmp_path, workers=2, say=lambda _line: None)
    stored = json.loads(RESULTS.read_text())["studies"]["spaa-shipped"]["runs"]
    assert [(r["seed"], r["policies"]) for r in runs] == [
        (r["seed"], r["policies"]) for r in stored
    ]
    for ours, theirs in zip(runs, stored, strict=True):
        assert ours["contended"] == theirs["contended"]
        assert np.allclose(
            np.array(ours["values"], dtype=float), np.array(theirs["values"], dtype=float),
            rtol=1e-8, atol=1e-9,
        )  # fmt: skip
    found = pairs(study, draws(runs), protocol)
    assert not [p for p in found if p.verdict == PaperVerdict.against]
    assert {(p.first, p.second) for p in found if p.verdict == PaperVerdict.as_paper} == (
        RESOLVED_AS_THE_PAPER
    )
    # the measure is against Ref, which every window ran: no policy is fairer than Ref itself
    values = draws(runs).values
    assert np.all(np.isfinite(values)) and np.all(values >= 0)


@pytest.mark.parametrize("study_id", ["falb-batch", "falb-stream"])
def test_falbs_primary_runs_are_the_results(study_id: str, tmp_path) -> None:
    """FALB with the paper's own inputs is deterministic: its makespans are exact."""
    protocol = load_protocol(PROTOCOL)
    (run,) = run_study(protocol.study(study_id), protocol, None, tmp_path, 1, lambda _l: None)
    (stored,) = json.loads(RESULTS.read_text())["studies"][study_id]["runs"]
    assert run == stored
