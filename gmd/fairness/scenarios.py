"""The GM paper's questionnaire situations, for the calculator and the demo.

Q1's allocation options (Table 2: 6 units of r₁, 12 of r₂), Q3's self-serving scenarios
(Table 3; supply = what the consumers took plus the "remainder" row) and Table 5, the
allocation on which DRF ranks inversely to every other metric.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    resources: tuple[str, ...]
    supply: tuple[float, ...]
    consumers: tuple[str, ...]
    use: tuple[tuple[float, ...], ...]


def _q1(name: str, c1: float, c2: float, c3: tuple[float, float]) -> Scenario:
    return Scenario(
        name,
        f"GM paper Q1, allocation option {name} (Table 2)",
        ("r1", "r2"),
        (6, 12),
        ("c1", "c2", "c3"),
        ((c1, 0), (0, c2), c3),
    )


def _q3(name: str, use: tuple[tuple[float, ...], ...], remainder: tuple[float, ...]) -> Scenario:
    supply = tuple(
        sum(col) + rest for col, rest in zip(zip(*use, strict=True), remainder, strict=True)
    )
    return Scenario(
        name,
        f"GM paper Q3, scenario {name} (Table 3)",
        ("r1", "r2", "r3"),
        supply,
        ("c1", "c2", "c3"),
        use,
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _q1("A11", 2, 4, (4, 8)),
        _q1("A12", 3, 6, (3, 6)),
        _q1("A13", 4, 8, (2, 4)),
        _q1("A14", 5, 10, (1, 2)),
        _q3("S31", ((4, 3, 3), (2, 1, 5), (4, 2, 1)), (2, 3, 0)),
        _q3("S32", ((4, 2, 4), (1, 4, 3), (1, 6, 2)), (6, 0, 0)),
        _q3("S33", ((4, 1, 4), (1, 4, 3), (1, 6, 2)), (6, 1, 0)),
        Scenario(
            "T5",
            "GM paper Table 5, a problematic DRF ranking",
            ("r1", "r2", "r3"),
            (30, 30, 30),
            ("c1", "c2", "c3"),
            ((18, 0, 0), (0, 14, 17), (10, 16, 12)),
        ),
    )
}
