"""Delivery against a real in-process daemon: spool, replay in order with original keys,
exactly-once in the ledger across daemon outages, lost answers and agent restarts, and the
posts spread over ``post_jitter_s`` after each interval's end.

The host is a scripted collector on a scripted clock, so every interval's amounts are known
exactly: a VM using ``cores`` for 60 s has ``cpu_s == 60 * cores`` in the ledger, no more
(a batch counted twice) and no less (a delta lost).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import sqlalchemy as sa

from gmd.agent.client import DaemonClient
from gmd.agent.config import AgentConfig, parse_agent
from gmd.agent.loop import AgentLoop
from gmd.agent.metrics import AgentMetrics
from gmd.agent.sender import Sender
from gmd.agent.spool import Spool, SpoolError
from tests.support.agent_fixtures import ScriptedCollector, ScriptedVm
from tests.support.daemon_support import (
    Daemon,
    aligned_past,
    as_uuid,
    make_config,
    serving,
    token_of,
)

HOST = "cmp-1"
INTERVAL_S = 60
TICK_S = 10


class Flaky(httpx.BaseTransport):
    """The real HTTP transport, which can be made to fail: ``down`` refuses connections,
    ``lose_answers`` delivers the request but loses the response (a timeout after sending),
    ``cut_answers`` delivers it and closes the connection before the response."""

    def __init__(self) -> None:
        self.real = httpx.HTTPTransport()
        self.down = False
        self.lose_answers = False
        self.cut_answers = False
        self.posts = 0
        self.clock: Callable[[], float] | None = None
        self.sent: list[tuple[float, int]] = []
        """(the clock's time, the batch's interval) of every batch post that got through"""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused (test: daemon down)", request=request)
        self.posts += 1
        if self.clock is not None and request.url.path == "/v1/samples":
            self.sent.append((self.clock(), json.loads(request.content)["interval_start_s"]))
        response = self.real.handle_request(request)
        if self.lose_answers:
            response.read()
            raise httpx.ReadTimeout("timed out (test: answer lost)", request=request)
        if self.cut_answers:
            response.read()
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response.", request=request
            )
        return response


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    config = make_config(f"sqlite:///{tmp_path / 'ledger.db'}", {HOST: "operator"})
    with serving(config) as d:
        yield d


def agent_config(tmp_path: Path, url: str, **agent: Any) -> AgentConfig:
    table = {
        "daemon_url": url,
        "token": token_of(HOST),
        "host": HOST,
        "tick_s": TICK_S,
        "interval_s": INTERVAL_S,
        "spool_path": str(tmp_path / "spool.db"),
        "network_bytes_per_s": 1.25e9,
        # Most tests follow a batch tick by tick; the spread of posts has tests of its own.
        "post_jitter_s": 0,
        **agent,
    }
    return parse_agent({"agent": table}, "agent-test.toml")


class Draws(random.Random):
    """The agent's random numbers in [0, 1), as a test lists them."""

    def __init__(self, *values: float) -> None:
        super().__init__(0)
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


class Host:
    """An agent on a scripted clock, wired as gmd-agent wires it."""

    def __init__(
        self,
        tmp_path: Path,
        url: str,
        start_s: int,
        *,
        rng: random.Random | None = None,
        **agent: Any,
    ) -> None:
        self.tmp_path, self.url, self.rng = tmp_path, url, rng
        self.now = float(start_s - TICK_S)
        self.vms = [
            ScriptedVm(as_uuid("vm-a"), "proj-a", cores=1.5, started_s=start_s - 500),
            ScriptedVm(
                as_uuid("vm-b"), "proj-b", cores=0.25, rss_bytes=3 * 2**29, started_s=start_s - 9
            ),
            ScriptedVm(
                as_uuid("vm-c"), "proj-a", cores=0.0, read_bytes_per_s=0, started_s=start_s - 70
            ),
        ]
        self.collector = ScriptedCollector(lambda: self.now, self.vms)
        self.transport = Flaky()
        self.config = agent_config(tmp_path, url, **agent)
        self.agent: AgentLoop | None = None
        self.start()
        self.ticks(1)  # the first reading, at start_s: a baseline only

    def start(self) -> None:
        spool = Spool(
            self.config.spool_path,
            max_bytes=self.config.spool_max_bytes,
            max_batches=self.config.spool_max_batches,
        )
        client = DaemonClient(self.url, self.config.token, transport=self.transport)
        self.agent = AgentLoop(
            self.config,
            self.collector,
            spool,
            Sender(spool, client),
            AgentMetrics(),
            sys_class_net=self.tmp_path / "no-sys",
            rng=self.rng,
        )

    def crash(self) -> None:
        """Gone without a word: nothing after the last committed tick is saved."""
        assert self.agent is not None
        self.agent.spool.close()
        self.agent = None

    def ticks(self, n: int) -> None:
        assert self.agent is not None
        for _ in range(n):
            self.now += TICK_S
            self.agent.tick(self.now)

    def metric(self, name: str, **labels: str) -> float:
        assert self.agent is not None
        value = self.agent.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value


