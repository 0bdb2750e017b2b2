"""What one key of gmd.toml takes: an ``Option`` per kind of value, each reading itself.

An option holds the key's default, its bounds or choices, its unit and its help, and
:meth:`Option.read` checks a file's value against them with the error messages operators see
(``gmd.toml: daemon.port: 70000 is not in [0, 65535]``). Options are declared as fields of
their table's configuration class (:func:`gmd.common.settings.setting`); the generic reader
(:func:`gmd.common.settings.read_table`) reads each through its option, and the reference
(docs/configuration.md, etc/gmd.toml) is made from the same declarations.

The kinds here serve every program's tables; a kind only one table has (a per-resource
threshold, a trace list) is declared beside that table.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from gmd.common.config import K, Reader, default_state_dir, relative_to_file

C = TypeVar("C", bound=str)
T = TypeVar("T")


@dataclass(frozen=True)
class Option(Generic[T]):
    """One key of gmd.toml, declared once: its default and what it means (``help``).

    ``key`` is the TOML key; a field declared with :func:`~gmd.common.settings.setting` takes
    its field's name unless it says otherwise. ``default`` is what a file that leaves the key
    out is read as having (:meth:`initial` where that is made when read: a host's name, the
    state directory). ``shown`` says the default in words where the docs should not just print
    ``default`` (it depends on the host, on another key or on the state directory; or a unit
    helps), and must then hold ``default`` as TOML writes it when that is a TOML value.

    This base class is a string, or absent (None); the subclasses check more.
    """

    default: T
    help: str
    key: str = field(default="", kw_only=True)
    shown: str = field(default="", kw_only=True)

    @property
    def fresh(self) -> bool:
        """Whether :meth:`initial` is found anew each time (this host's name, the state
        directory), rather than once for all."""
        return False

    def initial(self) -> T:
        """The value of a file that leaves the key out (a copy: a default table is no one's)."""
        return copy.copy(self.default)

    def read(self, r: Reader) -> T:
        value: T = r.get(self.key, str, self.initial())
        return value


@dataclass(frozen=True)
class Number(Option[float]):
    """A number in [``low``, ``high``] (an integer in the file is read as a float)."""

    low: float
    high: float = math.inf

    def read(self, r: Reader) -> float:
        return r.number(self.key, self.default, self.low, self.high)


@dataclass(frozen=True)
class Count(Option[int]):
    """A whole number in [``low``, ``high``]. A fraction is cut to its integer part, as it
    always was, unless ``whole``: then it is refused, naming the ``unit`` it counts."""

    low: float
    high: float = math.inf
    whole: bool = False
    unit: str = ""

    def read(self, r: Reader) -> int:
        value = r.number(self.key, self.default, self.low, self.high)
        if self.whole and value != int(value):
            of = f" of {self.unit}" if self.unit else ""
            raise r.fail(self.key, f"{value!r} is not a whole number{of}")
        return int(value)


@dataclass(frozen=True)
class Text(Option[str]):
    """A string."""


@dataclass(frozen=True)
class Flag(Option[bool]):
    """true or false."""

    def read(self, r: Reader) -> bool:
        value: bool = r.get(self.key, bool, self.default)
        return value


@dataclass(frozen=True)
class Choice(Option[C]):
    """One of ``choices``, each a string."""

    choices: tuple[C, ...]

    def read(self, r: Reader) -> C:
        return r.choice(self.key, self.default, self.choices)


@dataclass(frozen=True)
class Kind(Option[K]):
    """A member of ``default``'s enum, written as its value (see :meth:`Reader.kind`)."""

    def read(self, r: Reader) -> K:
        return r.kind(self.key, self.default)


@dataclass(frozen=True)
class Pattern(Option[Any]):
    """A string ``pattern`` matches (from its start). ``problem`` is the refusal, with
    ``{value}`` for the value as written. An absent or empty key is ``fallback()`` when given
    (a name this machine has), checked as well; else the default, unchecked."""

    pattern: str
    problem: str
    fallback: Callable[[], str] | None = None

    @property
    def fresh(self) -> bool:
        return self.fallback is not None

    def initial(self) -> Any:
        return self.fallback() if self.fallback is not None else self.default

    def read(self, r: Reader) -> Any:
        value = r.get(self.key, str, None)
        if self.fallback is not None:
            value = value or self.fallback()
        if value is None:
            return self.default
        return self.checked(r, value)

    def checked(self, r: Reader, value: str) -> str:
        if not re.match(self.pattern, value):
            raise r.fail(self.key, self.problem.format(value=repr(value)))
        return value


@dataclass(frozen=True)
class Words(Option[tuple[str, ...]]):
    """A list of strings, each matched by ``pattern`` (``problem``: as :class:`Pattern`'s)."""

    pattern: str
    problem: str

    def read(self, r: Reader) -> tuple[str, ...]:
        words = r.get(self.key, list, list(self.default))
        for word in words:
            if not isinstance(word, str) or not re.match(self.pattern, word):
                raise r.fail(self.key, self.problem.format(value=repr(word)))
        return tuple(words)


@dataclass(frozen=True)
class Place(Option[Path]):
    """A path, relative to the file that names it."""

    def read(self, r: Reader) -> Path:
        value = r.get(self.key, str, None)
        return self.initial() if value is None else relative_to_file(r.path, value)


@dataclass(frozen=True)
class Location(Option[Path | None]):
    """A path relative to the file that names it, or none (absent; empty too if
    ``blank_is_none``)."""

    blank_is_none: bool = False

    def read(self, r: Reader) -> Path | None:
        value = r.get(self.key, str, None)
        if value is None or (self.blank_is_none and not value):
            return None
        return relative_to_file(r.path, value)


@dataclass(frozen=True)
class ExistingFile(Location):
    """A :class:`Location` that must name a file when given."""

    def read(self, r: Reader) -> Path | None:
        p = super().read(r)
        if p is not None and not p.is_file():
            raise r.fail(self.key, f"{r.table[self.key]!r}: no such file")
        return p


@dataclass(frozen=True)
class StateFile(Option[Any]):
    """A file relative to the file that names it; absent or empty: ``name`` in the state
    directory (:func:`gmd.common.config.default_state_dir`, found when read)."""

    name: str

    @property
    def fresh(self) -> bool:
        return True

    def initial(self) -> Path:
        return default_state_dir() / self.name

    def read(self, r: Reader) -> Path:
        value = r.get(self.key, str, None)
        return relative_to_file(r.path, value) if value else self.initial()


@dataclass(frozen=True)
class Positive(Option[Any]):
    """A number > 0, or none (absent)."""

    def read(self, r: Reader) -> float | None:
        value = r.get(self.key, (int, float), None)
        if value is None:
            return None
        if not (0 < value < math.inf):
            raise r.fail(self.key, f"{value!r} must be > 0")
        return float(value)


@dataclass(frozen=True)
class NumberOr(Option[Any]):
    """A number > 0 (finite unless ``infinite``), or ``word`` for none; a refusal says what
    the number is (``noun``)."""

    word: str
    noun: str
    infinite: bool = False

    def initial(self) -> float | None:
        return None if self.default == self.word else float(self.default)

    def read(self, r: Reader) -> float | None:
        value = r.get(self.key, (int, float, str), self.default)
        if value == self.word:
            return None
        if isinstance(value, str) or not (value > 0 and (self.infinite or value < math.inf)):
            raise r.fail(self.key, f'{value!r}: give {self.noun} > 0, or "{self.word}"')
        return float(value)


@dataclass(frozen=True)
class Numbers(Option[Any]):
    """A list of numbers, one per level (the levels' count is the policy's to check); with
    ``zero_is_none`` a 0 is none (no cap)."""

    zero_is_none: bool = False

    def initial(self) -> tuple[float | None, ...]:
        return tuple(None if self.zero_is_none and v == 0 else v for v in self.default)

    def read(self, r: Reader) -> tuple[float | None, ...]:
        values = r.get(self.key, list, list(self.default))
        if not values or any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
            raise r.fail(self.key, f"{values!r}: give a list of numbers, one per level")
        return tuple(None if self.zero_is_none and v == 0 else float(v) for v in values)


@dataclass(frozen=True)
class FreeTable(Option[Any]):
    """A table of keys the operator names (hosts, organizations), each value of ``kinds``,
    kept as ``convert`` makes it."""

    kinds: type | tuple[type, ...] = str
    convert: Callable[[Any], Any] = str

    def read(self, r: Reader) -> dict[str, Any]:
        table = r.sub(self.key)
        values = {key: self.convert(table.get(key, self.kinds, None)) for key in table.table}
        table.done()
        return values
