"""The simulator's model of CloudShare's brokers (gmd.sim.federation) on sequences small enough
to check by hand: the choice rule, the threshold, a local submit's fate (run here only when it
fits and no task waits), the site-lost rule (requeued as if just submitted), a failed run
requeued, what the log names, what a completion counts, the order at one instant, and a whole
scenario's log and summaries."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from gmd.sim.federation import (
    Choice,
    Decision,
    Event,
    FederationModel,
    Request,
    Site,
    SiteLost,
    Submit,
    Summary,
    entry_name,
    replay,
)


def log(decisions: Sequence[Decision]) -> list[tuple[float, str, str, str]]:
    return [(d.at_s, str(d.choice), d.request, d.site) for d in decisions]


def test_the_higher_priority_organisation_first_then_its_oldest_request() -> None:
    """The taker is busy until 5 while four requests queue. org-rich (+10) goes before
    org-poor (−10) though poor1 waited longest; of org-rich's, rich1 (submitted at 2) before
    rich2 (at 3) though rich2 was published first; twin1 and twin2 (same organisation and
    submission time) go in publish order."""
    sites = [Site("p", "org-p", 0), Site("t", "org-t", 1)]
    seeds = {"org-rich": Summary("org-rich", 10, 0), "org-poor": Summary("org-poor", 0, 10)}
    events = [
        Submit(0, Request("block", "org-t", "t", 1, 5, 0)),
        Submit(0, Request("poor1", "org-poor", "p", 1, 1, 1)),
        Submit(0, Request("rich2", "org-rich", "p", 1, 1, 3)),
        Submit(0, Request("rich1", "org-rich", "p", 1, 1, 2)),
        Submit(0, Request("twin2", "org-poor", "p", 1, 1, 4)),
        Submit(0, Request("twin1", "org-poor", "p", 1, 1, 4)),
    ]
    out = replay(sites, events, seeds)
    took = [(d.at_s, d.request) for d in out.decisions if d.choice == Choice.took]
    assert took == [(5, "rich1"), (6, "rich2"), (7, "poor1"), (8, "twin2"), (9, "twin1")]
    # org-t lent 5 core-seconds: 2 to org-rich, 3 to org-poor
    assert out.summaries["org-t"] == Summary("org-t", 5, 0)
    assert out.summaries["org-rich"] == Summary("org-rich", 10, 2)
    assert out.summaries["org-poor"] == Summary("org-poor", 0, 13)


def test_priorities_change_at_completion_and_the_next_take_reads_them() -> None:
    """org-x (+1) leads org-y (0) until the taker completes x1 (2 core-seconds: org-x −1),
    then org-y's y1 goes before x2."""
    sites = [Site("p", "org-p", 0), Site("t", "org-t", 1)]
    seeds = {"org-x": Summary("org-x", 1, 0)}
    events = [
        Submit(0, Request("block", "org-t", "t", 1, 1, 0)),
        Submit(0, Request("x1", "org-x", "p", 1, 2, 0)),
        Submit(0, Request("x2", "org-x", "p", 1, 1, 1)),
        Submit(0, Request("y1", "org-y", "p", 1, 1, 2)),
    ]
    out = replay(sites, events, seeds)
    took = [(d.at_s, d.request) for d in out.decisions if d.choice == Choice.took]
    assert took == [(1, "x1"), (3, "y1"), (4, "x2")]


def test_the_threshold_stops_taking() -> None:
    """c offers 2 cores with threshold 0.5: it takes while idle only, one request at a time
    though a second would fit."""
    sites = [Site("p", "org-p", 0), Site("c", "org-c", 2, threshold=0.5)]
    events = [
        Submit(0, Request("f1", "org-p", "p", 1, 4, 0)),
        Submit(0, Request("f2", "org-p", "p", 1, 4, 1)),
    ]
    out = replay(sites, events)
    assert log(out.decisions) == [
        (0, "published", "f1", "p"),
        (0, "took", "f1", "c"),
        (0, "published", "f2", "p"),  # one core free, but the reservation is 0.5
        (4, "completed", "f1", "c"),
        (4, "took", "f2", "c"),
        (8, "completed", "f2", "c"),
    ]


