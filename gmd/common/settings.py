"""Each key of gmd.toml written once: as a field of its table's configuration class.

A table of gmd.toml is a frozen dataclass decorated with :func:`table`; each of its keys is a
field declared with :func:`setting` (one key, read by its :class:`~gmd.common.options.Option`)
or :func:`composed` (several keys that make one value, such as a policy), and each table
within it a field declared with :func:`subtable`. The field's default is its option's, and
:func:`read_table` builds the class from a TOML table through the declarations: types,
bounds, defaults and unknown keys, with the options' own error messages. Only rules that span
several keys are written by hand, beside the table; they raise :class:`RuleRefusal`, which names
the key, and the reader names the file and the table.

The reference of every key (docs/configuration.md, checked against etc/gmd.toml) is made from
:func:`table_of` each class, so a key's help is written once too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from gmd import GmdError
from gmd.common.config import ConfigError, Reader
from gmd.common.options import Option

D = TypeVar("D")
T = TypeVar("T")

_OPTION = "gmd.option"
_PARTS = "gmd.parts"
_SUBTABLE = "gmd.subtable"


class RuleRefusal(GmdError):
    """A rule over several keys refuses the file: the key it names and why. The reader adds
    the file and the table (``gmd.toml: agent.tick_s: 90 is longer than interval_s = 60``)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key, self.message = key, message


@dataclass(frozen=True)
class Table:
    """The declared keys of one table of gmd.toml (``name``: ``"daemon.limits"``;
    ``"hosts.NAME"`` for a table per host), in the order written, which is the docs' order;
    ``about`` says what the table is for."""

    name: str
    about: str
    options: tuple[Option[Any], ...]

    def option(self, key: str) -> Option[Any]:
        """The option declared as ``key`` (KeyError: none)."""
        for option in self.options:
            if option.key == key:
                return option
        raise KeyError(f"{self.name}.{key}")


_TABLES: dict[type, Table] = {}


def setting(option: Option[T]) -> T:
    """A field that is one key, read by ``option`` (its key: the field's name unless the
    option says); its default is the option's. Typed as the value, as
    :func:`dataclasses.field` is."""
    metadata = {_OPTION: option}
    if option.fresh or type(option.initial()).__hash__ is None:
        # made when read (this host's name), or mutable (a table): made for each instance
        made: T = field(default_factory=option.initial, metadata=metadata)
    else:  # a class attribute too (``PlacementConfig.refresh_s``), as a plain default is
        made = field(default=option.initial(), metadata=metadata)
    return made


def composed(build: Callable[..., T], **options: Option[Any]) -> T:
    """A field made by ``build`` from several keys, each named as its keyword (a policy made
    of thresholds): ``build`` takes the keys' values by those names. A ``ValueError`` it
    raises refuses the table; its default is ``build`` of the options' defaults."""
    named = {key: _keyed(option, key) for key, option in options.items()}

    def default() -> T:
        return build(**{key: option.initial() for key, option in named.items()})

    made: T = field(default_factory=default, metadata={_PARTS: (build, named)})
    return made


def subtable(settings: type[D]) -> D:
    """A field that is a table within this one, named as the field (``[daemon.limits]``)."""
    made: D = field(default_factory=settings, metadata={_SUBTABLE: settings})
    return made


def _keyed(option: Option[T], key: str) -> Option[T]:
    if not option.key:
        object.__setattr__(option, "key", key)  # declared without one: it takes its field's
    return option


def table(name: str) -> Callable[[type[D]], type[D]]:
    """Declares a configuration dataclass (decorated with ``@dataclass(frozen=True)`` below
    this) as the table ``name``; what the table is for is its docstring."""

    def declare(settings: type[D]) -> type[D]:
        options: list[Option[Any]] = []
        for f in fields(settings):  # type: ignore[arg-type]
            if _OPTION in f.metadata:
                options.append(_keyed(f.metadata[_OPTION], f.name))
            elif _PARTS in f.metadata:
                options.extend(f.metadata[_PARTS][1].values())
        about = inspect.cleandoc(settings.__doc__ or "")
        _TABLES[settings] = Table(name, about, tuple(options))
        return settings

    return declare


def table_of(settings: type) -> Table:
    """The table a configuration class declares (KeyError: it declares none)."""
    return _TABLES[settings]


def read_table(settings: type[D], r: Reader, /, **given: Any) -> D:
    """``settings`` built from ``r``'s table: each declared key read by its option, each
    subtable by this, and the fields in ``given`` as given (values a rule over several keys
    read or made: the rule reads its keys through ``r``, so that they count as known). A key
    the table does not declare is refused, naming it."""
    values: dict[str, Any] = {}
    try:
        for f in fields(settings):  # type: ignore[arg-type]
            if f.name in given:
                values[f.name] = given[f.name]
            elif _OPTION in f.metadata:
                values[f.name] = f.metadata[_OPTION].read(r)
            elif _PARTS in f.metadata:
                build, options = f.metadata[_PARTS]
                values[f.name] = _build(build, options, r)
            elif _SUBTABLE in f.metadata:
                values[f.name] = read_table(f.metadata[_SUBTABLE], r.sub(f.name))
        made = settings(**values)
    except RuleRefusal as refusal:
        raise r.fail(refusal.key, refusal.message) from None
    r.done()
    return made


def _build(build: Callable[..., T], options: Mapping[str, Option[Any]], r: Reader) -> T:
    read = {key: option.read(r) for key, option in options.items()}
    try:
        return build(**read)
    except (ConfigError, RuleRefusal):
        raise
    except ValueError as exc:  # the made value's own checks (a policy's levels)
        raise r.fail("", str(exc)) from None