def ledger(d: Daemon) -> tuple[dict[tuple[int, str], tuple[float, ...]], dict[int, int]]:
    """(interval start, VM) → summed amounts, and interval start → batches."""
    with d.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT i.start_s, v.uuid, s.cpu_s, s.memory_byte_s, s.disk_read_bytes,"
                " s.disk_write_bytes, s.network_rx_bytes, s.network_tx_bytes, s.late"
                " FROM samples s JOIN intervals i ON i.id = s.interval_id"
                " JOIN vms v ON v.id = s.vm_id"
            )
        ).all()
        batches = conn.execute(
            sa.text(
                "SELECT i.start_s, count(*) FROM batches b JOIN intervals i ON i.id = b.interval_id"
                " GROUP BY i.start_s"
            )
        ).all()
    samples: dict[tuple[int, str], tuple[float, ...]] = {}
    for start, uuid, *amounts, late in rows:
        assert not late
        key = (start, uuid)
        before = samples.get(key, (0.0,) * 6)
        samples[key] = tuple(a + b for a, b in zip(before, amounts, strict=True))
    return samples, dict(batches)


def expected(vm: ScriptedVm, seconds: float) -> tuple[float, ...]:
    return (
        vm.cores * seconds,
        vm.rss_bytes * seconds,
        vm.read_bytes_per_s * seconds,
        vm.write_bytes_per_s * seconds,
        vm.rx_bytes_per_s * seconds,
        vm.tx_bytes_per_s * seconds,
    )


def assert_every_interval_exactly_once(d: Daemon, h: Host, starts: list[int]) -> None:
    samples, _batches = ledger(d)
    assert sorted({s for s, _ in samples}) == starts
    for start in starts:
        for vm in h.vms:
            assert samples[(start, vm.uuid)] == pytest.approx(expected(vm, 60), rel=1e-12)


def test_daemon_down_for_several_ticks_then_up(daemon: Daemon, tmp_path: Path) -> None:
    start = aligned_past(20)
    h = Host(tmp_path, daemon.url, start)
    h.ticks(12)  # intervals 0 and 1 delivered as they close
    assert h.metric("gmd_agent_batches_total", outcome="accepted") == 2
    h.transport.down = True
    h.ticks(24)  # intervals 2..5 close while the daemon is unreachable
    assert h.metric("gmd_agent_spool_batches") == 4
    assert h.metric("gmd_agent_batches_spooled_total") == 4
    assert ledger(daemon)[1] == {start: 1, start + 60: 1}
    h.transport.down = False
    h.ticks(6)  # the spool is replayed, in order, then interval 6 follows
    assert h.metric("gmd_agent_spool_batches") == 0
    starts = [start + 60 * k for k in range(7)]
    assert_every_interval_exactly_once(daemon, h, starts)
    assert ledger(daemon)[1] == dict.fromkeys(starts, 1)
    assert h.metric("gmd_agent_batches_total", outcome="accepted") == 7
    assert h.metric("gmd_agent_samples_total") == 3 * 43


