"""The GM calculator behind ``gmd-admin gm``: one pool, every metric side by side.

An operator types a situation (supply and what each consumer took) and sees how the GM judges
it next to Price, P×S, P∩S and DRF — the quickest way to build trust in the metric, or to
answer a customer who asks why their VM counts as greedy.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gmd import OptionError
from gmd.fairness.baselines import (
    dominant_share,
    drf_key,
    price,
    price_cap_scarcity,
    price_scarcity,
)
from gmd.fairness.greediness import greediness_detail
from gmd.fairness.ranking import ranks
from gmd.fairness.scenarios import Scenario
from gmd.render import Column


@dataclass(frozen=True)
class Situation:
    """One pool: its supply and what each consumer took (and, optionally, was endowed with)."""

    resources: list[str]
    supply: list[float]
    consumers: list[str]
    use: list[list[float]]
    endowment: list[list[float]] | None = None
    title: str | None = None

    @classmethod
    def from_scenario(cls, s: Scenario) -> Situation:
        return cls(
            resources=list(s.resources),
            supply=[float(x) for x in s.supply],
            consumers=list(s.consumers),
            use=[[float(x) for x in row] for row in s.use],
            title=f"{s.name}: {s.title}",
        )


def parse_amounts(text: str, where: str) -> list[float]:
    """``"3,0.5,1e3"`` → floats; NaN and infinities are refused here, with ``where`` named."""
    parts = [p.strip() for p in text.split(",")]
    values = []
    for k, part in enumerate(parts):
        try:
            v = float(part)
        except ValueError:
            raise OptionError(f"{where}: amount {k + 1} is {part!r}, not a number") from None
        if not math.isfinite(v):
            raise OptionError(f"{where}: amount {k + 1} is {part!r}, not a finite number")
        values.append(v)
    return values


def _named(item: str, option: str) -> tuple[str, list[float]]:
    name, sep, amounts = item.partition("=")
    if not sep or not name.strip():
        raise OptionError(f"{option} {item!r}: write NAME=AMOUNT,AMOUNT,... (e.g. c1=3,0)")
    return name.strip(), parse_amounts(amounts, f"{option} {name.strip()}")


def situation_from_options(
    supply: str,
    uses: Sequence[str],
    endowments: Sequence[str] = (),
    resources: str | None = None,
) -> Situation:
    """Build a situation from ``--supply 6,12 --use c1=3,0 ... [--endowment c1=2,4 ...]``."""
    r = parse_amounts(supply, "--supply")
    if not uses:
        raise OptionError("no consumers: give --use NAME=AMOUNTS once per consumer")
    pairs = [_named(u, "--use") for u in uses]
    names = [n for n, _ in pairs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise OptionError(f"--use names consumer {dupes[0]!r} more than once")
    res = _resource_names(resources, len(r))
    endowment = None
    if endowments:
        given = dict(_named(e, "--endowment") for e in endowments)
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise OptionError(f"--endowment names {unknown[0]!r}, which has no --use")
        missing = [n for n in names if n not in given]
        if missing:
            raise OptionError(f"--endowment given for some consumers but not for {missing[0]!r}")
        endowment = [given[n] for n in names]
    return _checked(Situation(res, r, names, [a for _, a in pairs], endowment))


def _resource_names(resources: str | None, m: int) -> list[str]:
    if resources is None:
        return [f"r{i + 1}" for i in range(m)]
    names = [x.strip() for x in resources.split(",")]
    if len(names) != m:
        raise OptionError(f"--resources names {len(names)} resources but --supply has {m} amounts")
    return names


def situation_from_csv(path: Path, supply: str | None = None) -> Situation:
    """Read ``consumer,<resource>,...`` rows; a row ``supply`` gives the supply (or
    ``--supply``), rows ``endowment:NAME`` give endowments."""
    try:
        with path.open(newline="") as fh:
            rows = [r for r in csv.reader(fh) if r and not r[0].lstrip().startswith("#")]
    except OSError as exc:
        raise OptionError(f"{path}: cannot read: {exc.strerror}") from None
    if len(rows) < 2:
        raise OptionError(f"{path}: needs a header and at least one consumer row")
    header = [h.strip() for h in rows[0]]
    res = header[1:]
    if not res:
        raise OptionError(f"{path}: the header must be consumer,<resource>,<resource>,...")
    sup = None if supply is None else parse_amounts(supply, "--supply")
    names: list[str] = []
    use: list[list[float]] = []
    endow: dict[str, list[float]] = {}
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise OptionError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
        name = row[0].strip()
        amounts = parse_amounts(",".join(row[1:]), f"{path}:{line} ({name})")
        if name == "supply":
            if sup is None:
                sup = amounts
        elif name.startswith("endowment:"):
            endow[name.removeprefix("endowment:")] = amounts
        elif name in names:
            raise OptionError(f"{path}:{line}: consumer {name!r} appears twice")
        else:
            names.append(name)
            use.append(amounts)
    if sup is None:
        raise OptionError(f"{path}: no 'supply' row and no --supply")
    if len(sup) != len(res):
        raise OptionError(f"supply has {len(sup)} amounts for {len(res)} resources in {path}")
    endowment = None
    if endow:
        missing = [n for n in names if n not in endow]
        unknown = sorted(set(endow) - set(names))
        if unknown or missing:
            bad = unknown[0] if unknown else missing[0]
            raise OptionError(f"{path}: endowment rows must match consumers one to one ({bad!r})")
        endowment = [endow[n] for n in names]
    return _checked(Situation(res, sup, names, use, endowment, title=str(path)))


def _checked(s: Situation) -> Situation:
    """``s`` if it is a situation one host could be in: no resource used beyond its supply
    (the metric shares out what was there)."""
    m = len(s.resources)
    if len(s.supply) != m:
        raise OptionError(f"supply has {len(s.supply)} amounts for {m} resources")
    rows = zip(s.consumers, s.use, strict=True)
    for name, amounts in rows:
        if len(amounts) != m:
            raise OptionError(f"consumer {name!r} has {len(amounts)} amounts for {m} resources")
    # Negative amounts and an empty supply are the engine's to refuse (gmd.fairness).
    total = np.sum(np.asarray(s.use, dtype=np.float64), axis=0)
    for r, used, supply in zip(s.resources, total.tolist(), s.supply, strict=True):
        if not math.isfinite(used):
            raise OptionError(f"{r}: the consumers' use adds up beyond what a number can hold")
        if used > supply * (1 + 1e-9):
            raise OptionError(
                f"{r}: the consumers use {used:g} in all, more than the supply {supply:g}"
                " (use is a share of what the host had)"
            )
    return s


@dataclass(frozen=True)
class Judgement:
    situation: Situation
    gamma: float
    rows: list[dict[str, object]]
    credit: dict[str, float]
    share: dict[str, float]

    def columns(self) -> list[Column]:
        cols = [Column("rank", "GM rank", None), Column("consumer", "consumer", None, "left")]
        cols.append(Column("gm", "GM"))
        cols += [Column(f"offset_{r}", f"offset {r}") for r in self.situation.resources]
        cols += [
            Column("price", "Price"),
            Column("price_rank", "rank", None),
            Column("price_scarcity", "P×S"),
            Column("price_cap_scarcity", "P∩S"),
            Column("drf", "DRF share"),
            Column("drf_rank", "rank", None),
        ]
        return cols

    def document(self) -> dict[str, object]:
        s = self.situation
        return {
            "title": s.title,
            "gamma": self.gamma,
            "resources": s.resources,
            "supply": dict(zip(s.resources, s.supply, strict=True)),
            "credit_factor": self.credit,
            "equal_share": self.share,
            "consumers": self.rows,
        }


def judge(
    situation: Situation,
    gamma: float = 0.5,
    weights: Sequence[float] | None = None,
    price_unit: float = 1.0,
) -> Judgement:
    """Every metric for every consumer, rows ordered greediest first by the GM."""
    s = situation
    kw = {"consumers": s.consumers, "resources": s.resources}
    # Amounts near the largest double overflow in the baselines' squares: they show as no
    # number ("-", null) rather than as warnings on stderr.
    with np.errstate(over="ignore", invalid="ignore"):
        detail = greediness_detail(s.use, s.supply, gamma, s.endowment, weights, **kw)
        p = price(s.use, s.supply, price_unit, **kw)
        pxs = price_scarcity(s.use, s.supply, price_unit, **kw)
        pcs = price_cap_scarcity(s.use, s.supply, price_unit, **kw)
        drf = dominant_share(s.use, s.supply, **kw)
    gm_rank, p_rank = ranks(detail.greediness), ranks(p)
    drf_rank = ranks(drf_key(s.use, s.supply, **kw))
    rows = []
    for j, name in enumerate(s.consumers):
        row: dict[str, object] = {
            "rank": gm_rank[j],
            "consumer": name,
            "gm": float(detail.greediness[j]),
        }
        for i, r in enumerate(s.resources):
            row[f"offset_{r}"] = float(detail.offsets[j, i])
        for i, r in enumerate(s.resources):
            row[f"term_{r}"] = float(detail.terms[j, i])
        row.update(
            price=float(p[j]),
            price_rank=p_rank[j],
            price_scarcity=float(pxs[j]),
            price_cap_scarcity=float(pcs[j]),
            drf=float(drf[j]),
            drf_rank=drf_rank[j],
        )
        rows.append(row)
    order = np.argsort(np.asarray([r["rank"] for r in rows]), kind="stable")
    return Judgement(
        situation=s,
        gamma=float(gamma),
        rows=[rows[k] for k in order],
        credit=dict(zip(s.resources, map(float, detail.credit), strict=True)),
        share={r: float(x) / len(s.consumers) for r, x in zip(s.resources, s.supply, strict=True)},
    )
