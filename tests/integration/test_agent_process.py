"""gmd-agent as an operator runs it: a real process against libvirt's test driver.

The test driver's CPU time is the wall clock (one core-second per second for every domain)
and its memory a constant, so every whole interval in the ledger must hold exactly
``interval_s`` core-seconds per VM — across a SIGKILL, a restart and a daemon outage. A delta
lost or counted twice shows as a tick's worth (12 %) too little or too much.
"""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from gmd.common.version import version
from gmd.wire import SampleBatch
from tests.support.agent_fixtures import NODE, uri
from tests.support.daemon_support import make_config, serving, token_of

AGENT = Path(sys.executable).with_name("gmd-agent")
HOST = "cmp-test"
INTERVAL_S = 1
TICK_S = 0.125
MIB = 2**20
RSS = {  # the domains' <currentMemory> (the test driver has no RSS)
    "a1a1a1a1-0000-4000-8000-000000000001": 3072 * MIB,
    "a1a1a1a1-0000-4000-8000-000000000002": 2048 * MIB,
    "a1a1a1a1-0000-4000-8000-000000000003": 8192 * MIB,
    "a1a1a1a1-0000-4000-8000-000000000004": 1024 * MIB,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, spool: Path, daemon_url: str, metrics_port: int = 0) -> Path:
    path.write_text(
        "[agent]\n"
        f'daemon_url = "{daemon_url}"\n'
        f'token = "{token_of(HOST)}"\n'
        f'host = "{HOST}"\n'
        f'libvirt_uri = "{uri(NODE)}"\n'
        f"tick_s = {TICK_S}\n"
        f"interval_s = {INTERVAL_S}\n"
        f'spool_path = "{spool}"\n'
        "network_bytes_per_s = 1250000000\n"
        f"metrics_port = {metrics_port}\n"
    )
    return path


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"gmd-agent: no {what}:\n{log.read_text()}")
        time.sleep(0.05)


def outbox(spool: Path) -> int:
    if not spool.exists():
        return 0
    with sqlite3.connect(f"file:{spool}?mode=ro", uri=True, timeout=5) as db:
        try:
            return db.execute("SELECT count(*) FROM outbox").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def test_once_dry_run_prints_the_batch(tmp_path: Path) -> None:
    spool = tmp_path / "spool.db"
    config = write_config(tmp_path / "gmd.toml", spool, "http://127.0.0.1:9")
    out = run("--config", str(config), "--once", "--dry-run")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    batch = SampleBatch.model_validate(doc)  # what the daemon would accept
    assert (batch.host, batch.interval_s, batch.interval_start_s % INTERVAL_S) == (
        HOST,
        INTERVAL_S,
        0,
    )
    assert batch.capacity.model_dump() == {
        "cpu_cores": 16.0,
        "memory_bytes": 64.0 * 2**30,
        "disk_bytes_per_s": 500e6,
        "network_bytes_per_s": 1.25e9,
    }
    vms = {v["uuid"]: v for v in batch.vms}
    assert set(vms) == set(RSS)  # the stopped domain is not there
    assert {u: (v["customer"], v.get("flavor"), v.get("created_s")) for u, v in vms.items()} == {
        "a1a1a1a1-0000-4000-8000-000000000001": (
            "7f3e1c2b9a8d4e5f6a7b8c9d0e1f2a3b",
            {"vcpus": 2.0, "memory_bytes": 4096.0 * MIB},
            1709294400,
        ),
        "a1a1a1a1-0000-4000-8000-000000000002": (
            "11112222333344445555666677778888",
            {"vcpus": 1.0, "memory_bytes": 2048.0 * MIB},
            1579077000,
        ),
        "a1a1a1a1-0000-4000-8000-000000000003": (
            "physics-lab",
            {"vcpus": 6.0, "memory_bytes": 8192.0 * MIB},
            None,
        ),
        "a1a1a1a1-0000-4000-8000-000000000004": (
            "unknown",
            {"vcpus": 2.0, "memory_bytes": 1024.0 * MIB},
            None,
        ),
    }
    for uuid, v in vms.items():
        # One tick of a test-driver domain: ~tick_s core-seconds, its memory for as long.
        assert v["cpu_s"] == pytest.approx(TICK_S, rel=0.2)
        assert v["memory_byte_s"] == pytest.approx(RSS[uuid] * v["cpu_s"], rel=0.01)
    assert vms["a1a1a1a1-0000-4000-8000-000000000001"]["disk_read_bytes"] > 0
    assert vms["a1a1a1a1-0000-4000-8000-000000000002"]["network_rx_bytes"] > 0
    assert "nothing was sent or written" in out.stderr
    # agent.collector is left to "auto": a test driver host is read through libvirt.
    assert "agent.collector = auto: libvirt's bulk stats (test://" in out.stderr
    assert not spool.exists()