def test_a_local_submit_that_fits_is_published_while_a_fitting_request_waits() -> None:
    """The paper's event 1: "if there is enough capacity and no other tasks are waiting". c's
    own request fits its free core at 1, but f2 (1 core) waits: own is published, and the
    free capacity goes by priority. At 4 c completes f1 (org-c +4, org-p −4) and takes its
    own request back (org-c's priority), not f2, though f2's entry is older; that completion
    counts nothing."""
    sites = [Site("p", "org-p", 0), Site("c", "org-c", 2, threshold=0.5)]
    events = [
        Submit(0, Request("f1", "org-p", "p", 1, 4, 0)),
        Submit(0, Request("f2", "org-p", "p", 1, 4, 1)),
        Submit(1, Request("own", "org-c", "c", 1, 1, 1)),
    ]
    out = replay(sites, events)
    assert log(out.decisions) == [
        (0, "published", "f1", "p"),
        (0, "took", "f1", "c"),
        (0, "published", "f2", "p"),
        (1, "published", "own", "c"),  # it fits, but f2 waits
        (4, "completed", "f1", "c"),
        (4, "took", "own", "c"),
        (5, "completed", "own", "c"),
        (5, "took", "f2", "c"),
        (9, "completed", "f2", "c"),
    ]
    assert out.summaries == {"org-c": Summary("org-c", 8, 0), "org-p": Summary("org-p", 0, 8)}


def test_a_local_submit_runs_locally_when_only_requests_that_do_not_fit_wait() -> None:
    """c runs f1 in one of its 2 cores; big (2 cores) waits, as it fits no free core: c's
    own request (1 core) runs locally. A second one, once own fills c, no longer fits:
    published. And with nothing queued, a local submit that fits runs locally."""
    sites = [Site("p", "org-p", 0), Site("c", "org-c", 2, threshold=0.5)]
    events = [
        Submit(0, Request("f1", "org-p", "p", 1, 4, 0)),
        Submit(0, Request("big", "org-p", "p", 2, 1, 0)),
        Submit(1, Request("own", "org-c", "c", 1, 1, 1)),
        Submit(1, Request("own2", "org-c", "c", 1, 1, 1)),
    ]
    out = replay(sites, events)
    assert log(out.decisions)[:5] == [
        (0, "published", "f1", "p"),
        (0, "took", "f1", "c"),
        (0, "published", "big", "p"),
        (1, "ran-locally", "own", "c"),  # big waits, but would not fit its free core
        (1, "published", "own2", "c"),  # no free core left
    ]
    alone = replay(sites, [Submit(0, Request("own", "org-c", "c", 1, 1, 0))])
    assert log(alone.decisions) == [(0, "ran-locally", "own", "c")]
    model = FederationModel(sites)
    model.submit(0, Request("big", "org-p", "p", 2, 1, 0))
    model.submit(0, Request("mine", "org-c", "c", 1, 5, 0))  # c took big: full
    assert not model.waiting("c") and model.free_cores("c") == 0


@pytest.mark.parametrize("site", [Site("z", "org-z", 0), Site("z", "org-z", 4, threshold=0.0)])
def test_a_site_without_capacity_or_threshold_takes_nothing(site: Site) -> None:
    out = replay([Site("p", "org-p", 0), site], [Submit(0, Request("r", "org-p", "p", 1, 1, 0))])
    assert [str(d.choice) for d in out.decisions] == ["published"]


