"""Replays the spool to the daemon, oldest first, each batch under the key it was made with.

A batch leaves the spool only when the daemon has it (``accepted``, or ``duplicate`` when an
earlier post arrived but its answer did not) or can never take it (``rejected``: logged as an
error with the daemon's explanation, and counted). The first batch the daemon cannot take now
(down, 5xx, bad token) stops the replay until the next tick, so batches arrive in order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gmd.agent.client import DaemonClient
from gmd.agent.spool import Spool

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


class Sender:
    def __init__(
        self,
        spool: Spool,
        client: DaemonClient,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        chunk: int = 32,
    ) -> None:
        self.spool, self.client = spool, client
        self._monotonic = monotonic
        self._chunk = chunk
        self._down_since_logged = False

    def drain(self, budget_s: float | None = None) -> DrainReport:
        """Post spooled batches in order until the spool is empty, the daemon cannot take
        one, or ``budget_s`` has passed (the rest goes on the next tick)."""
        deadline = None if budget_s is None else self._monotonic() + budget_s
        accepted = duplicates = rejected = 0
        unavailable: str | None = None
        status: int | None = None
        out_of_time = False
        while unavailable is None and not out_of_time:
            batch = self.spool.oldest(self._chunk)
            if not batch:
                break
            for item in batch:
                if deadline is not None and self._monotonic() > deadline:
                    out_of_time = True
                    break
                outcome = self.client.post_batch(item.body)
                if outcome.kind == "unavailable":
                    status = outcome.status
                    unavailable = (
                        f"{outcome.detail} (HTTP {outcome.status})"
                        if outcome.status
                        else outcome.detail
                    )
                    break
                self.spool.remove(item.seq)
                if outcome.kind == "delivered":
                    if outcome.detail == "duplicate":
                        duplicates += 1
                    else:
                        accepted += 1
                    continue
                rejected += 1
                log.error(
                    "daemon %s rejected batch %s (interval %d) with HTTP %s: %s — dropped, it"
                    " can never be accepted",
                    self.client.base_url,
                    item.key,
                    item.interval_start_s,
                    outcome.status,
                    outcome.detail,
                )
        waiting, _bytes = self.spool.size()
        if unavailable:
            if not self._down_since_logged:
                # A refused token is the operator's to fix: say it as loudly as a rejection.
                log.log(
                    logging.ERROR if status in (401, 403) else logging.WARNING,
                    "daemon %s cannot take batches: %s; %d batches spooled, retrying every tick",
                    self.client.base_url,
                    unavailable,
                    waiting,
                )
            self._down_since_logged = True
        elif self._down_since_logged and accepted + duplicates:
            log.info(
                "daemon %s is taking batches again (%d delivered, %d waiting)",
                self.client.base_url,
                accepted + duplicates,
                waiting,
            )
            self._down_since_logged = False
        return DrainReport(accepted, duplicates, rejected, waiting, unavailable)