def test_configuration_errors_name_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[agent]\ntick_s = 0\nlibvirt_uri = "test:///default"\n')
    out = run("--config", str(bad), "--once")
    assert out.returncode == 2
    assert f"{bad}: agent.tick_s: 0 is not in [0.05, 3600]" in out.stderr
    unset = tmp_path / "unset.toml"
    unset.write_text(f'[agent]\nlibvirt_uri = "{uri(NODE)}"\n')
    out = run("--config", str(unset), "--once")
    assert out.returncode == 2 and "agent.daemon_url is not set" in out.stderr


def test_numbers_in_configuration_errors_read_as_written(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent]\nmetrics_port = 70000\n")
    out = run("--config", str(bad))
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"gmd-agent: error: {bad}: agent.metrics_port: 70000 is not in [0, 65535]"
    ]


def test_a_bogus_log_level_names_the_choices_and_exits_2() -> None:
    out = run("--log-level", "loud")
    assert out.returncode == 2
    assert out.stderr == (
        "gmd-agent: error: invalid value for '--log-level': 'loud' is not one of debug, info,"
        " warning, error (see gmd-agent --help)\n"
    )
    assert "Value error" not in out.stderr and "Traceback" not in out.stderr


def test_version_names_the_program(tmp_path: Path) -> None:
    out = run("--config", str(tmp_path / "missing.toml"), "--version")
    assert (out.returncode, out.stdout, out.stderr) == (0, f"gmd-agent {version()}\n", "")


