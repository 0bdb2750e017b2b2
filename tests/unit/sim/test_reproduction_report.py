"""The reproductions' protocol and tables (gmd.sim.protocol, gmd.sim.report) on draws made here.

Verdicts must follow the intervals, a flip between seeds must show, and a protocol that would
let a claim rest on a lucky seed (fewer than 8 seeds, a small bootstrap) is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gmd.sim.measures import pairwise_scores
from gmd.sim.protocol import load_protocol, parse_protocol
from gmd.sim.report import PaperVerdict, _points, draws, filled, marker_names, pairs
from gmd.sim.reproduce import REPO
from gmd.sim.workload import Deal, deal_jobs

DIGEST = "0" * 64


def protocol_text(**head: Any) -> dict[str, Any]:
    seeds = head.pop("seeds", {"first": 1, "count": 8})
    return {
        "protocol": {"fixed": "2026-12-07", "seeds": seeds, "resamples": 10_000,
                     "bootstrap_seed": 3, **head},
        "traces": {"t.swf.gz": DIGEST},
        "spaa": {
            "trace": "t.swf.gz", "windows": 20, "window_s": 3600, "orgs": 3,
            "total_processors": 6, "policies": ["A", "B", "C"],
            "paper": {"A": 1, "B": 2, "C": 2},
            "study": [{"id": "s"}],
        },
    }  # fmt: skip


def runs_with(effect_per_seed: list[float], n: int = 30) -> list[dict[str, Any]]:
    """Per seed, n contended draws: A = noise, B = A + effect (B worse when effect > 0), C = A."""
    out = []
    for i, effect in enumerate(effect_per_seed):
        rng = np.random.default_rng(i)
        a = rng.exponential(10.0, n)
        b = a + effect + rng.normal(0.0, 1.0, n)
        values = np.stack([a, b, a + rng.normal(0.0, 1.0, n)], axis=1).tolist()
        out.append({"policies": ["A", "B", "C"], "values": values, "contended": [True] * n,
                    "seed": i + 1, "trace": "t.swf.gz"})  # fmt: skip
    return out


def test_verdicts_follow_the_intervals_and_the_paper() -> None:
    protocol = parse_protocol(protocol_text(), DIGEST)
    study = protocol.study("s")
    as_paper = {(p.first, p.second): p for p in pairs(study, draws(runs_with([5.0] * 8)), protocol)}
    assert as_paper["A", "B"].verdict == PaperVerdict.as_paper
    assert as_paper["A", "B"].seeds_as == 8 and as_paper["A", "B"].seeds_against == 0
    tied = as_paper.get(("B", "C")) or as_paper["C", "B"]
    assert tied.paper_sign == 0 and tied.verdict == PaperVerdict.tie  # the paper gives both 2
    against = {(p.first, p.second): p for p in pairs(study, draws(runs_with([-5.0] * 8)), protocol)}
    assert against["A", "B"].verdict == PaperVerdict.against and against["A", "B"].advantage < 0
    noise = {(p.first, p.second): p for p in pairs(study, draws(runs_with([0.0] * 8)), protocol)}
    assert noise["A", "C"].paper_sign == 1
    assert noise["A", "C"].verdict == PaperVerdict.unresolved


def test_a_flip_between_seeds_shows_even_when_the_pool_resolves() -> None:
    protocol = parse_protocol(protocol_text(), DIGEST)
    found = pairs(protocol.study("s"), draws(runs_with([8.0] * 6 + [-8.0] * 2)), protocol)
    ab = next(p for p in found if (p.first, p.second) == ("A", "B"))
    assert ab.seeds_as == 6 and ab.seeds_against == 2
    assert ab.verdict == PaperVerdict.as_paper


def test_uncontended_draws_are_left_out_of_the_intervals() -> None:
    protocol = parse_protocol(protocol_text(), DIGEST)
    runs = runs_with([5.0] * 8)
    for run in runs:
        run["values"] += [[0.0, 0.0, 0.0]] * 50
        run["contended"] += [False] * 50
    (ab, *_rest) = pairs(protocol.study("s"), draws(runs), protocol)
    assert ab.draws == 8 * 30


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seeds": [1, 2, 3]}, "the protocol needs 8"),
        ({"resamples": 2000}, "at least 10000"),
    ],
)
def test_a_protocol_that_could_rest_on_luck_is_refused(change: dict, message: str) -> None:
    raw = protocol_text()
    raw["protocol"].update(change)
    with pytest.raises(ValueError, match=message):
        parse_protocol(raw, DIGEST)


def test_a_trace_without_a_digest_or_a_paper_figure_of_no_policy_is_refused() -> None:
    raw = protocol_text()
    raw["spaa"]["trace"] = "other.swf.gz"
    with pytest.raises(ValueError, match="no digest"):
        parse_protocol(raw, DIGEST)
    raw = protocol_text()
    raw["spaa"]["study"] = [{"id": "s", "paper": {"Z": 1}}]
    with pytest.raises(ValueError, match="does not run"):
        parse_protocol(raw, DIGEST)


def test_points_are_cloudshares_pairwise_wins() -> None:
    rng = np.random.default_rng(5)
    values = rng.integers(0, 4, (40, 3)).astype(float)
    values[3, 1] = np.nan  # an unmeasured value scores nothing
    runs = [{"policies": ["A", "B", "C"], "values": values.tolist(), "contended": [True] * 40,
             "seed": 1, "trace": "t"}]  # fmt: skip
    ours = _points(draws(runs), np.ones(40, dtype=bool))
    expected = {"A": 0, "B": 0, "C": 0}
    for row in values:
        for name, score in pairwise_scores(dict(zip("ABC", row.tolist(), strict=True))).items():
            expected[name] += score
    assert ours == expected


def test_markers_are_filled_and_a_missing_one_is_named() -> None:
    doc = "a\n<!-- reproduce:x -->\nold\n<!-- /reproduce:x -->\nb\n"
    assert marker_names(doc) == ["x"]
    assert filled(doc, {"x": "new"}) == "a\n<!-- reproduce:x -->\nnew\n<!-- /reproduce:x -->\nb\n"
    with pytest.raises(ValueError, match="no marker"):
        filled(doc, {"x": "new", "y": "more"})


def test_deals_keep_a_users_jobs_together_or_balance_the_jobs() -> None:
    users = np.repeat(np.arange(7), [30, 1, 1, 2, 5, 5, 6])
    for deal in (Deal.users, Deal.independent_users):
        orgs = deal_jobs(users, 3, 11, deal)
        for u in range(7):
            assert len(set(orgs[users == u].tolist())) == 1, deal  # a user's jobs stay together
    balanced = np.bincount(deal_jobs(users, 3, 11, Deal.users)[np.unique(users, True)[1]])
    assert balanced.max() - balanced.min() <= 1  # users dealt round-robin
    jobs = np.bincount(deal_jobs(users, 3, 11, Deal.jobs), minlength=3)
    assert jobs.max() - jobs.min() <= 1 and jobs.sum() == users.size
    assert len(set(deal_jobs(users, 3, 11, Deal.jobs)[users == 0].tolist())) > 1


def test_the_bonferroni_column_never_resolves_what_the_interval_does_not() -> None:
    protocol = parse_protocol(protocol_text(), DIGEST)
    study = protocol.study("s")
    seen = set()
    for effect in (0.0, 0.3, 0.6, 1.0, 5.0):
        for p in pairs(study, draws(runs_with([effect] * 8)), protocol):
            assert not (p.corrected and not p.resolved)
            seen.add((p.resolved, p.corrected))
    assert (True, True) in seen and (False, False) in seen


def test_the_digest_is_of_the_protocols_data_not_its_comments(tmp_path) -> None:
    text = (REPO / "docs" / "reproduction-protocol.toml").read_text()
    (tmp_path / "a.toml").write_text(text)
    (tmp_path / "b.toml").write_text("# a comment more\n" + text)
    (tmp_path / "c.toml").write_text(text.replace("resamples = 10000", "resamples = 10001"))
    a, b, c = (load_protocol(tmp_path / f"{n}.toml").digest for n in "abc")
    assert a == b != c
