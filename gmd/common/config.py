"""Reading gmd.toml: the file, and a reader that validates one table of it key by key.

Both gmd-agent (its ``[agent]`` table) and gmd-daemon (the rest) read the same file the same
way, so every error names the file and the key (``gmd.toml: accounting.gamma: 1.5 is not in
[0, 1]``): an operator who mistyped a value at 3 a.m. should not have to read a traceback.

Each key is declared once (:mod:`gmd.common.options` says what it takes,
:mod:`gmd.common.settings` makes it a field of its table's configuration class); this module
holds what every declaration reads through: the file, and the :class:`Reader` of one table.
"""

from __future__ import annotations

import enum
import math
import os
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from gmd import GmdError

DEFAULT_PATH = Path("/etc/gmd/gmd.toml")

C = TypeVar("C", bound=str)
K = TypeVar("K", bound=enum.StrEnum)


# The types as TOML calls them: an operator wrote `port = "x"`, not a Python str.
_TOML_NAMES = {
    float: "a number",
    int: "an integer",
    str: "a string",
    bool: "true or false",
    list: "an array",
    dict: "a table",
    datetime: "a date-time",
}


def _expected(kinds: tuple[type, ...]) -> str:
    """``kinds`` in TOML's words; an integer is a number too, so "a number" says both."""
    named = [_TOML_NAMES.get(k, k.__name__) for k in kinds if not (k is int and float in kinds)]
    return " or ".join(named)


def _bound(limit: float) -> str:
    """A bound the way an operator would write it: 2147483648 rather than 2.14748e+09."""
    if math.isinf(limit):
        return "∞" if limit > 0 else "-∞"
    if limit == int(limit) and abs(limit) < 2**53:
        return str(int(limit))
    return f"{limit:g}"


class ConfigError(GmdError, ValueError):
    """A configuration value is wrong; the message names the file and the key."""


def relative_to_file(path: Path | None, value: str) -> Path:
    """A path a configuration file names: relative ones are relative to that file (``path``;
    None: the default file is absent, and the path is taken as written)."""
    p = Path(value)
    if not p.is_absolute() and path is not None:
        p = path.parent / p
    return p


def default_state_dir() -> Path:
    """Where the ledger, spool and enforcement state go when the configuration does not say.

    systemd's ``StateDirectory=`` (``$STATE_DIRECTORY``, the first if several) wins, so that a
    service running as user gmd and ``gmd-admin`` run as root agree; then ``/var/lib/gmd`` for
    root, ``./var`` for anyone else (a checkout)."""
    given = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if given:
        return Path(given)
    return Path("/var/lib/gmd") if os.geteuid() == 0 else Path("var").resolve()


def default_database_url() -> str:
    """The ledger when ``[database] url`` is unset: ``ledger.db`` in the state directory.

    Here rather than in the daemon's configuration because gmd-broker reads the same key of the
    same file and must find the same ledger (it writes the federation's history there), and the
    broker imports nothing of the daemon."""
    return f"sqlite:///{default_state_dir() / 'ledger.db'}"


class Reader:
    """Walks one TOML table, remembering which keys were used to reject unknown ones."""

    def __init__(
        self, source: str, prefix: str, table: dict[str, Any], path: Path | None = None
    ) -> None:
        self.source, self.prefix, self.table = source, prefix, table
        self.path = path
        """the file read (None: the default file is absent): what relative paths are relative to"""
        self.used: set[str] = set()

    def fail(self, key: str, message: str) -> ConfigError:
        where = f"{self.prefix}{key}" if key else self.prefix.rstrip(".")
        return ConfigError(f"{self.source}: {where}: {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        self.used.add(key)
        if key not in self.table:
            return default
        value = self.table[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds and {int, float} & set(kinds):
            raise self.fail(key, f"expected a number, got {value!r}")
        if kind is float and isinstance(value, int):
            value = float(value)
        if not isinstance(value, kind):
            raise self.fail(key, f"expected {_expected(kinds)}, got {value!r}")
        return value

    def number(self, key: str, default: float, low: float, high: float = math.inf) -> float:
        value = self.get(key, float, default)
        if not (math.isfinite(value) and low <= value <= high):
            top = f"{_bound(high)}]" if math.isfinite(high) else "∞)"
            bound = f"[{_bound(low)}, {top}"
            # As written: `port = 99999` is 99999 in the message, not the 99999.0 read.
            raise self.fail(key, f"{self.table.get(key, value)!r} is not in {bound}")
        return value

    def kind(self, key: str, default: K) -> K:
        """A kind written as its value (``mode = "dry-run"``): the member of ``default``'s
        enum, or a one-line error listing the values."""
        kinds = type(default)
        return kinds(self.choice(key, default.value, tuple(k.value for k in kinds)))

    def choice(self, key: str, default: C, choices: tuple[C, ...]) -> C:
        value = self.get(key, str, default)
        if value not in choices:
            raise self.fail(key, f"{value!r} is not one of {', '.join(choices)}")
        return value

    def sub(self, key: str) -> Reader:
        return Reader(self.source, f"{self.prefix}{key}.", self.get(key, dict, {}), self.path)

    def done(self) -> None:
        unknown = sorted(set(self.table) - self.used)
        if unknown:
            raise self.fail(unknown[0], "unknown key (misspelt?)")


def read_document(
    path: str | os.PathLike[str] | None = None,
) -> tuple[dict[str, Any], str, Path | None]:
    """The parsed TOML, a name for messages, and the file (None: the default is absent).

    ``path``, else ``$GMD_CONFIG``, else ``/etc/gmd/gmd.toml``. A missing default file means
    "all defaults"; a missing file that was asked for is an error.
    """
    explicit = path if path is not None else os.environ.get("GMD_CONFIG")
    p = Path(explicit) if explicit else DEFAULT_PATH
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{p}: no such configuration file") from None
        return {}, f"{p} (absent: all defaults)", None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from None
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return document, str(p), p
