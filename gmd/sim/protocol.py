"""The reproductions' protocol (``docs/reproduction-protocol.toml``), read into typed studies.

A protocol is fixed before its runs: the seeds, the windows, the traces (with their digests),
the policies, the bootstrap, and the paper's own figures each ordering is judged against. A
*study* is one table's worth of runs: SPAA's Δψ/p on one processor split, CloudShare's points
in one scenario over three logs, FALB's makespans under one reading of the paper's inputs.
Every study runs on the protocol's seeds; the tables (:mod:`gmd.sim.report`) pool the seeds
and say, per seed, how often an ordering is resolved.

Pure: text in, frozen dataclasses out; every fault is a ``ValueError`` naming the key.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from gmd.common.units import DAY_S
from gmd.sim.placement import FALB_POLICIES, FalbInputs
from gmd.sim.placement_kinds import Arrival, FalbScenario, Tie
from gmd.sim.workload import Deal

SHIPPED = "shipped:"
"""A trace name's prefix for a cut the repository holds (``tests/data/pwa/``)."""


class StudyKind(StrEnum):
    """Which paper's table a study reproduces."""

    spaa = "spaa"
    cloudshare = "cloudshare"
    falb = "falb"


@dataclass(frozen=True)
class Study:
    """One table's runs (the fields a kind does not use keep their defaults)."""

    kind: StudyKind
    id: str
    title: str
    policies: tuple[str, ...]
    traces: tuple[str, ...]
    seeds: tuple[int, ...]
    paper: Mapping[str, float]
    """the paper's figure per policy; empty where the paper gives only claims"""
    lower_is_better: bool = True
    """Δψ/p and makespans: lower is better; CloudShare's points: higher"""
    paper_std: Mapping[str, float] | None = None
    paper_long: Mapping[str, float] | None = None
    """SPAA's Table 2 (longer windows), for the gap table"""
    windows: int = 0
    window_s: int = DAY_S
    orgs: int = 5
    total_processors: int | None = None
    processors: str = "equal"
    unit_s: int | None = None
    background: float = 0.0
    variant_of: str | None = None
    deal: Deal = Deal.users
    processor_scale: float = 1.0
    """the log's processors (its MaxProcs, else its peak use) times this, when
    ``total_processors`` is not given"""
    falb: FalbInputs | None = None
    primary: bool = False
    claims: tuple[tuple[str, str], ...] = ()
    """(better, worse) pairs the paper states (FALB), when it gives no figures"""

    @property
    def deterministic(self) -> bool:
        """FALB inputs with nothing drawn: every seed gives the same run, so one is run."""
        f = self.falb
        return (
            f is not None
            and f.jitter == 0
            and f.tie == Tie.lowest
            and (f.scenario == FalbScenario.batch or f.arrival == Arrival.sequential)
        )


@dataclass(frozen=True)
class Protocol:
    fixed: str
    seeds: tuple[int, ...]
    resamples: int
    confidence: float
    bootstrap_seed: int
    traces: Mapping[str, str]
    """trace file name → its SHA-256"""
    studies: tuple[Study, ...]
    digest: str
    """the SHA-256 of the protocol's data (:func:`data_digest`): results name the protocol
    they ran"""

    def study(self, study_id: str) -> Study:
        for s in self.studies:
            if s.id == study_id:
                return s
        raise KeyError(study_id)


MIN_SEEDS = 8
MIN_RESAMPLES = 10_000


def load_protocol(path: str | Path) -> Protocol:
    text = Path(path).read_text()
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return parse_protocol(raw, data_digest(raw))


def data_digest(raw: Mapping[str, Any]) -> str:
    """The SHA-256 of what a protocol says, not how it is written: its data as canonical JSON,
    so that a comment or a line break changes no digest, and any value does."""
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_protocol(raw: Mapping[str, Any], digest: str = "") -> Protocol:
    head = _table(raw, "protocol")
    seeds = _seeds(head.get("seeds"), "protocol.seeds")
    if len(seeds) < MIN_SEEDS:
        raise ValueError(f"protocol.seeds: {len(seeds)} seeds; the protocol needs {MIN_SEEDS}")
    resamples = int(head.get("resamples", 0))
    if resamples < MIN_RESAMPLES:
        raise ValueError(f"protocol.resamples = {resamples}: at least {MIN_RESAMPLES}")
    confidence = float(head.get("confidence", 0.95))
    if not 0 < confidence < 1:
        raise ValueError(f"protocol.confidence = {confidence}: between 0 and 1")
    traces = {str(k): str(v) for k, v in _table(raw, "traces").items()}
    studies = (
        _trace_studies(raw.get("spaa", {}), seeds, StudyKind.spaa)
        + _trace_studies(raw.get("cloudshare", {}), seeds, StudyKind.cloudshare)
        + _falb(raw.get("falb", {}))
    )
    ids = [s.id for s in studies]
    if len(set(ids)) != len(ids):
        raise ValueError(f"study ids repeat: {sorted(i for i in ids if ids.count(i) > 1)}")
    for s in studies:
        if s.variant_of is not None and s.variant_of not in ids:
            raise ValueError(f"{s.id}.variant_of = {s.variant_of!r}: no such study")
        for trace in s.traces:
            if not trace.startswith(SHIPPED) and trace not in traces:
                raise ValueError(f"{s.id}: trace {trace!r} has no digest under [traces]")
        missing = [p for p in s.paper if p not in s.policies]
        if missing:
            raise ValueError(f"{s.id}.paper names policies it does not run: {missing}")
    return Protocol(
        fixed=str(head.get("fixed", "")),
        seeds=seeds,
        resamples=resamples,
        confidence=confidence,
        bootstrap_seed=int(head.get("bootstrap_seed", 0)),
        traces=traces,
        studies=studies,
        digest=digest,
    )


