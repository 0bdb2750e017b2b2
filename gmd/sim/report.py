"""docs/reproduction.md's tables, computed from the protocol and its results alone.

Each table sits between ``<!-- reproduce:NAME -->`` and ``<!-- /reproduce:NAME -->`` in the
document; :func:`write_document` replaces what is between them, :func:`check_document` says
where the document, the results and the protocol disagree. Nothing here runs a simulation:
the per-draw values in the results are the only input, so the tables can be checked on any
machine in seconds.

Every ordering is a pair of policies in the paper's order (the better in the paper first),
with our pooled advantage of the first over the second, its percentile bootstrap interval
(draws resampled within each run, i.e. each seed and trace, ``protocol.resamples`` times
from ``protocol.bootstrap_seed``), one of three verdicts (:class:`PaperVerdict`), and how many of
the seeds taken alone resolve it each way: an ordering that holds pooled but flips with the
seed shows it there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from gmd.sim.bootstrap import Statistic, differences, percentile_interval, resample_indices
from gmd.sim.protocol import Protocol, Study, StudyKind


class PaperVerdict(StrEnum):
    """What our draws say about one of the paper's orderings."""

    as_paper = "as the paper"
    against = "against the paper"
    unresolved = "unresolved"
    tie = "the paper: a tie"
    """the paper gives both the same figure; ours resolved or not, this is said instead"""