def test_a_lost_answer_is_resent_under_its_key_and_counted_once(
    daemon: Daemon, tmp_path: Path
) -> None:
    start = aligned_past(10)
    h = Host(tmp_path, daemon.url, start)
    h.transport.lose_answers = True
    h.ticks(6)  # interval 0 arrives at the daemon, but the agent never hears back
    assert h.transport.posts == 1 and h.metric("gmd_agent_spool_batches") == 1
    h.transport.lose_answers = False
    h.ticks(6)
    assert h.metric("gmd_agent_batches_total", outcome="duplicate") == 1
    assert h.metric("gmd_agent_batches_total", outcome="accepted") == 1
    assert_every_interval_exactly_once(daemon, h, [start, start + 60])
    assert ledger(daemon)[1] == {start: 1, start + 60: 1}


def test_batches_behind_one_whose_answer_was_cut_off_still_go(
    daemon: Daemon, tmp_path: Path
) -> None:
    start = aligned_past(20)
    starts = [start + 60 * k for k in range(5)]
    h = Host(tmp_path, daemon.url, start)
    h.transport.cut_answers = True
    h.ticks(24)  # intervals 0..3 close: each reaches the daemon in time, no answer comes back
    assert ledger(daemon)[1] == dict.fromkeys(starts[:4], 1)
    assert h.metric("gmd_agent_spool_batches") == 4
    h.transport.cut_answers = False
    h.ticks(6)
    assert h.metric("gmd_agent_spool_batches") == 0
    assert h.metric("gmd_agent_batches_total", outcome="duplicate") == 4
    assert h.metric("gmd_agent_batches_total", outcome="accepted") == 1
    assert_every_interval_exactly_once(daemon, h, starts)


