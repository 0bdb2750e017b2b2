"""The HTTP client for the daemon's ``/v1`` API (httpx), reduced to what the sender decides on.

A post ends in one of three ways, and the sender acts on each differently:

- ``delivered``: 200, ``accepted`` or ``duplicate`` (a retry of a batch the daemon already
  holds — the usual end of a post whose answer was lost);
- ``rejected``: a 4xx that says the batch itself is wrong (invalid, interval length mismatch,
  key reused with other content, too large): resending it can never succeed;
- ``unavailable``: connection refused, timeout, 5xx — and also 401/403 (the host's token is
  wrong or not yet configured on the daemon: the operator can fix that, and the usage must
  still be there when they have), 408, 425 (the batch is early: this host's clock is ahead
  of the daemon's by more than its ``clock_skew_s``) and 429. The batch stays in the spool.

An ``unavailable`` post whose request went out whole and whose connection then closed without
an answer is marked ``answer_lost``: something is there and reading, and the daemon may well
hold the batch. The sender does not let such a batch hold up the ones behind it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from gmd import GmdError
from gmd.wire import SAMPLES_PATH, HostCapabilities, HostPlan, PlanReport

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({401, 403, 408, 425, 429})

ANSWER_LOST = (httpx.RemoteProtocolError, httpx.ReadError)
"""Transport errors raised after the request was written: the connection closed (or was reset)
before an answer. A timeout is not one of them: a daemon that does not answer in time is slow
or stopped, and every post behind would wait as long."""


class Delivery(StrEnum):
    """What became of a post to the daemon."""

    delivered = "delivered"
    """the daemon took it (stored, or already had it)"""
    rejected = "rejected"
    """a 4xx: it will never be acceptable as it is"""
    unavailable = "unavailable"
    """the daemon could not be reached or answered 5xx/429: sent again later"""


@dataclass(frozen=True, slots=True)
class PostOutcome:
    kind: Delivery
    status: int | None
    detail: str
    """the daemon's ``status`` (accepted/duplicate) or ``detail``, or the transport error"""
    answer_lost: bool = False
    """the request went out and the connection closed before an answer (see the module
    docstring)"""
    set_aside: tuple[str, ...] = ()
    """of a stored batch, the VMs the daemon set aside (Placement contradicts them), with why"""


def _unreached(exc: httpx.HTTPError) -> PostOutcome:
    """A post that ended in a transport error, classified."""
    return PostOutcome(
        Delivery.unavailable,
        None,
        f"{type(exc).__name__}: {exc}",
        answer_lost=isinstance(exc, ANSWER_LOST),
    )


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


class PlanUnavailable(GmdError):
    """The plan could not be fetched (daemon down, 5xx, refused, unreadable answer): the agent
    keeps the VMs' settings as they are. The message says why."""


class DaemonClient:
    """Posts batches to one daemon with the host's bearer token, fetches the host's throttling
    plan and reports what was done with it.

    ``transport`` is for tests (an httpx transport that fails on demand).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Content-Type": "application/json", "User-Agent": "gmd-agent"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport
        )

    def post_batch(self, body: bytes) -> PostOutcome:
        """POST one ``SampleBatch`` (already JSON-encoded, as the spool holds it)."""
        try:
            response = self._http.post(SAMPLES_PATH, content=body)
        except httpx.HTTPError as exc:
            return _unreached(exc)
        status = "accepted"
        aside: tuple[str, ...] = ()
        if response.status_code == 200:
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                receipt = response.json()
                status = str(receipt.get("status", "accepted"))
                aside = tuple(str(why) for why in receipt.get("set_aside") or ())
        return dataclasses.replace(_classified(response, status), set_aside=aside)

    def get_plan(self, host: str) -> HostPlan:
        """``GET /v1/plan/{host}``; raises :class:`PlanUnavailable` for anything but a valid plan
        (the caller must then leave every VM as it is: no news is not "lift the throttles")."""
        try:
            response = self._http.get(f"/v1/plan/{quote(host, safe='')}")
        except httpx.HTTPError as exc:
            raise PlanUnavailable(f"{type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise PlanUnavailable(f"HTTP {response.status_code}: {_detail(response)}")
        try:
            return HostPlan.model_validate_json(response.content)
        except ValidationError as exc:
            raise PlanUnavailable(f"not a plan: {exc.errors()[:3]}") from None

    def post_report(self, host: str, report: PlanReport) -> PostOutcome:
        """``POST /v1/plan/{host}/report``, classified like :meth:`post_batch`."""
        try:
            # restore_all only when set: a plan's report reads as it did to an older daemon
            body = report.model_dump_json(exclude=None if report.restore_all else {"restore_all"})
            response = self._http.post(f"/v1/plan/{quote(host, safe='')}/report", content=body)
        except httpx.HTTPError as exc:
            return _unreached(exc)
        return _classified(response, "recorded")

    def put_capabilities(self, host: str, caps: HostCapabilities) -> PostOutcome:
        """``PUT /v1/hosts/{host}/capabilities``, classified like :meth:`post_batch`."""
        try:
            response = self._http.put(
                f"/v1/hosts/{quote(host, safe='')}/capabilities", content=caps.model_dump_json()
            )
        except httpx.HTTPError as exc:
            return _unreached(exc)
        return _classified(response, "recorded")

    def close(self) -> None:
        self._http.close()


def _classified(response: httpx.Response, done: str) -> PostOutcome:
    """A post's answer as the sender acts on it (see the module docstring)."""
    if response.status_code == 200:
        return PostOutcome(Delivery.delivered, 200, done)
    detail = _detail(response)
    if response.status_code >= 500 or response.status_code in RETRY_STATUSES:
        return PostOutcome(Delivery.unavailable, response.status_code, detail)
    return PostOutcome(Delivery.rejected, response.status_code, detail)
