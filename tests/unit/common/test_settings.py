"""The declaration of a table's keys as fields, and the one reader that builds it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gmd.common.config import ConfigError, Reader
from gmd.common.options import Count, Number, Text
from gmd.common.settings import (
    RuleRefusal,
    composed,
    read_table,
    setting,
    subtable,
    table,
    table_of,
)


def _span(low: float, high: float) -> tuple[float, float]:
    if high < low:
        raise ValueError(f"high {high:g} is below low {low:g}")
    return (low, high)


@table("demo.inner")
@dataclass(frozen=True)
class Inner:
    """A table within."""

    depth: int = setting(Count(3, "how deep", 1, 10))


@table("demo")
@dataclass(frozen=True)
class Demo:
    """A table to read."""

    name: str = setting(Text("x", "a name"))
    span: tuple[float, float] = composed(
        _span, low=Number(0.0, "from", 0), high=Number(1.0, "to", 0)
    )
    inner: Inner = subtable(Inner)


def read(table_: dict[str, object], **given: object) -> Demo:
    return read_table(Demo, Reader("t.toml", "demo.", table_), **given)


def test_each_key_is_declared_once_and_read_through_its_declaration() -> None:
    assert [o.key for o in table_of(Demo).options] == ["name", "low", "high"]
    assert table_of(Demo).about == "A table to read." and table_of(Inner).name == "demo.inner"
    assert read({}) == Demo() == Demo("x", (0.0, 1.0), Inner(3))
    assert Demo.name == "x", "an immutable default is a class attribute, as a plain one is"
    assert read({"name": "y", "high": 2, "inner": {"depth": 4}}) == Demo("y", (0.0, 2.0), Inner(4))
    assert read({}, name="z").name == "z", "a value a rule made"


@pytest.mark.parametrize(
    ("table_", "message"),
    [
        ({"nom": "y"}, "t.toml: demo.nom: unknown key (misspelt?)"),
        ({"name": 5}, "t.toml: demo.name: expected a string, got 5"),
        ({"inner": {"depth": 0}}, "t.toml: demo.inner.depth: 0 is not in [1, 10]"),
        ({"inner": {"deep": 2}}, "t.toml: demo.inner.deep: unknown key"),
        ({"low": 2}, "t.toml: demo: high 1 is below low 2"),
    ],
)
def test_refusals_name_the_file_and_the_key(table_: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        read(table_)
    assert message in str(err.value)


def test_a_rule_over_several_keys_names_its_key() -> None:
    def refusing(low: float, high: float) -> tuple[float, float]:
        raise RuleRefusal("high", "too close to low")

    @table("demo.rule")
    @dataclass(frozen=True)
    class Ruled:
        """A table with a rule."""

        span: tuple[float, float] = composed(
            refusing, low=Number(0.0, "", 0), high=Number(1, "", 0)
        )

    with pytest.raises(ConfigError, match=r"^t\.toml: demo\.rule\.high: too close to low$"):
        read_table(Ruled, Reader("t.toml", "demo.rule.", {}))
