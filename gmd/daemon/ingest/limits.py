"""What one host may claim of the ledger (``[daemon.limits]``): the bounds a host token cannot
pass, however it spells its batches and reports.

Without them one token created 220,000 customers, VMs and samples in 68 s and 50,000
enforcement-log rows of 2,000 characters in 15 s. Each bound is per host and answers with the
configuration key that sets it:

- distinct batches per interval of the ledger (a retry of a stored batch is a duplicate and
  does not count): 422, since a later try cannot fit either;
- customers and VMs a host introduces (ones the ledger does not know) per interval of wall-clock
  time: 429 with ``Retry-After`` (the agent keeps the batch in its spool and sends it in a
  later interval), or 422 when the batch alone holds more than the bound. A host's first batch
  after the daemon starts is exempt, up to ``daemon.max_batch_vms``: a new ledger, or a new
  daemon, takes every host's VMs at once;
- enforcement-log rows per interval of wall-clock time (one per VM in a plan report): 429, or
  413 for a report larger than the bound; error texts are cut at ``max_error_chars`` (a host
  cannot shorten what libvirt said, and refusing the report would lose the failure).

The counts live in this daemon's memory: several daemons behind a balancer each allow the
bounds, and a restart starts them afresh.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gmd.daemon.api.errors import Refused
from gmd.daemon.api.metrics import Rejection
from gmd.daemon.config import LimitsConfig

KEY = "daemon.limits"
"""the configuration table the bounds live in, as refusals name it"""

_PRUNE_ABOVE = 10_000
"""entries kept before the counts of past intervals are first dropped"""


def _pruned(counts: dict[Any, Any], keep: Callable[[Any, Any], bool]) -> tuple[dict[Any, Any], int]:
    """``counts`` without the entries ``keep`` refuses, and the size at which to prune next:
    twice what is left, so that a cloud with more hosts than :data:`_PRUNE_ABOVE`, whose
    counts are all current, rebuilds its map once per doubling rather than on every batch
    (at 20,000 hosts that rebuild had cost more than the batch)."""
    left = {k: v for k, v in counts.items() if keep(k, v)}
    return left, max(_PRUNE_ABOVE, 2 * len(left))


@dataclass
class _Window:
    """What a host introduced in one wall-clock interval."""

    index: int
    customers: int = 0
    vms: int = 0
    rows: int = 0


@dataclass(frozen=True)
class HostClaim:
    """What :meth:`HostLimits.admit_batch` counted for one batch, to give back if the batch is
    not stored after all (a full disk must not use up a host's exemption or its bounds)."""

    host: str
    interval_start_s: int
    window: int | None
    """the wall-clock interval counted in; None: the host's exempt first batch"""
    customers: int = 0
    vms: int = 0


@dataclass
class HostLimits:
    """The counts behind :class:`~gmd.daemon.config.LimitsConfig`'s bounds, per host.
    ``interval_s`` is accounting's interval, the window of the per-interval bounds."""

    config: LimitsConfig
    interval_s: int
    _windows: dict[str, _Window] = field(default_factory=dict)
    _batches: dict[tuple[str, int], int] = field(default_factory=dict)
    _prune_windows_above: int = _PRUNE_ABOVE
    _prune_batches_above: int = _PRUNE_ABOVE
    _started: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- batches ------------------------------------------------------------------------------

    def admit_batch(
        self,
        host: str,
        interval_start_s: int,
        now_s: float,
        customers: int,
        vms: int,
        oldest_s: float,
    ) -> HostClaim:
        """Let a new batch of ``host`` for the interval of ``interval_start_s``, which would
        introduce ``customers`` and ``vms`` new to the ledger, be stored at ``now_s``, or
        refuse it. What is let in is counted at once (two batches at a time cannot both take
        the last room); :meth:`release` gives it back if the batch is not stored. Counts of
        intervals before ``oldest_s``, for which no batch can arrive any more, are forgotten
        when there are many."""
        c = self.config
        with self._lock:
            key = (host, interval_start_s)
            stored = self._batches.get(key, 0)
            if stored >= c.batches_per_interval:
                raise Refused(
                    422,
                    f"host {host} already stored {stored} batches for interval"
                    f" {interval_start_s}; at most {c.batches_per_interval}"
                    f" ({KEY}.batches_per_interval): send an interval's VMs in one batch, and"
                    " retry a batch under its own key",
                    reason=Rejection.over_limit,
                )
            if host in self._started:
                window = self._window(host, now_s)
                for what, key_name, count, held, bound in (
                    (
                        "customers",
                        "new_customers_per_interval",
                        customers,
                        window.customers,
                        c.new_customers_per_interval,
                    ),
                    ("VMs", "new_vms_per_interval", vms, window.vms, c.new_vms_per_interval),
                ):
                    if count and held + count > bound:
                        raise self._over(host, now_s, key_name, bound, count, held, what)
                window.customers += customers
                window.vms += vms
                claim = HostClaim(host, interval_start_s, window.index, customers, vms)
            else:
                # The host's first batch since this daemon started: a new ledger or daemon.
                self._started.add(host)
                claim = HostClaim(host, interval_start_s, None)
            self._batches[key] = stored + 1
            if len(self._batches) > self._prune_batches_above:
                self._batches, self._prune_batches_above = _pruned(
                    self._batches, lambda k, _n: k[1] >= oldest_s
                )
        return claim

    def release(self, claim: HostClaim) -> None:
        """Give back what :meth:`admit_batch` counted for a batch that was not stored."""
        with self._lock:
            key = (claim.host, claim.interval_start_s)
            if self._batches.get(key, 0) > 0:
                self._batches[key] -= 1
            if claim.window is None:
                self._started.discard(claim.host)
                return
            window = self._windows.get(claim.host)
            if window is not None and window.index == claim.window:
                window.customers = max(window.customers - claim.customers, 0)
                window.vms = max(window.vms - claim.vms, 0)

    # -- enforcement-log rows ------------------------------------------------------------------

    def admit_rows(self, host: str, now_s: float, rows: int) -> None:
        """Let ``host`` write ``rows`` enforcement-log rows at ``now_s``, or refuse the report."""
        bound = self.config.report_rows_per_interval
        with self._lock:
            window = self._window(host, now_s)
            if window.rows + rows > bound:
                if rows > bound:
                    raise Refused(
                        413,
                        f"report of {rows} results; at most {bound} a report"
                        f" ({KEY}.report_rows_per_interval)",
                        reason=Rejection.over_limit,
                    )
                raise self._over(
                    host, now_s, "report_rows_per_interval", bound, rows, window.rows, "rows"
                )
            window.rows += rows

    def release_rows(self, host: str, now_s: float, rows: int) -> None:
        """Give back ``rows`` that :meth:`admit_rows` counted at ``now_s`` for a report that was
        not recorded (a database error: the agent sends it again)."""
        with self._lock:
            window = self._windows.get(host)
            if window is not None and window.index == self._index(now_s):
                window.rows = max(window.rows - rows, 0)

    def clip_error(self, text: str | None) -> str | None:
        """A host's error text, cut to ``max_error_chars`` with a mark saying how much."""
        bound = self.config.max_error_chars
        if text is None or len(text) <= bound:
            return text
        cut = len(text) - bound
        return f"{text[:bound]}… ({cut} more characters cut: {KEY}.max_error_chars)"

    # -- windows -------------------------------------------------------------------------------

    def _index(self, now_s: float) -> int:
        """The wall-clock interval of ``now_s``: the window every per-interval count is in."""
        return math.floor(now_s / self.interval_s)

    def _window(self, host: str, now_s: float) -> _Window:
        """The host's counts for the wall-clock interval of ``now_s`` (lock held)."""
        index = self._index(now_s)
        window = self._windows.get(host)
        if window is None or window.index != index:
            if len(self._windows) > self._prune_windows_above:
                self._windows, self._prune_windows_above = _pruned(
                    self._windows, lambda _h, w: w.index == index
                )
            window = self._windows[host] = _Window(index)
        return window

    def _over(
        self, host: str, now_s: float, key: str, bound: int, count: int, held: int, what: str
    ) -> Refused:
        """The refusal of ``count`` more ``what`` from ``host``, which has ``held`` of its
        ``bound`` this interval: 429 until the next interval, 422 when ``count`` alone is more."""
        if count > bound:
            return Refused(
                422,
                f"host {host}: {count} new {what} in one request; at most {bound} an interval"
                f" ({KEY}.{key})",
                reason=Rejection.over_limit,
            )
        retry = math.ceil((self._index(now_s) + 1) * self.interval_s - now_s)
        return Refused(
            429,
            f"host {host}: {count} new {what}, after {held} this interval; at most {bound} an"
            f" interval ({KEY}.{key}): retry in {retry} s",
            reason=Rejection.over_limit,
            headers={"Retry-After": str(max(retry, 1))},
        )
