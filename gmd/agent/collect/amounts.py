"""Amounts named by a field list of the wire contract (:mod:`gmd.wire`), made from that list.

The agent measures what the batch format names: a VM's use (:data:`gmd.wire.USAGE_FIELDS`) and
its host's capacity (:data:`gmd.wire.CAPACITY_FIELDS`). Spelled out here as fields, each would
be a second copy of the contract that a new resource must change; made from the list, a
resource added to :data:`gmd.wire.RESOURCES` needs only a collector that measures it, and a
collector that leaves it out fails where it builds the amounts (:meth:`FieldAmounts.of`), not
in a batch the daemon refuses.
"""

from __future__ import annotations

from typing import ClassVar, Self


class FieldAmounts:
    """One amount per name of ``FIELDS``, in that order: given by position (all or none: none
    is all zero) or by name (:meth:`of`, every one), read by name (``amounts.cpu_s``)."""

    FIELDS: ClassVar[tuple[str, ...]] = ()
    _AT: ClassVar[dict[str, int]] = {}
    __slots__ = ("values",)

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls._AT = {f: i for i, f in enumerate(cls.FIELDS)}

    def __init__(self, *values: float) -> None:
        if values and len(values) != len(self.FIELDS):
            raise ValueError(f"{len(values)} amounts for {len(self.FIELDS)} fields")
        self.values: tuple[float, ...] = (
            tuple(map(float, values)) if values else (0.0,) * len(self.FIELDS)
        )

    @classmethod
    def of(cls, **amounts: float) -> Self:
        """The amounts by name: every one of ``FIELDS`` and no other."""
        if amounts.keys() != cls._AT.keys():
            missing, extra = sorted(cls._AT.keys() - amounts), sorted(amounts.keys() - cls._AT)
            raise ValueError(f"{cls.__name__}: missing {missing}, unknown {extra}")
        return cls(*(amounts[f] for f in cls.FIELDS))

    def __getattr__(self, name: str) -> float:
        at = type(self)._AT.get(name)
        if at is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self.values[at]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FieldAmounts)
            and type(other) is type(self)
            and self.values == other.values
        )

    def __hash__(self) -> int:
        return hash(self.values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.as_wire()})"

    def as_wire(self) -> dict[str, float]:
        """The amounts as the batch format has them."""
        return dict(zip(self.FIELDS, self.values, strict=True))
