"""Things the daemon's log says once, not at every batch: a VM Placement contradicts comes
back in its host's batch every interval it runs, and one line per interval per VM would drown
the log of a cloud where one host lies."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from gmd.common.units import DAY_S


class SaidOnce:
    """Remembers what was said, each for ``every_s`` (then it may be said again, so that a
    lasting problem stays in the log), at most ``most`` at a time (the oldest forgotten first:
    a host naming millions of made-up VMs cannot grow it)."""

    def __init__(
        self,
        every_s: float = float(DAY_S),
        most: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_s, self.most, self.clock = every_s, most, clock
        self._said: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._lock = threading.Lock()

    def first(self, scope: str, things: Iterable[str]) -> set[str]:
        """Of ``things`` (of ``scope``: a host), those not said within ``every_s``, now
        remembered as said."""
        now = self.clock()
        fresh = set()
        with self._lock:
            for thing in things:
                key = (scope, thing)
                at = self._said.get(key)
                if at is not None and now - at < self.every_s:
                    continue
                fresh.add(thing)
                self._said[key] = now
                self._said.move_to_end(key)
            while len(self._said) > self.most:
                self._said.popitem(last=False)
        return fresh