def test_a_lost_site_s_foreign_work_is_requeued_as_just_submitted_and_its_own_removed() -> None:
    """The paper's event 5. L (3 cores) takes h's requests f and e at 0; a local run fills
    its third core until 2, when L takes its own request o back (o waited longer than h's g:
    same priority). L's request q (3 cores) waits. At 3 L
    is lost: what it ran first, in entry order (f then e requeued "as if they were just
    submitted": new entries, in that order, submitted at 3; o's record removed), then its
    queue (q removed); g stays. At 4 h is free and takes g (submitted at 1.5, before the loss)
    before f, whose first submission was older; then f before e (same submission time: the
    older entry)."""
    sites = [Site("L", "org-l", 3), Site("h", "org-h", 1)]
    events: list[Event] = [
        Submit(0, Request("block", "org-h", "h", 1, 4, 0)),
        Submit(0, Request("f", "org-h", "h", 1, 10, 0)),
        Submit(0, Request("e", "org-h", "h", 1, 5, 0)),
        Submit(1, Request("local", "org-l", "L", 1, 1, 1)),
        Submit(1, Request("o", "org-l", "L", 1, 10, 1)),
        Submit(1.5, Request("g", "org-h", "h", 1, 1, 1.5)),
        Submit(2.5, Request("q", "org-l", "L", 3, 1, 2.5)),
        SiteLost(3, "L"),
    ]
    out = replay(sites, events)
    assert log(out.decisions) == [
        (0, "ran-locally", "block", "h"),
        (0, "published", "f", "h"),
        (0, "took", "f", "L"),
        (0, "published", "e", "h"),
        (0, "took", "e", "L"),
        (1, "ran-locally", "local", "L"),
        (1, "published", "o", "L"),
        (1.5, "published", "g", "h"),
        (2, "took", "o", "L"),
        (2.5, "published", "q", "L"),
        (3, "requeued", "f", "L"),
        (3, "requeued", "e", "L"),
        (3, "removed", "o", "L"),
        (3, "removed", "q", "L"),
        (4, "took", "g", "h"),  # submitted before the loss: ahead of f and e
        (5, "completed", "g", "h"),  # h's own: counted nowhere
        (5, "took", "f", "h"),
        (15, "completed", "f", "h"),
        (15, "took", "e", "h"),
        (20, "completed", "e", "h"),
    ]
    requeued = [d.entry for d in out.decisions if d.choice == Choice.requeued]
    assert requeued == [entry_name(0), entry_name(1)]  # named by the entries they ran as
    retaken = [d.entry for d in out.decisions if d.choice == Choice.took and d.site == "h"]
    assert retaken == [entry_name(3), entry_name(5), entry_name(6)]  # new, in that order
    assert out.summaries == {}


def test_the_log_names_requeued_and_removed_requests_by_the_request() -> None:
    """As the broker's log does: the request's id, organisation and publishing site, for
    requeued and removed as for the other choices; ``site`` is where it happened (the lost
    site), ``entry`` the entry it ran or waited as."""
    sites = [Site("L", "org-l", 1), Site("h", "org-h", 0)]
    events: list[Event] = [
        Submit(0, Request("f", "org-h", "h", 1, 10, 0)),
        Submit(0, Request("q", "org-l", "L", 1, 1, 0)),  # L is full: published
        SiteLost(1, "L"),
    ]
    out = replay(sites, events)
    moved = [d for d in out.decisions if d.choice in (Choice.requeued, Choice.removed)]
    assert moved == [
        Decision(1, Choice.requeued, "f", "org-h", "h", "L", entry_name(0)),
        Decision(1, Choice.removed, "q", "org-l", "L", "L", entry_name(1)),
    ]
    assert [(d.request, d.org, d.origin) for d in out.decisions] == [
        ("f", "org-h", "h"),
        ("f", "org-h", "h"),
        ("q", "org-l", "L"),
        ("f", "org-h", "h"),
        ("q", "org-l", "L"),
    ]