def _table(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"[{key}]: missing")
    return value


def _seeds(value: object, key: str) -> tuple[int, ...]:
    if isinstance(value, Mapping):
        first, count = int(value["first"]), int(value["count"])
        return tuple(range(first, first + count))
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise ValueError(f"{key}: a list of integers or {{ first = N, count = M }}")


def _merged(defaults: Mapping[str, Any], study: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in defaults.items() if k != "study"}
    out.update(study)
    if "id" not in out:
        raise ValueError("a study without an id")
    return out


def _figures(value: object) -> dict[str, float]:
    return {str(k): float(v) for k, v in (value or {}).items()}  # type: ignore[attr-defined]


def _inherited(defaults: Mapping[str, Any], study: Mapping[str, Any], key: str) -> dict[str, float]:
    """A study's paper figures: its own (checked later against its policies), else the table's
    for the policies it runs (a study of fewer policies is judged on those)."""
    if key in study:
        return _figures(study[key])
    policies = study.get("policies", defaults.get("policies", ()))
    return {p: v for p, v in _figures(defaults.get(key)).items() if p in policies}


def _trace_studies(
    raw: Mapping[str, Any], seeds: tuple[int, ...], kind: StudyKind
) -> tuple[Study, ...]:
    """SPAA's or CloudShare's studies: windows cut from a log (SPAA's ``trace``) or several
    (CloudShare's ``traces``), each entry's keys over its table's."""
    spaa = kind == StudyKind.spaa
    out = []
    for entry in raw.get("study", []):
        s = _merged(raw, entry)
        out.append(
            Study(
                kind=kind,
                id=s["id"],
                title=s.get("title", s["id"]),
                policies=tuple(s["policies"]),
                traces=(s["trace"],) if spaa else tuple(s["traces"]),
                seeds=seeds,
                paper=_inherited(raw, entry, "paper"),
                lower_is_better=spaa,  # Δψ/p: lower is fairer; CloudShare's points: higher
                paper_std=_inherited(raw, entry, "paper_std") or None,
                paper_long=_inherited(raw, entry, "paper_long") or None,
                windows=int(s["windows"]),
                window_s=int(s["window_s"]),
                orgs=int(s["orgs"]),
                total_processors=s.get("total_processors"),
                processors=s.get("processors", "equal"),
                unit_s=s.get("unit_s"),
                background=float(s.get("background", 0.0)),
                variant_of=s.get("variant_of"),
                deal=Deal(s.get("deal", Deal.users.value)),
                processor_scale=float(s.get("processor_scale", 1.0)),
            )
        )
    return tuple(out)


def _falb(raw: Mapping[str, Any]) -> tuple[Study, ...]:
    if not raw:
        return ()
    seeds = _seeds(raw.get("seeds"), "falb.seeds")
    names = {p.name for p in FALB_POLICIES}
    claims = tuple((str(a), str(b)) for a, b in raw.get("claims", []))
    for a, b in claims:
        if a not in names or b not in names:
            raise ValueError(f"falb.claims: {a} or {b} is not one of {sorted(names)}")
    out = []
    for entry in raw.get("study", []):
        s = _merged(raw, entry)
        try:
            inputs = FalbInputs(
                scenario=FalbScenario(s["scenario"]),
                jitter=float(s.get("jitter", 0.0)),
                arrival=Arrival(s.get("arrival", Arrival.sequential.value)),
                gap_s=float(s.get("gap_s", 1.0)),
                tie=Tie(s.get("tie", Tie.lowest.value)),
            )
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{s['id']}: {exc}") from None
        study = Study(
            kind=StudyKind.falb,
            id=s["id"],
            title=s.get("title", s["id"]),
            policies=tuple(p.name for p in FALB_POLICIES),
            traces=(),
            seeds=seeds,
            paper={},
            falb=inputs,
            primary=bool(s.get("primary", False)),
            claims=claims,
        )
        out.append(study if not study.deterministic else _one_seed(study))
    return tuple(out)


def _one_seed(study: Study) -> Study:
    return replace(study, seeds=study.seeds[:1])