def test_a_daemon_that_does_not_answer_in_time_holds_the_batches_behind(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A timeout is a slow or stopped daemon: posting every batch behind would wait as long
    each time, so the replay stops at the first, as when the daemon is down."""
    start = aligned_past(20)
    h = Host(tmp_path, daemon.url, start)
    h.transport.lose_answers = True
    h.ticks(24)
    assert ledger(daemon)[1] == {start: 1}
    assert h.metric("gmd_agent_spool_batches") == 4


def test_a_host_whose_clock_runs_ahead_keeps_its_batches_until_the_daemon_takes_them(
    tmp_path: Path,
) -> None:
    """The agent's clock 10 minutes ahead of the daemon's, past its clock_skew_s (300 s):
    each batch is early (425), kept, and taken once the clocks agree. Nothing is dropped."""
    start = aligned_past(20)
    behind = [600.0]
    agents: list[Host] = []  # the daemon's clock is the agent's, less what it is behind

    def daemon_clock() -> float:
        return (agents[0].now if agents else float(start)) - behind[0]

    config = make_config(f"sqlite:///{tmp_path / 'ledger.db'}", {HOST: "operator"})
    with serving(config, clock=daemon_clock) as d:
        h = Host(tmp_path, d.url, start)
        agents.append(h)
        h.ticks(24)  # intervals 0..3 close; each is 'in the future' for the daemon
        assert ledger(d)[1] == {}
        assert h.metric("gmd_agent_spool_batches") == 4
        assert h.metric("gmd_agent_batches_total", outcome="rejected") == 0
        behind[0] = 0.0  # the clock is put right
        h.ticks(6)
        assert h.metric("gmd_agent_spool_batches") == 0
        assert_every_interval_exactly_once(d, h, [start + 60 * k for k in range(5)])


def test_agent_crash_and_restart_lose_and_double_nothing(daemon: Daemon, tmp_path: Path) -> None:
    start = aligned_past(20)
    h = Host(tmp_path, daemon.url, start)
    h.transport.down = True
    h.ticks(15)  # two intervals spooled, half of the third measured
    h.crash()
    h.now += 95  # down for 95 s: the restarted agent measures the gap from its baselines
    h.start()
    h.ticks(1)
    h.transport.down = False
    h.ticks(13)
    # 15 ticks + 95 s + 14 ticks = 385 s from the start: six whole intervals.
    assert_every_interval_exactly_once(daemon, h, [start + 60 * k for k in range(6)])


def test_a_rejected_batch_is_dropped_loudly_and_the_next_still_goes(
    daemon: Daemon, tmp_path: Path, caplog: Any
) -> None:
    start = aligned_past(10)
    # The daemon accounts 60 s intervals: a 30 s batch can never be accepted.
    h = Host(tmp_path, daemon.url, start, interval_s=30)
    with caplog.at_level(logging.ERROR, "gmd.agent.sender"):
        h.ticks(3)
    assert h.metric("gmd_agent_batches_total", outcome="rejected") == 1
    assert h.metric("gmd_agent_spool_batches") == 0
    assert "rejected batch cmp-1/" in caplog.text and "HTTP 422" in caplog.text
    assert "interval_s = 30, but this daemon accounts 60 s intervals" in caplog.text
    assert ledger(daemon) == ({}, {})


def test_a_wrong_token_keeps_batches_for_when_it_is_fixed(daemon: Daemon, tmp_path: Path) -> None:
    start = aligned_past(10)
    h = Host(tmp_path, daemon.url, start, token="not-the-token")
    h.ticks(12)
    assert h.metric("gmd_agent_spool_batches") == 2
    assert h.metric("gmd_agent_batches_total", outcome="rejected") == 0
    assert ledger(daemon) == ({}, {})


def test_server_errors_keep_the_batch() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"detail": "ledger database unavailable"})

    client = DaemonClient("http://daemon.invalid", "t", transport=httpx.MockTransport(handler))
    outcome = client.post_batch(b"{}")
    assert (outcome.kind, outcome.status, outcome.detail) == (
        "unavailable",
        503,
        "ledger database unavailable",
    )


def test_the_spool_is_bounded_and_drops_the_oldest(tmp_path: Path, caplog: Any) -> None:
    spool = Spool(tmp_path / "s.db", max_bytes=10_000, max_batches=3)
    with caplog.at_level(logging.ERROR, "gmd.agent.spool"):
        dropped = spool.commit(b"{}", [(f"k{i}", 60 * i, b"x" * 100) for i in range(5)])
    assert [d.key for d in dropped] == ["k0", "k1"]
    assert [s.key for s in spool.oldest(10)] == ["k2", "k3", "k4"]
    assert "dropped the oldest batch k0 (interval 0)" in caplog.text
    dropped = spool.commit(None, [("big", 300, b"y" * 9_900)])
    assert [d.key for d in dropped] == ["k2", "k3"]  # 100 + 9,900 bytes fit in 10,000
    assert spool.size() == (2, 10_000)
    assert spool.state() == b"{}"
    spool.close()


def test_one_spool_one_agent(tmp_path: Path) -> None:
    first = Spool(tmp_path / "s.db", max_bytes=10**6, max_batches=10)
    with pytest.raises(SpoolError, match="in use by another gmd-agent"):
        Spool(tmp_path / "s.db", max_bytes=10**6, max_batches=10)
    first.close()
    Spool(tmp_path / "s.db", max_bytes=10**6, max_batches=10).close()


def test_a_full_spool_is_counted(daemon: Daemon, tmp_path: Path) -> None:
    start = aligned_past(10)
    h = Host(tmp_path, daemon.url, start, spool_max_batches=2)
    h.transport.down = True
    h.ticks(24)
    assert h.metric("gmd_agent_batches_total", outcome="dropped") == 2
    h.transport.down = False
    h.ticks(1)
    samples, _ = ledger(daemon)
    assert sorted({s for s, _ in samples}) == [start + 120, start + 180]


class FakeTime:
    """The run loop's clock and stop event in one: waiting moves the host's scripted clock
    on, and the run stops at ``until_s``."""

    def __init__(self, host: Host, until_s: float) -> None:
        self.host, self.until_s = host, until_s

    def __call__(self) -> float:
        return self.host.now

    def is_set(self) -> bool:
        return self.host.now >= self.until_s

    def wait(self, timeout: float | None = None) -> bool:
        self.host.now = min(self.host.now + max(0.0, timeout or 0.0), self.until_s)
        return self.is_set()


def test_posts_are_spread_after_the_interval_end_and_ticks_keep_their_cadence(
    daemon: Daemon, tmp_path: Path
) -> None:
    start = aligned_past(20)
    h = Host(tmp_path, daemon.url, start, rng=Draws(0.375, 0.8125, 0.0), post_jitter_s=20)
    assert h.agent is not None
    ticked: list[float] = []
    collect = h.collector.collect

    def reading() -> Any:
        ticked.append(h.now)
        return collect()

    h.collector.collect = reading  # type: ignore[method-assign]
    h.transport.clock = lambda: h.now
    time_ = FakeTime(h, start + 3 * 60 + 5)
    h.agent.run(cast(threading.Event, time_), clock=time_)

    # A reading at once, then at every tick, whatever was posted between them.
    assert ticked == [float(start + TICK_S * k) for k in range(19)]
    # Each interval's batch goes 20 s × the draw after its end, not at the tick that made it.
    assert h.transport.sent == [
        (start + 60 + 7.5, start),
        (start + 120 + 16.25, start + 60),
        (start + 180 + 0.0, start + 120),
    ]
    assert_every_interval_exactly_once(daemon, h, [start, start + 60, start + 120])
    assert h.metric("gmd_agent_batches_spooled_total") == 0


def test_a_batch_waiting_for_its_time_is_not_counted_as_spooled_until_it_misses_it(
    daemon: Daemon, tmp_path: Path
) -> None:
    start = aligned_past(10)
    h = Host(tmp_path, daemon.url, start, rng=Draws(0.5), post_jitter_s=20)
    h.ticks(6)  # interval 0 closes; its batch is spooled and waits until 10 s past its end
    assert (h.transport.posts, h.metric("gmd_agent_spool_batches")) == (0, 1)
    assert h.metric("gmd_agent_batches_spooled_total") == 0
    h.transport.down = True
    h.ticks(1)  # due now, but the daemon is unreachable: kept for the next tick
    assert h.metric("gmd_agent_batches_spooled_total") == 1
    h.transport.down = False
    h.ticks(1)
    assert h.metric("gmd_agent_batches_total", outcome="accepted") == 1
    assert h.metric("gmd_agent_spool_batches") == 0
    assert_every_interval_exactly_once(daemon, h, [start])


def test_a_batch_due_behind_one_that_is_not_waits_for_it(tmp_path: Path) -> None:
    posted: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posted.append(request.content)
        return httpx.Response(200, json={"status": "accepted"})

    spool = Spool(tmp_path / "s.db", max_bytes=10**6, max_batches=10)
    client = DaemonClient("http://daemon.invalid", "t", transport=httpx.MockTransport(handler))
    sender = Sender(spool, client)
    spool.commit(None, [("k1", 0, b"1"), ("k2", 60, b"2")])
    sender.schedule("k1", 100.0)
    sender.schedule("k2", 50.0)
    assert sender.next_post_s() == 50.0
    report = sender.drain(now_s=60.0)
    assert (posted, report.waiting, report.missed) == ([], 2, 0)
    assert sender.next_post_s() == 100.0  # the next time a drain can post anything
    report = sender.drain(now_s=100.0)
    assert (posted, report.accepted, report.waiting) == ([b"1", b"2"], 2, 0)
    assert sender.next_post_s() is None
    spool.close()


def test_a_replayed_host_posts_each_batch_at_once(daemon: Daemon, tmp_path: Path) -> None:
    start = aligned_past(10)
    h = Host(tmp_path, daemon.url, start, rng=Draws(), post_jitter_s=20)
    h.crash()
    # A replay's configuration spreads nothing, whatever post_jitter_s says.
    replay = {"collector": "replay", "replay_dir": str(tmp_path), "post_jitter_s": 20}
    parsed = parse_agent({"agent": {"host": "cmp-1", **replay}}, "test.toml")
    assert (parsed.collector, parsed.post_jitter_s) == ("replay", 0.0)
    h.config = dataclasses.replace(
        h.config, collector=parsed.collector, post_jitter_s=parsed.post_jitter_s
    )
    h.start()
    h.ticks(6)  # no delay is drawn: the replay's last batch must go before it ends
    assert h.metric("gmd_agent_batches_total", outcome="accepted") == 1
    assert_every_interval_exactly_once(daemon, h, [start])