def test_a_failed_run_is_requeued_by_its_runner_as_just_submitted() -> None:
    """f fails at t (its process exits non-zero at 2): t requeues it, submitted at 2, so g
    (submitted at 1) goes first; f's second run completes and counts, the failed one
    nothing. A local run's failure is the site's own business (it ends silently)."""
    sites = [Site("p", "org-p", 0), Site("t", "org-t", 1)]
    events = [
        Submit(0, Request("f", "org-p", "p", 1, 2, 0)),
        Submit(0, Request("g", "org-p", "p", 1, 1, 1)),
    ]
    out = replay(sites, events, fails={("p", "f"): 1})
    assert log(out.decisions) == [
        (0, "published", "f", "p"),
        (0, "took", "f", "t"),
        (0, "published", "g", "p"),
        (2, "requeued", "f", "t"),
        (2, "took", "g", "t"),
        (3, "completed", "g", "t"),
        (3, "took", "f", "t"),
        (5, "completed", "f", "t"),
    ]
    assert out.summaries == {"org-t": Summary("org-t", 3, 0), "org-p": Summary("org-p", 0, 3)}
    local = replay(sites, [Submit(0, Request("l", "org-t", "t", 1, 1, 0))], fails={("t", "l"): 1})
    assert log(local.decisions) == [(0, "ran-locally", "l", "t")]


def test_the_lost_site_s_own_requests_it_ran_are_removed_and_those_elsewhere_counted() -> None:
    """L publishes o and x (its blocker fills it); h frees first and takes o (the older); L's
    blocker ends at 1 and L takes x back. Lost at 2: x's record is removed; o runs on at h and
    its completion counts (org-h lent, org-l used); L takes no more submits."""
    sites = [Site("L", "org-l", 1), Site("h", "org-h", 1)]
    events: list[Event] = [
        Submit(0, Request("hblock", "org-h", "h", 1, 0.5, 0)),
        Submit(0, Request("block", "org-l", "L", 1, 1, 0)),
        Submit(0, Request("o", "org-l", "L", 1, 5, 0)),
        Submit(0, Request("x", "org-l", "L", 1, 3, 1)),
        SiteLost(2, "L"),
    ]
    out = replay(sites, events)
    assert log(out.decisions) == [
        (0, "ran-locally", "hblock", "h"),
        (0, "ran-locally", "block", "L"),
        (0, "published", "o", "L"),
        (0, "published", "x", "L"),
        (0.5, "took", "o", "h"),
        (1, "took", "x", "L"),
        (2, "removed", "x", "L"),
        (5.5, "completed", "o", "h"),
    ]
    assert out.summaries == {
        "org-h": Summary("org-h", 5, 0),
        "org-l": Summary("org-l", 0, 5),
    }
    with pytest.raises(ValueError, match="left"):
        replay(sites, [*events, Submit(3, Request("late", "org-l", "L", 1, 1, 3))])


def test_completion_counts_only_across_organisations() -> None:
    """b and a are both org-x: a's request run at b counts nothing; run at c (org-y) it counts
    cores × run time, or the time given in ``used_s``; a local run counts nothing."""
    sites = [Site("a", "org-x", 0), Site("b", "org-x", 2), Site("c", "org-y", 2)]
    same = [Submit(0, Request("r", "org-x", "a", 2, 3, 0))]
    out = replay(sites, same)
    assert [(str(d.choice), d.site) for d in out.decisions][1:] == [
        ("took", "b"),
        ("completed", "b"),
    ]
    assert out.summaries == {}
    across = replay(sites[::2] + sites[1:2], same)  # c offered first
    assert across.summaries == {"org-y": Summary("org-y", 6, 0), "org-x": Summary("org-x", 0, 6)}
    measured = replay(sites[::2] + sites[1:2], same, used_s={("a", "r"): 3.25})
    assert measured.summaries["org-y"].contributed == 6.5
    local = replay(sites, [Submit(0, Request("l", "org-x", "b", 1, 3, 0))])
    assert [str(d.choice) for d in local.decisions] == ["ran-locally"]
    assert local.summaries == {}