@dataclass(frozen=True)
class Pair:
    first: str
    second: str
    paper_sign: int
    """+1: the paper has ``first`` better; 0: a tie in the paper"""
    advantage: float
    """pooled: how much better ``first`` is than ``second`` (negative: worse)"""
    low: float
    high: float
    seeds_as: int
    """seeds whose own interval resolves it as the paper"""
    seeds_against: int
    seeds: int
    draws: int
    """contended draws pooled"""
    corrected: bool = False
    """still resolved by the interval at the Bonferroni level for the study's pairs
    (1 − (1 − confidence) / pairs): what survives asking every pair at once"""

    @property
    def resolved(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def verdict(self) -> PaperVerdict:
        if self.paper_sign == 0:
            return PaperVerdict.tie
        if not self.resolved:
            return PaperVerdict.unresolved
        return (
            PaperVerdict.as_paper
            if (self.advantage > 0) == (self.paper_sign > 0)
            else PaperVerdict.against
        )


@dataclass(frozen=True)
class Draws:
    """A study's values: one row per draw, one column per policy; the run of each row."""

    policies: list[str]
    values: np.ndarray
    run: np.ndarray
    contended: np.ndarray
    seed: np.ndarray
    trace: list[str]


def draws(runs: Sequence[Mapping[str, Any]]) -> Draws:
    policies = list(runs[0]["policies"])
    rows, run_of, contended, seed, trace = [], [], [], [], []
    for i, run in enumerate(runs):
        if list(run["policies"]) != policies:
            raise ValueError(f"run {i} compares {run['policies']}, not {policies}")
        for values, c in zip(run["values"], run["contended"], strict=True):
            rows.append([math.nan if v is None else float(v) for v in values])
            run_of.append(i)
            contended.append(bool(c))
            seed.append(int(run["seed"]))
            trace.append(str(run["trace"]))
    return Draws(
        policies,
        np.array(rows, dtype=np.float64).reshape(len(rows), len(policies)),
        np.array(run_of),
        np.array(contended),
        np.array(seed),
        trace,
    )


def statistic(study: Study) -> Statistic:
    """CloudShare scores points (wins), the others compare means."""
    return (
        Statistic.win_difference
        if study.kind == StudyKind.cloudshare
        else Statistic.mean_difference
    )


def paper_order(study: Study, d: Draws) -> list[str]:
    """The policies best first by the paper's figures; those it does not give, by ours."""
    sign = 1.0 if study.lower_is_better else -1.0
    ours = np.nanmean(d.values, axis=0) if d.values.size else np.zeros(len(d.policies))
    key = {p: (0, sign * study.paper[p]) if p in study.paper else (1, 0.0) for p in d.policies}
    return sorted(d.policies, key=lambda p: (*key[p], float(ours[d.policies.index(p)])))


def pairs(study: Study, d: Draws, protocol: Protocol) -> list[Pair]:
    """Every pair of the policies the paper orders (or, with claims, the claimed pairs)."""
    stat = statistic(study)
    keep = d.contended & np.all(np.isfinite(d.values), axis=1)
    values, runs, seeds = d.values[keep], d.run[keep], d.seed[keep]
    wanted: list[tuple[str, str, int]] = []
    if study.claims:
        wanted = [(a, b, 1) for a, b in study.claims]
    else:
        order = [p for p in paper_order(study, d) if p in study.paper]
        for i, a in enumerate(order):
            for b in order[i + 1 :]:
                wanted.append((a, b, 0 if study.paper[a] == study.paper[b] else 1))
    if values.shape[0] < 2 or not wanted:
        return []
    # A trace's windows are drawn per seed, so they are resampled within each run; FALB's
    # runs are one draw each, resampled together.
    strata = np.zeros_like(runs) if study.kind == StudyKind.falb else runs
    index = resample_indices(strata, protocol.resamples, protocol.bootstrap_seed)
    per_seed = {
        s: resample_indices(
            np.zeros(int((seeds == s).sum()), dtype=np.int64),
            protocol.resamples,
            protocol.bootstrap_seed,
        )
        for s in np.unique(seeds)
    }
    tail = (1 - protocol.confidence) / 2
    strict = tail / len(wanted)
    out = []
    for a, b, sign in wanted:
        ia, ib = d.policies.index(a), d.policies.index(b)
        diff = differences(values, ia, ib, stat)
        low, high = percentile_interval(diff, index, tail)
        low_strict, high_strict = percentile_interval(diff, index, strict)
        seeds_as = seeds_against = 0
        for s, idx in per_seed.items():
            mine = diff[seeds == s]
            if mine.size < 2:
                continue
            lo, hi = percentile_interval(mine, idx, tail)
            if lo > 0 or hi < 0:
                if (lo > 0) == (sign >= 0):
                    seeds_as += 1
                else:
                    seeds_against += 1
        out.append(
            Pair(a, b, sign, float(diff.mean()), low, high, seeds_as, seeds_against,
                 len(np.unique(d.seed)), int(values.shape[0]), low_strict > 0 or high_strict < 0)
        )  # fmt: skip
    return out


# --- Markdown -------------------------------------------------------------------------------


def _n(value: float, digits: int = 1) -> str:
    if not math.isfinite(value):
        return "–"
    return f"{value:,.{digits}f}".replace("-", "−")


def _name(policy: str, kind: StudyKind = StudyKind.spaa) -> str:
    """SPAA calls ORIG_DIRECT DirectContr (with ψ); CloudShare calls it ORIG_DIRECT."""
    return (
        {"ORIG_DIRECT": "DirectContr (ψ)"}.get(policy, policy) if kind == StudyKind.spaa else policy
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right_from: int = 1) -> str:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def pairs_table(study: Study, found: Sequence[Pair], unit: str, digits: int) -> str:
    rows = []
    for p in found:
        interval = f"{_n(p.advantage, digits)} [{_n(p.low, digits)}, {_n(p.high, digits)}]"
        if p.resolved:
            interval = f"**{interval}**"
        rows.append(
            [
                f"{_name(p.first, study.kind)} – {_name(p.second, study.kind)}",
                interval,
                p.verdict.value,
                ("yes" if p.corrected else "no") if p.resolved else "–",
                f"{p.seeds_as} · {p.seeds_against}",
            ]
        )
    header = [
        "A – B (A better in the paper)",
        f"ours: A's advantage per contended draw {unit} [95 % interval]",
        "verdict",
        f"resolved at 95 % over all {len(found)} pairs (Bonferroni)",
        f"seeds alone: as · against (of {found[0].seeds if found else 0})",
    ]
    return _table(header, rows, right_from=4)


def verdict_summary(study: Study, found: Sequence[Pair]) -> str:
    """One sentence per verdict, naming the pairs: the prose the table backs."""
    parts = []
    for verdict in PaperVerdict:
        names = [_pair_name(study, p) for p in found if p.verdict == verdict]
        if names:
            parts.append(f"{verdict.value.capitalize()} ({len(names)}): {', '.join(names)}.")
    weak = [_pair_name(study, p) for p in found if p.resolved and not p.corrected]
    if weak:
        parts.append(
            f"Resolved, but not once corrected for the {len(found)} pairs asked together:"
            f" {', '.join(weak)}."
        )
    flips = [_pair_name(study, p) for p in found if p.seeds_as and p.seeds_against]
    if flips:
        parts.append(
            f"Resolved one way on some seeds and the other way on others: {', '.join(flips)}."
        )
    return "\n".join(f"- {p}" for p in parts)


def _pair_name(study: Study, p: Pair) -> str:
    return f"{_name(p.first, study.kind)} – {_name(p.second, study.kind)}"


def spaa_block(study: Study, runs: Sequence[Mapping[str, Any]], protocol: Protocol) -> str:
    d = draws(runs)
    order = paper_order(study, d)
    rows = []
    seed_means = {s: np.nanmean(d.values[d.seed == s], axis=0) for s in np.unique(d.seed)}
    for p in order:
        i = d.policies.index(p)
        col = d.values[:, i]
        per = [float(m[i]) for m in seed_means.values()]
        rows.append(
            [
                _name(p),
                _n(study.paper.get(p, math.nan), 0),
                _n((study.paper_std or {}).get(p, math.nan), 0),
                _n(float(np.nanmean(col))),
                _n(float(np.nanstd(col))),
                f"{_n(min(per))} – {_n(max(per))}",
                f"{_top_share(col):.0%}",
            ]
        )
    means = _table(
        ["policy", "paper avg", "paper std", "ours avg", "ours std", "seeds' avg: min – max",
         f"carried by the worst {TOP:.0%} of windows"],
        rows,
    )  # fmt: skip
    found = pairs(study, d, protocol)
    contended = int(d.contended.sum())
    head = (
        f"{len(d.values)} windows of {study.window_s / 3600:g} h ({study.windows} per seed × "
        f"{len(np.unique(d.seed))} seeds), {contended} contended; "
        f"{study.total_processors} processors ({study.processors}), {study.orgs} organizations."
    )
    return "\n\n".join(
        [head, means, pairs_table(study, found, "(Δψ/p)", 1), verdict_summary(study, found)]
    )


TOP = 0.05
"""the share of windows whose part of the total the SPAA tables show"""


def _top_share(values: np.ndarray) -> float:
    """The part of the total carried by the worst :data:`TOP` of the windows: near 1 when a
    few windows make the average."""
    v = np.sort(values[np.isfinite(values)])[::-1]
    total = float(v.sum())
    return float(v[: max(1, round(TOP * v.size))].sum()) / total if total > 0 else 0.0


def gap_block(protocol: Protocol, results: Mapping[str, Any]) -> str:
    """The SPAA variants beside their base: what brings our magnitudes nearest the paper's."""
    bases = [s for s in protocol.studies if s.kind == StudyKind.spaa and s.variant_of is None]
    rows = []
    for base in bases:
        variants = [s for s in protocol.studies if s.variant_of == base.id]
        if not variants:
            continue
        for study in (base, *variants):
            d = draws(results["studies"][study.id]["runs"])
            order = [p for p in paper_order(study, d) if p in study.paper]
            means = {p: float(np.nanmean(d.values[:, d.policies.index(p)])) for p in order}
            factor = _factor_off(means, study.paper)
            factor_long = _factor_off(means, study.paper_long or {})
            found = pairs(study, d, protocol)
            counts = [sum(p.verdict == v for p in found) for v in PaperVerdict]
            rows.append(
                [
                    study.title if study.variant_of else f"{study.title} (the base)",
                    f"{int(d.contended.sum())} / {len(d.values)}",
                    " · ".join(_n(means[p]) for p in order),
                    f"×{_n(factor, 2)}",
                    f"×{_n(factor_long, 2)}",
                    " · ".join(str(c) for c in counts),
                ]
            )
    header = [
        "variant (one change from the base)",
        "contended",
        "avg Δψ/p: " + " · ".join(_name(p) for p in order),
        "off Table 1's avg",
        "off Table 2's avg",
        "pairs: " + " · ".join(v.value for v in PaperVerdict),
    ]
    return _table(header, rows, right_from=1)


def _factor_off(ours: Mapping[str, float], paper: Mapping[str, float]) -> float:
    """How far our averages are from the paper's: the geometric mean over the policies of
    ours/paper or paper/ours, whichever is above 1 (1: the same)."""
    logs = [abs(math.log(ours[p] / paper[p])) for p in ours if p in paper and ours[p] > 0]
    return math.exp(float(np.mean(logs))) if logs else math.nan


def cloudshare_block(study: Study, runs: Sequence[Mapping[str, Any]], protocol: Protocol) -> str:
    d = draws(runs)
    order = paper_order(study, d)
    traces = list(dict.fromkeys(d.trace))
    points = {t: _points(d, np.array([x == t for x in d.trace])) for t in traces}
    total = _points(d, np.ones(len(d.trace), dtype=bool))
    paper_total = sum(study.paper.values())
    ours_total = sum(total.values())
    rows = []
    for p in order:
        rows.append(
            [
                p,
                _n(study.paper.get(p, math.nan), 0),
                _n(study.paper.get(p, math.nan) / paper_total, 3),
                *[str(points[t][p]) for t in traces],
                str(total[p]),
                _n(total[p] / ours_total if ours_total else math.nan, 3),
            ]
        )
    short = [t.split("-")[0] for t in traces]
    table = _table(
        ["algorithm", "paper points", "paper share", *[f"ours: {s}" for s in short], "ours: total",
         "ours: share"],
        rows,
    )  # fmt: skip
    contended = {t: int(d.contended[[x == t for x in d.trace]].sum()) for t in traces}
    head = (
        f"{len(d.values)} windows of {study.window_s / 3600:g} h ({study.windows} per log per seed "
        f"× {len(np.unique(d.seed))} seeds × {len(traces)} logs); contended: "
        + ", ".join(f"{s} {contended[t]}" for s, t in zip(short, traces, strict=True))
        + ". Share: an algorithm's points over all algorithms' points."
    )
    if study.background:
        work = [x for r in runs for x in r.get("background_work", []) if x is not None]
        head += f" Local work: {np.mean(work):.0%} of all work on average."
    found = pairs(study, d, protocol)
    return "\n\n".join(
        [head, table, pairs_table(study, found, "(share of wins less losses)", 3),
         verdict_summary(study, found)]
    )  # fmt: skip


def cloudshare_gap_block(protocol: Protocol, results: Mapping[str, Any]) -> str:
    """CloudShare's variants beside their base: each algorithm's share of all points."""
    rows = []
    order: list[str] = []
    for base in [
        s for s in protocol.studies if s.kind == StudyKind.cloudshare and not s.variant_of
    ]:
        variants = [s for s in protocol.studies if s.variant_of == base.id]
        if not variants:
            continue
        for study in (base, *variants):
            d = draws(results["studies"][study.id]["runs"])
            order = paper_order(study, d)
            points = _points(d, np.ones(len(d.trace), dtype=bool))
            total = sum(points.values()) or 1
            shares = {p: points[p] / total for p in order}
            paper_total = sum(study.paper.values())
            paper = {p: v / paper_total for p, v in study.paper.items()}
            found = pairs(study, d, protocol)
            counts = [sum(p.verdict == v for p in found) for v in PaperVerdict]
            rows.append(
                [
                    study.title if study.variant_of else f"{study.title} (the base)",
                    f"{int(d.contended.sum())} / {len(d.values)}",
                    " · ".join(_n(shares[p], 3) for p in order),
                    f"×{_n(_factor_off(shares, paper), 2)}",
                    " · ".join(str(c) for c in counts),
                ]
            )
    header = [
        "variant (one change from the base)",
        "contended",
        "share of points: " + " · ".join(order),
        "off the paper's shares",
        "pairs: " + " · ".join(v.value for v in PaperVerdict),
    ]
    return _table(header, rows, right_from=1)


def _points(d: Draws, rows: np.ndarray) -> dict[str, int]:
    """CloudShare's points: per draw, one to each policy for each other it is strictly fairer
    than (unmeasured values score nothing)."""
    v = d.values[rows]
    finite = np.isfinite(v)
    wins = (v[:, :, None] < v[:, None, :]) & finite[:, :, None] & finite[:, None, :]
    return {p: int(wins[:, i, :].sum()) for i, p in enumerate(d.policies)}


def falb_primary_block(protocol: Protocol, results: Mapping[str, Any]) -> str:
    primaries = [s for s in protocol.studies if s.kind == StudyKind.falb and s.primary]
    if not primaries:
        return ""
    columns = {s.id: draws(results["studies"][s.id]["runs"]) for s in primaries}
    policies = columns[primaries[0].id].policies
    runs = {s.id: results["studies"][s.id]["runs"][0] for s in primaries}
    rows = []
    for p in policies:
        i = policies.index(p)
        row = [p]
        for s in primaries:
            row += [_n(float(columns[s.id].values[0, i]), 0), _n(runs[s.id]["last_start"][i], 0)]
        rows.append(row)
    header = ["policy"]
    for s in primaries:
        header += [f"{s.title}: total execution time (s)", "the last to finish started at (s)"]
    table = _table(header, rows)
    claims = []
    for s in primaries:
        d = columns[s.id]
        for a, b in s.claims:
            ta = float(np.mean(d.values[:, d.policies.index(a)]))
            tb = float(np.mean(d.values[:, d.policies.index(b)]))
            verdict = (
                PaperVerdict.as_paper if ta < tb else PaperVerdict.against if ta > tb else "a tie"
            )
            change = _n(100 * (ta / tb - 1), 1)
            claims.append(
                f"- {s.title}: {a} {_n(ta, 0)} s, {b} {_n(tb, 0)} s ({change} %): {verdict}."
            )
    note = (
        "Each is one deterministic run: Table 3's run times, no draw, ties to the lowest node,"
        " so there is nothing to resample."
    )
    return "\n\n".join([table, note, "\n".join(claims)])


def falb_sensitivity_block(protocol: Protocol, results: Mapping[str, Any]) -> str:
    studies = [s for s in protocol.studies if s.kind == StudyKind.falb]
    rows = []
    for s in studies:
        d = draws(results["studies"][s.id]["runs"])
        means = [float(np.mean(d.values[:, i])) for i in range(len(d.policies))]
        y, f2 = d.policies.index("YuniKorn"), d.policies.index("FALB-2")
        sooner = int((d.values[:, f2] < d.values[:, y]).sum())
        found = pairs(s, d, protocol) if len(d.values) > 1 else []
        gap = (means[f2] / means[y] - 1) * 100
        if found:
            p = next(x for x in found if (x.first, x.second) == ("FALB-2", "YuniKorn"))
            lo, hi = -100 * p.high / means[y], -100 * p.low / means[y]
            gap_text = f"{_n(gap)} [{_n(lo)}, {_n(hi)}]"
            counts = " · ".join(
                str(sum(x.verdict == v for x in found)) for v in list(PaperVerdict)[:3]
            )
        else:
            gap_text, counts = f"{_n(gap)} (one run)", "–"
        rows.append(
            [s.title, str(len(d.values)), *[_n(m, 0) for m in means], gap_text,
             f"{sooner} of {len(d.values)}", counts]
        )  # fmt: skip
    policies = draws(results["studies"][studies[0].id]["runs"]).policies
    header = [
        "inputs",
        "seeds",
        *[f"{p} (s)" for p in policies],
        "FALB-2 vs YuniKorn, % [95 % interval]",
        "FALB-2 sooner",
        "claims: as · against · unresolved",
    ]
    return _table(header, rows)


def protocol_block(protocol: Protocol) -> str:
    seeds = protocol.seeds
    return (
        f"Fixed on {protocol.fixed}, before any run on its seeds (its header says what was added"
        f" after the base studies' results were seen): seeds {seeds[0]}–{seeds[-1]} "
        f"({len(seeds)}), paired percentile bootstrap with {protocol.resamples:,} resamples "
        f"(seed {protocol.bootstrap_seed}), {protocol.confidence:.0%} intervals, draws resampled "
        f"within each seed and log. Protocol SHA-256 `{protocol.digest[:16]}`."
    )


def blocks(protocol: Protocol, results: Mapping[str, Any]) -> dict[str, str]:
    """Every generated table by its marker's name."""
    studies = results["studies"]
    out = {"protocol": protocol_block(protocol)}
    for s in protocol.studies:
        if s.kind == StudyKind.spaa and s.variant_of is None:
            out[s.id] = spaa_block(s, studies[s.id]["runs"], protocol)
        elif s.kind == StudyKind.cloudshare and s.variant_of is None:
            out[s.id] = cloudshare_block(s, studies[s.id]["runs"], protocol)
    out["spaa-gap"] = gap_block(protocol, results)
    out["cs-gap"] = cloudshare_gap_block(protocol, results)
    out["falb-primary"] = falb_primary_block(protocol, results)
    out["falb-sensitivity"] = falb_sensitivity_block(protocol, results)
    return out


MARKER = re.compile(r"<!-- reproduce:([\w-]+) -->\n(.*?)<!-- /reproduce:\1 -->", re.S)


def filled(document: str, generated: Mapping[str, str]) -> str:
    """The document with every marker's content replaced by its generated table."""
    missing = set(generated) - set(marker_names(document))
    if missing:
        raise ValueError(f"the document has no marker for {sorted(missing)}")
    return MARKER.sub(
        lambda m: f"<!-- reproduce:{m[1]} -->\n{generated[m[1]]}\n<!-- /reproduce:{m[1]} -->",
        document,
    )


def marker_names(document: str) -> list[str]:
    return [m[1] for m in MARKER.finditer(document)]


def check_document(protocol: Protocol, results: Mapping[str, Any], document: str) -> list[str]:
    """Where the document, the results and the protocol disagree (empty: in step)."""
    problems = []
    if results.get("protocol") != protocol.digest:
        problems.append(
            "docs/reproduction-results.json was made by another protocol: run make reproduce"
        )
    for s in protocol.studies:
        runs = results.get("studies", {}).get(s.id, {}).get("runs")
        if not runs:
            problems.append(f"{s.id}: no runs in the results")
            continue
        ran = sorted({(r["seed"], r["trace"]) for r in runs})
        planned = sorted((seed, t) for seed in s.seeds for t in s.traces or ("",))
        if ran != planned:
            problems.append(f"{s.id}: the results ran {len(ran)} runs, the protocol asks {planned}")
    if problems:
        return problems
    generated = blocks(protocol, results)
    present = {m[1]: m[2].rstrip("\n") for m in MARKER.finditer(document)}
    for name, text in generated.items():
        if name not in present:
            problems.append(f"docs/reproduction.md: no marker for {name}")
        elif present[name] != text:
            problems.append(
                f"docs/reproduction.md: the {name} table is not the results' (make reproduce)"
            )
    return problems


def write_document(protocol: Protocol, results: Mapping[str, Any], path: Path) -> None:
    path.write_text(filled(path.read_text(), blocks(protocol, results)))
