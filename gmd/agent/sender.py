"""Replays the spool to the daemon, oldest first, each batch under the key it was made with.

A batch leaves the spool only when the daemon has it (``accepted``, or ``duplicate`` when an
earlier post arrived but its answer did not) or can never take it (``rejected``: logged as an
error with the daemon's explanation, and counted). The first batch the daemon cannot take now
(down, 5xx, bad token, no answer in time) stops the replay until the next tick, so batches
arrive in order. One exception: a batch whose answer was lost (the request went out whole, the
connection closed before an answer) stays in the spool for the next tick, but the batches
behind it go on. The daemon is there and may well hold it; waiting on it would make every
later batch late for as long as answers are lost, which a daemon cannot tell from a host cut
off (seen in the soak: 37 s of lost answers made one host's batches arrive after the grace).
The daemon does not need batches in order (each carries its own interval and key).

A new batch can be scheduled: its first post waits until a given time (``agent.post_jitter_s``
spreads the hosts' posts after an interval's end), and the batches behind it wait with it, so
the order holds. The schedule lives in memory only: a batch found in the spool after a restart
is posted at once, which is also what its lateness calls for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gmd.agent.client import DaemonClient, Delivery, PostOutcome
from gmd.agent.spool import Spool, Spooled

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DrainReport:
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    waiting: int = 0
    """batches still in the spool afterwards"""
    unavailable: str | None = None
    """why the daemon could not take the next batch, if it could not"""
    missed: int = 0
    """scheduled batches that were due but are still in the spool (the daemon could not take
    them, or the time budget ran out): their first chance to go has passed"""
    unanswered: int = 0
    """batches posted whose answers were lost: still in the spool, sent again next tick"""


class Sender:
    def __init__(
        self,
        spool: Spool,
        client: DaemonClient,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        chunk: int = 32,
    ) -> None:
        self.spool, self.client = spool, client
        self._monotonic = monotonic
        self._clock = clock
        self._chunk = chunk
        self._down_since_logged = False
        self._first_post_s: dict[str, float] = {}

    def schedule(self, key: str, at_s: float) -> None:
        """Post the spooled batch ``key`` first at ``at_s`` (the caller's clock, as ``now_s``
        in :meth:`drain`), not before. Its later retries follow the ticks as any batch's do."""
        self._first_post_s[key] = at_s

    def forget(self, key: str) -> None:
        """The batch ``key`` left the spool otherwise (dropped to keep the spool's bounds)."""
        self._first_post_s.pop(key, None)

    def next_post_s(self) -> float | None:
        """When the earliest scheduled batch is due, if any is waiting for its first post."""
        return min(self._first_post_s.values(), default=None)

    def drain(self, budget_s: float | None = None, now_s: float | None = None) -> DrainReport:
        """Post spooled batches in order until the spool is empty, the daemon cannot take
        one, the next one is scheduled after ``now_s`` (default: the clock), or ``budget_s``
        has passed (the rest goes on the next tick)."""
        now = self._clock() if now_s is None else now_s
        deadline = None if budget_s is None else self._monotonic() + budget_s
        accepted = duplicates = rejected = missed = unanswered = 0
        unavailable: str | None = None
        lost: str | None = None
        status: int | None = None
        held = out_of_time = False
        after = 0
        while unavailable is None and not (held or out_of_time):
            batch = self.spool.oldest(self._chunk, after)
            if not batch:
                break
            for item in batch:
                after = item.seq
                if self._first_post_s.get(item.key, now) > now:
                    held = True
                    break
                if deadline is not None and self._monotonic() > deadline:
                    out_of_time = True
                    break
                first = self._first_post_s.pop(item.key, None) is not None
                outcome = self.client.post_batch(item.body)
                if outcome.kind == Delivery.unavailable:
                    missed += first
                    if outcome.answer_lost:
                        unanswered += 1
                        lost = outcome.detail
                        continue
                    status = outcome.status
                    unavailable = (
                        f"{outcome.detail} (HTTP {outcome.status})"
                        if outcome.status
                        else outcome.detail
                    )
                    break
                self.spool.remove(item.seq)
                if outcome.kind == Delivery.delivered:
                    if outcome.detail == "duplicate":
                        duplicates += 1
                    else:
                        accepted += 1
                    if outcome.set_aside:
                        self._log_set_aside(item, outcome)
                    continue
                rejected += 1
                self._log_rejected(item, outcome)
        # Due batches not reached: behind a batch that is not due yet they simply go with it;
        # otherwise their first chance has passed. Either way their time is no longer theirs.
        due = [key for key, at in self._first_post_s.items() if at <= now]
        for key in due:
            del self._first_post_s[key]
        if not held:
            missed += len(due)
        waiting, _bytes = self.spool.size()
        trouble = unavailable or (
            f"the answers to {unanswered} batches were lost ({lost})" if unanswered else None
        )
        self._say_whether_down(trouble, status, accepted + duplicates, waiting)
        return DrainReport(accepted, duplicates, rejected, waiting, unavailable, missed, unanswered)

    def _log_set_aside(self, item: Spooled, outcome: PostOutcome) -> None:
        more = len(outcome.set_aside) - 1
        log.warning(
            "daemon %s set aside %d VM(s) of batch %s that Placement contradicts: %s%s",
            self.client.base_url,
            len(outcome.set_aside),
            item.key,
            outcome.set_aside[0],
            f" (and {more} more)" if more else "",
        )

    def _log_rejected(self, item: Spooled, outcome: PostOutcome) -> None:
        log.error(
            "daemon %s rejected batch %s (interval %d) with HTTP %s: %s — dropped, it"
            " can never be accepted",
            self.client.base_url,
            item.key,
            item.interval_start_s,
            outcome.status,
            outcome.detail,
        )

    def _say_whether_down(
        self, trouble: str | None, status: int | None, delivered: int, waiting: int
    ) -> None:
        """The daemon cannot take batches (``trouble`` says why; ``status``: its HTTP answer,
        if one): said once until it takes one again, which is said too."""
        if trouble:
            if not self._down_since_logged:
                # A refused token, or a clock ahead, is the operator's to fix: say it as loudly
                # as a rejection.
                log.log(
                    logging.ERROR if status in (401, 403, 425) else logging.WARNING,
                    "daemon %s cannot take batches: %s; %d batches spooled, retrying every tick",
                    self.client.base_url,
                    trouble,
                    waiting,
                )
            self._down_since_logged = True
        elif self._down_since_logged and delivered:
            log.info(
                "daemon %s is taking batches again (%d delivered, %d waiting)",
                self.client.base_url,
                delivered,
                waiting,
            )
            self._down_since_logged = False