def test_at_one_instant_completions_come_first_and_sites_are_offered_in_order() -> None:
    """A run ending at 2 frees b before a submit at 2 is handled, so b takes it; with two free
    sites the first given takes (the live system's order there is a race)."""
    a, b = Site("a", "org-a", 0), Site("b", "org-b", 1)
    events = [
        Submit(0, Request("block", "org-b", "b", 1, 2, 0)),
        Submit(2, Request("r", "org-a", "a", 1, 1, 2)),
    ]
    assert log(replay([a, b], events).decisions)[-3:] == [
        (2, "published", "r", "a"),
        (2, "took", "r", "b"),
        (3, "completed", "r", "b"),
    ]
    b2, c2 = Site("b", "org-b", 1), Site("c", "org-c", 1)
    one = [Submit(0, Request("r", "org-a", "a", 1, 1, 0))]
    assert replay([a, b2, c2], one).at("b", [Choice.took]) == [("took", "r")]
    assert replay([a, c2, b2], one).at("c", [Choice.took]) == [("took", "r")]


def test_a_small_scenario_by_hand() -> None:
    """A and B, one core each, no history.

    - 0: A1 (2 s) runs at A; A2 (3 s) does not fit, is published (req-0) and B takes it.
    - 1: B1 (2 s) is published (req-1): A and B are full.
    - 2: A1 ends; A takes B1 (to 4).
    - 3: B completes A2: org-B lent 3, org-A used 3. A3 (1 s), submitted at 3 at A (full), is
      published (req-2) and B takes it (to 4).
    - 4: both end; B1 started first, so A completes first (org-A lends 2), then B (org-B
      lends 1 more).

    org-A: contributed 2, used 4 (−2); org-B: contributed 4, used 2 (+2)."""
    sites = [Site("A", "org-A", 1), Site("B", "org-B", 1)]
    events = [
        Submit(0, Request("A1", "org-A", "A", 1, 2, 0)),
        Submit(0, Request("A2", "org-A", "A", 1, 3, 0)),
        Submit(1, Request("B1", "org-B", "B", 1, 2, 1)),
        Submit(3, Request("A3", "org-A", "A", 1, 1, 3)),
    ]
    out = replay(sites, events)
    assert [(d.at_s, str(d.choice), d.request, d.site, d.entry) for d in out.decisions] == [
        (0, "ran-locally", "A1", "A", ""),
        (0, "published", "A2", "A", "req-0000000000"),
        (0, "took", "A2", "B", "req-0000000000"),
        (1, "published", "B1", "B", "req-0000000001"),
        (2, "took", "B1", "A", "req-0000000001"),
        (3, "completed", "A2", "B", "req-0000000000"),
        (3, "published", "A3", "A", "req-0000000002"),
        (3, "took", "A3", "B", "req-0000000002"),
        (4, "completed", "B1", "A", "req-0000000001"),
        (4, "completed", "A3", "B", "req-0000000002"),
    ]
    assert out.summaries == {"org-A": Summary("org-A", 2, 4), "org-B": Summary("org-B", 4, 2)}
    assert out.summaries["org-A"].priority == -2
    assert out.at("A") == [
        ("ran-locally", "A1"),
        ("published", "A2"),
        ("took", "B1"),
        ("published", "A3"),
        ("completed", "B1"),
    ]


def test_what_the_model_refuses() -> None:
    site = Site("a", "org-a", 1)
    with pytest.raises(ValueError, match="no site"):
        replay([site], [Submit(0, Request("r", "org-a", "zz", 1, 1, 0))])
    with pytest.raises(ValueError, match="twice"):
        replay([site, site], [])
    with pytest.raises(ValueError, match="finite"):
        replay([site], [SiteLost(math.inf, "a")])
    with pytest.raises(ValueError, match="nothing is running"):
        FederationModel([site]).finish_next()
