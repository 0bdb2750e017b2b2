"""CloudShare's choice rule, shared by the live broker (:mod:`gmd.broker`) and the simulator
(:mod:`gmd.sim.federation`): one owner, so that what the two are compared on is the same rule.

A broker with spare capacity picks, among the queued requests that fit it, the organisation of
the highest priority (DirectContr's contribution less utility: core-seconds its sites lent to
other organisations' requests less core-seconds its requests used of other organisations'
sites; one never seen has 0), then that organisation's longest-waiting request; ties go to the
older queue entry (its name: ZooKeeper's sequence, or the simulator's counter).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar


@dataclass(frozen=True)
class Summary:
    """An organisation's history in the federation, summed: what its sites lent to other
    organisations' requests and what its requests used of other organisations' sites (in
    core-seconds). ZooKeeper keeps one per organisation; the simulator's model keeps the same."""

    org: str
    contributed: float = 0.0
    used: float = 0.0

    @property
    def priority(self) -> float:
        """DirectContr's priority: contribution less utility."""
        return self.contributed - self.used

    def plus(self, contributed: float = 0.0, used: float = 0.0) -> Summary:
        """This summary after a completion lent ``contributed`` or used ``used``."""
        return Summary(self.org, self.contributed + contributed, self.used + used)


class Waiting(Protocol):
    """What the rule reads of a queued request."""

    @property
    def org(self) -> str: ...

    @property
    def submitted_s(self) -> float: ...


T = TypeVar("T")


def choice_order(
    queued: Iterable[T],
    priorities: Mapping[str, float],
    request: Callable[[T], Waiting],
    name: Callable[[T], str],
) -> list[T]:
    """``queued`` in the order a broker tries them: highest-priority organisation first, then
    the longest waiting, then the older entry."""

    def key(item: T) -> tuple[float, float, str]:
        r = request(item)
        return (-priorities.get(r.org, 0.0), r.submitted_s, name(item))

    return sorted(queued, key=key)


def reservation(capacity: float, free: float) -> float:
    """The share of a site's federation capacity in use (1 when it offers none)."""
    return 1.0 if capacity <= 0 else (capacity - free) / capacity


def takes_work(capacity: float, free: float, threshold: float) -> bool:
    """Whether a site takes queued requests now: its reservation is below ``threshold``."""
    return capacity > 0 and reservation(capacity, free) < threshold