def test_healthz_turns_200_once_ticks_read_the_host_and_the_port_is_freed_at_exit(
    tmp_path: Path,
) -> None:
    """No daemon answers (port 9): the agent measures and spools all the same, so it is
    healthy. A port another process holds is one error line and exit 1."""
    port = free_port()
    cfg = write_config(tmp_path / "gmd.toml", tmp_path / "spool.db", "http://127.0.0.1:9", port)
    cfg.write_text(cfg.read_text() + 'enforce_backend = "none"\n')
    log = tmp_path / "agent.log"
    url = f"http://127.0.0.1:{port}"

    def healthz() -> httpx.Response | None:
        try:
            return httpx.get(f"{url}/healthz", timeout=5)
        except httpx.TransportError:
            return None

    with log.open("wb") as out:
        proc = subprocess.Popen([str(AGENT), "--config", str(cfg)], stderr=out)
    try:
        answers: list[httpx.Response] = []

        def healthy() -> bool:
            answer = healthz()
            if answer is not None:
                answers.append(answer)
            return answer is not None and answer.status_code == 200

        wait_for("healthy /healthz", healthy, proc, log)
        assert {a.status_code for a in answers} <= {200, 503}
        body = answers[-1].json()
        assert (body["status"], body["host"], body["vms"]) == ("ok", HOST, 4), body
        assert httpx.get(f"{url}/", timeout=5).status_code == 404
        assert "gmd_agent_vms 4.0" in httpx.get(f"{url}/metrics", timeout=5).text

        # The port is taken: a second agent says so and exits 1.
        other = write_config(tmp_path / "other.toml", tmp_path / "other.db", url, port)
        other.write_text(other.read_text() + 'enforce_backend = "none"\n')
        taken = run("--config", str(other))
        assert taken.returncode == 1
        assert taken.stderr.splitlines()[-1] == (
            f"gmd-agent: error: cannot serve /metrics and /healthz on 127.0.0.1:{port}"
            " (agent.metrics_bind, agent.metrics_port): Address already in use"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
    assert proc.returncode == 0, log.read_text()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_sigkill_with_a_full_spool_then_restart_loses_and_doubles_nothing(
    tmp_path: Path,
) -> None:
    spool = tmp_path / "spool.db"
    log = tmp_path / "agent.log"
    config = make_config(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        {HOST: "operator"},
        accounting={"interval_s": INTERVAL_S, "grace_s": 0},
    )
    with serving(config) as daemon:
        # Run 1: the daemon is unreachable (nothing listens there): batches pile up.
        nowhere = f"http://127.0.0.1:{free_port()}"
        cfg = write_config(tmp_path / "gmd.toml", spool, nowhere)
        with log.open("ab") as out:
            proc = subprocess.Popen([str(AGENT), "--config", str(cfg)], stderr=out)
        try:
            wait_for("spooled batches", lambda: outbox(spool) >= 2, proc, log)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        assert proc.returncode == -signal.SIGKILL
        assert outbox(spool) >= 2
        assert ledger(daemon.engine) == {}

        # Run 2: the daemon is there. The spool is replayed, ticks go on.
        port = free_port()
        write_config(cfg, spool, daemon.url, metrics_port=port)
        with log.open("ab") as out:
            proc = subprocess.Popen([str(AGENT), "--config", str(cfg)], stderr=out)
        try:
            wait_for(
                "delivery after the restart",
                lambda: outbox(spool) == 0 and len(ledger(daemon.engine)) >= 4 * 5,
                proc,
                log,
            )
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
        assert proc.returncode == 0, log.read_text()
        samples = ledger(daemon.engine)

    assert 'gmd_agent_batches_total{outcome="accepted"}' in metrics
    assert "gmd_agent_samples_total" in metrics
    assert f'gmd_build_info{{version="{version()}"}} 1.0' in metrics
    assert "_created" not in metrics
    starts = sorted({start for start, _uuid in samples})
    assert starts == list(range(starts[0], starts[-1] + 1, INTERVAL_S))  # no interval missing
    assert {uuid for _s, uuid in samples} == set(RSS)
    # The first interval began before the first reading; every later one is whole.
    for start in starts[1:]:
        for uuid, rss in RSS.items():
            cpu_s, memory_byte_s = samples[(start, uuid)]
            assert cpu_s == pytest.approx(INTERVAL_S, rel=0.01), (start, uuid)
            assert memory_byte_s == pytest.approx(rss * INTERVAL_S, rel=0.01), (start, uuid)
    assert "resuming from spool" in log.read_text()


def ledger(engine: sa.Engine) -> dict[tuple[int, str], tuple[float, float]]:
    """(interval start, VM) → (cpu_s, memory_byte_s) summed over its batches."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT i.start_s, v.uuid, sum(s.cpu_s), sum(s.memory_byte_s) FROM samples s"
                " JOIN intervals i ON i.id = s.interval_id JOIN vms v ON v.id = s.vm_id"
                " GROUP BY i.start_s, v.uuid"
            )
        ).all()
    return {(start, uuid): (cpu, mem) for start, uuid, cpu, mem in rows}


def test_sighup_points_a_running_agent_at_another_daemon_and_names_what_takes_a_restart(
    tmp_path: Path,
) -> None:
    """SIGHUP killed the agent (exit 129). It now reads its file again: a new daemon_url is
    taken at once (the spooled batches go there, nothing is lost), a new tick_s is named as
    taking a restart, and a file it would refuse changes nothing."""
    spool = tmp_path / "spool.db"
    log = tmp_path / "agent.log"
    config = make_config(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        {HOST: "operator"},
        accounting={"interval_s": INTERVAL_S, "grace_s": 0},
    )

    def said(words: str) -> Callable[[], bool]:
        return lambda: words in log.read_text()

    with serving(config) as daemon:
        cfg = write_config(tmp_path / "gmd.toml", spool, f"http://127.0.0.1:{free_port()}")
        with log.open("ab") as out:
            proc = subprocess.Popen([str(AGENT), "--config", str(cfg)], stderr=out)
        try:
            wait_for("spooled batches", lambda: outbox(spool) >= 2, proc, log)
            write_config(cfg, spool, daemon.url)
            cfg.write_text(cfg.read_text().replace(f"tick_s = {TICK_S}", "tick_s = 0.25"))
            proc.send_signal(signal.SIGHUP)
            wait_for("the reload", said("SIGHUP: reloaded"), proc, log)
            wait_for("delivery to the new daemon", lambda: outbox(spool) == 0, proc, log)
            wait_for("batches in the ledger", lambda: len(ledger(daemon.engine)) >= 8, proc, log)
            cfg.write_text(cfg.read_text() + "tick_s = 0.5\n")  # twice: not TOML
            proc.send_signal(signal.SIGHUP)
            wait_for("the refusal", said("SIGHUP: not reloaded"), proc, log)
            assert proc.poll() is None, "SIGHUP does not stop the agent"
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
    assert proc.returncode == 0, log.read_text()
    text = log.read_text()
    reloaded = next(line for line in text.splitlines() if "SIGHUP: reloaded" in line)
    assert "agent.daemon_url changed live" in reloaded, reloaded
    restart = next(line for line in text.splitlines() if "take(s) a restart" in line)
    assert "agent.tick_s" in restart and "agent.daemon_url" not in restart, restart
    assert "Traceback" not in text
