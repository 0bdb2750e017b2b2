"""A cgroup control file's content as a state: item → value, where the item is ``""`` for
one-value files, ``"default"`` or ``"MAJ:MIN"`` for files with one line per device (pure).

Comparing states, not text, is what makes the writes idempotent and the restores exact
(:mod:`gmd.agent.apply.cgroupfs_writes`): each file's :class:`ControlFormat` parses its text,
and says the line that sets an item and the one that removes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

IO_MAX_KEYS = ("rbps", "wbps", "riops", "wiops")

State = dict[str, str]


@dataclass(frozen=True, slots=True)
class ControlFormat:
    """How one control file reads and is written: its text parsed to a state, the line that
    sets an item to a value, and the line that removes an item (``None``: items are never
    removed, the file holds one value)."""

    parse: Callable[[str], State]
    line: Callable[[str, str], str]
    removal: Callable[[str], str] | None = None


def _parse_scalar(text: str) -> State:
    return {"": " ".join(text.split())}


def _parse_keyed(text: str) -> State:
    state: State = {}
    for raw in text.splitlines():
        parts = raw.split()
        if not parts:
            continue
        if len(parts) == 1:  # io.weight on some kernels: a bare default weight
            state["default"] = parts[0]
        elif len(parts) == 2:
            state[parts[0]] = parts[1]
        else:
            raise ValueError(f"unexpected line {raw!r}")
    return state


def io_max_fields(value: str) -> dict[str, str]:
    """One device's ``io.max`` limits, ``rbps=… wbps=…``, every key of :data:`IO_MAX_KEYS`
    given (``max`` where the text leaves it out)."""
    fields = dict.fromkeys(IO_MAX_KEYS, "max")
    for token in value.split():
        key, sep, val = token.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"unexpected io.max field {token!r}")
        fields[key] = val
    return fields


def io_max_value(fields: Mapping[str, str]) -> str:
    """The ``io.max`` value of one device's limits, every key in the kernel's order."""
    return " ".join(f"{key}={fields[key]}" for key in IO_MAX_KEYS)


def _parse_io_max(text: str) -> State:
    state: State = {}
    for raw in text.splitlines():
        device, _, rest = raw.strip().partition(" ")
        if not device:
            continue
        fields = io_max_fields(rest)
        if any(v != "max" for v in fields.values()):  # the kernel does not list all-max devices
            state[device] = io_max_value(fields)
    return state


_SCALAR = ControlFormat(parse=_parse_scalar, line=lambda _item, value: value)
_IO_WEIGHT = ControlFormat(
    parse=_parse_keyed,
    line=lambda item, value: f"{item} {value}",
    removal=lambda item: f"{item} default",
)
_IO_MAX = ControlFormat(
    parse=_parse_io_max,
    line=lambda item, value: f"{item} {value}",
    removal=lambda item: f"{item} {io_max_value(dict.fromkeys(IO_MAX_KEYS, 'max'))}",
)
# blkio.throttle.*_device: "MAJ:MIN BYTES" per line; writing "MAJ:MIN 0" removes the limit.
_V1_DEVICE = ControlFormat(
    parse=_parse_keyed,
    line=lambda item, value: f"{item} {value}",
    removal=lambda item: f"{item} 0",
)


def _parse_cfs_quota(text: str) -> State:
    # The kernel stores any negative quota as -1 ("no cap"), so they all mean the same.
    value = text.strip()
    return {"": "-1" if value.startswith("-") else value}


_CFS_QUOTA = ControlFormat(parse=_parse_cfs_quota, line=lambda _item, value: value)

_FORMATS: dict[str, ControlFormat] = {
    "cpu.cfs_quota_us": _CFS_QUOTA,
    "io.weight": _IO_WEIGHT,
    "io.bfq.weight": _IO_WEIGHT,
    "io.max": _IO_MAX,
    "blkio.throttle.read_bps_device": _V1_DEVICE,
    "blkio.throttle.write_bps_device": _V1_DEVICE,
}


def control_format(filename: str) -> ControlFormat:
    """The format of control file ``filename`` (a one-value file unless named otherwise)."""
    return _FORMATS.get(filename, _SCALAR)


def render_state(state: State) -> str:
    """A state for a message: ``item value; …``, or ``(empty)``."""
    return "; ".join(f"{k} {v}".strip() for k, v in state.items()) or "(empty)"
