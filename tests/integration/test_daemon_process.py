"""gmd-daemon as a real process: killed mid-accounting, and two of them on one PostgreSQL."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import sqlalchemy as sa

from gmd.common.version import version
from gmd.daemon.ingest.record import BatchRecord
from gmd.daemon.ingest.store import LedgerStore
from gmd.daemon.ledger.accounting import compute_rows
from gmd.ledger_schema import migrate
from tests.support.daemon_support import (
    INTERVAL_S,
    HostSpec,
    aligned_past,
    batch,
    cpu_only,
    fresh_postgres_database,
    make_config,
)

DAEMON = Path(sys.executable).with_name("gmd-daemon")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, url: str, port: int, extra: str = "") -> Path:
    path.write_text(
        f'[database]\nurl = "{url}"\n'
        f"[accounting]\ninterval_s = {INTERVAL_S}\ngrace_s = 0\n"
        f'[daemon]\nauth = "none"\nbind = "127.0.0.1"\nport = {port}\naccount_every_s = 0.05\n'
        + extra
    )
    return path


@contextmanager
def daemon_process(
    config: Path, port: int, log: Path, *args: str
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(DAEMON), "--config", str(config), *args], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"gmd-daemon did not come up:\n{log.read_text()}")
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def listening(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on TCP ``port`` (its descriptors'
    socket inodes against the kernel's table of listening sockets)."""
    try:
        inodes = {
            os.readlink(fd).removeprefix("socket:[").removesuffix("]")
            for fd in Path(f"/proc/{pid}/fd").iterdir()
        }
    except OSError:
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes:
                    return True
    return False


def seed(url: str, starts: list[int], hosts: int, vms_per_host: int, customers: int) -> None:
    """Samples written through the store (the API's own write path), without HTTP overhead."""
    engine = migrate.engine_for(url)
    migrate.upgrade(engine)
    store = LedgerStore(engine, lambda h: "operator" if h.endswith(("0", "2", "4")) else "lab")
    rng = np.random.default_rng(5)
    for start in starts:
        for h in range(hosts):
            n = vms_per_host
            uuids = [f"vm-{h}-{j}" for j in range(n)]
            store.ingest(
                BatchRecord(
                    key=f"h{h}:{start}",
                    digest="seeded",
                    host=f"h{h}",
                    interval_start_s=start,
                    interval_s=INTERVAL_S,
                    capacity=(64.0, 256e9, 1e9, 1.25e9),
                    vm_uuids=uuids,
                    customers=[f"proj-{(h * n + j) % customers}" for j in range(n)],
                    use=rng.uniform(0, 1, (n, 6)) * [60 * 4, 8e9 * 60, 1e9, 1e9, 1e8, 1e8],
                    flavor=np.tile([2.0, 4e9, np.nan, np.nan], (n, 1)),
                    created_s=[None] * n,
                )
            )
    engine.dispose()


def interval_state(engine: sa.Engine, start: int) -> tuple[str, int]:
    with engine.connect() as conn:
        state = conn.execute(
            sa.text("SELECT state FROM intervals WHERE start_s = :s"), {"s": start}
        ).scalar_one()
        rows = conn.execute(
            sa.text(
                "SELECT count(*) FROM customer_ledger l JOIN intervals i ON i.id = l.interval_id"
                " WHERE i.start_s = :s"
            ),
            {"s": start},
        ).scalar_one()
    return state, rows


def accounting_now(engine: sa.Engine) -> bool:
    """Is a daemon inside an accounting transaction? PostgreSQL: the advisory lock is held;
    SQLite: the writer lock is (nothing else writes during this test)."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
                ).scalar_one()
            )
    path = engine.url.database
    import sqlite3

    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        probe.close()


def test_sigkill_during_accounting_leaves_no_partial_interval(
    database_url: str, tmp_path: Path
) -> None:
    start = aligned_past(3)
    seed(database_url, [start], hosts=60, vms_per_host=500, customers=2000)
    port = free_port()
    config = write_config(tmp_path / "gmd.toml", database_url, port)
    engine = migrate.engine_for(database_url)
    log = tmp_path / "daemon.log"
    try:
        with daemon_process(config, port, log) as proc:
            deadline = time.monotonic() + 60
            while True:
                state, _rows = interval_state(engine, start)
                if state == "closed" and accounting_now(engine):
                    proc.kill()  # SIGKILL: no cleanup, no rollback by the daemon itself
                    proc.wait()
                    break
                assert state != "accounted", "accounting finished before it could be killed"
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.002)
        state, rows = interval_state(engine, start)
        assert (state, rows) == ("closed", 0)
        with engine.connect() as conn:
            for table in ("customer_resource_ledger", "organization_ledger"):
                assert conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one() == 0

        with daemon_process(config, port, log):
            deadline = time.monotonic() + 60
            while interval_state(engine, start)[0] != "accounted":
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        with engine.connect() as conn:
            interval_id = conn.execute(
                sa.text("SELECT id FROM intervals WHERE start_s = :s"), {"s": start}
            ).scalar_one()
            again = compute_rows(conn, interval_id, make_config(database_url).accounting)
            stored = conn.execute(
                sa.text("SELECT count(*), sum(greediness) FROM customer_ledger")
            ).one()
        assert stored[0] == len(again.customers) == 2000
        assert stored[1] == pytest.approx(sum(r["greediness"] for r in again.customers))
    finally:
        engine.dispose()


def metric(port: int, name: str) -> float:
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def test_two_daemons_on_one_postgresql_account_each_interval_once(
    postgres_server_url: str, tmp_path: Path
) -> None:
    with fresh_postgres_database(postgres_server_url, f"gmd_two_{os.getpid()}") as url:
        two_daemons_account_each_interval_once(url, tmp_path)


def two_daemons_account_each_interval_once(url: str, tmp_path: Path) -> None:
    starts = [aligned_past(k) for k in range(40, 1, -1)]
    seed(url, starts, hosts=6, vms_per_host=40, customers=25)
    ports = [free_port(), free_port()]
    configs = [write_config(tmp_path / f"gmd{i}.toml", url, p) for i, p in enumerate(ports)]
    engine = migrate.engine_for(url)
    try:
        with (
            daemon_process(configs[0], ports[0], tmp_path / "d0.log"),
            daemon_process(configs[1], ports[1], tmp_path / "d1.log"),
        ):
            deadline = time.monotonic() + 90
            while True:
                with engine.connect() as conn:
                    left = conn.execute(
                        sa.text(
                            "SELECT count(*) FROM intervals WHERE state != 'accounted'"
                            " AND start_s <= :last"
                        ),
                        {"last": starts[-1]},
                    ).scalar_one()
                if left == 0:
                    break
                assert time.monotonic() < deadline
                time.sleep(0.1)
            time.sleep(0.5)  # let any duplicate attempt surface in the counters
            with engine.connect() as conn:
                accounted = conn.execute(
                    sa.text("SELECT count(*) FROM intervals WHERE state = 'accounted'")
                ).scalar_one()
            counts = [metric(p, "gmd_accounting_intervals_total") for p in ports]
            errors = [metric(p, "gmd_accounting_errors_total") for p in ports]
        assert accounted >= len(starts)
        assert sum(counts) == accounted, counts
        assert errors == [0.0, 0.0]
        logs = (tmp_path / "d0.log").read_text() + (tmp_path / "d1.log").read_text()
        assert "Traceback" not in logs
    finally:
        engine.dispose()


def test_daemons_sharing_a_port_each_take_agents_connections(
    postgres_server_url: str, tmp_path: Path
) -> None:
    """daemon.share_port: two processes listen on one port, the kernel gives each some of the
    agents' connections, every batch lands once; a process that does not share still finds
    the port in use (exit 4)."""
    port = free_port()
    start = aligned_past(2)
    hosts = [HostSpec(f"cmp-{h}") for h in range(40)]
    with fresh_postgres_database(postgres_server_url, f"gmd_shared_{os.getpid()}") as url:
        shared = write_config(tmp_path / "shared.toml", url, port, "share_port = true\n")
        logs = [tmp_path / "d0.log", tmp_path / "d1.log"]
        with (
            # --log-level debug: each process logs the requests it answered.
            daemon_process(shared, port, logs[0], "--log-level", "debug") as first,
            daemon_process(shared, port, logs[1], "--log-level", "debug") as second,
        ):
            # The second's /healthz on the shared port may be answered by the first: each
            # must hold its own listening socket before the agents connect (seen on CI: the
            # first took all 40 connections while the second was still starting).
            deadline = time.monotonic() + 30
            while not (listening(first.pid, port) and listening(second.pid, port)):
                assert time.monotonic() < deadline, "both daemons never listened"
                time.sleep(0.05)
            for h in hosts:
                body = batch(h, start, [cpu_only(f"vm-{h.name}", "acme", 30.0)])
                # A new connection per batch, as an agent's once-an-interval post.
                answer = httpx.post(f"http://127.0.0.1:{port}/v1/samples", json=body)
                assert answer.status_code == 200, answer.text
            alone = write_config(tmp_path / "alone.toml", url, port)
            refused = subprocess.run(
                [str(DAEMON), "--config", str(alone)], capture_output=True, text=True, timeout=60
            )
        engine = migrate.engine_for(url)
        try:
            with engine.connect() as conn:
                stored = conn.execute(sa.text("SELECT count(*) FROM batches")).scalar_one()
        finally:
            engine.dispose()
    served = [log.read_text().count("POST /v1/samples") for log in logs]
    assert stored == len(hosts) and sum(served) == len(hosts), served
    assert min(served) > 0, f"one process took every connection: {served}"
    assert refused.returncode == 4 and "Address already in use" in refused.stderr


def test_share_port_needs_postgresql(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    config = write_config(tmp_path / "gmd.toml", url, free_port(), "share_port = true\n")
    done = subprocess.run(
        [str(DAEMON), "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "daemon.share_port: needs a PostgreSQL ledger" in done.stderr
    assert "Traceback" not in done.stderr


def test_sigterm_mid_catch_up_stops_within_seconds_and_exits_0(tmp_path: Path) -> None:
    """Three days of intervals to catch up on: SIGTERM ends the run after the interval it is
    on, the daemon exits 0 (not -15), and what was accounted stays accounted."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    seed(url, [aligned_past(3 * 1440), aligned_past(2)], hosts=2, vms_per_host=3, customers=2)
    port = free_port()
    config = write_config(tmp_path / "gmd.toml", url, port)
    log = tmp_path / "daemon.log"
    engine = migrate.engine_for(url)
    try:
        with daemon_process(config, port, log) as proc:
            deadline = time.monotonic() + 60
            while True:
                with engine.connect() as conn:
                    done = conn.execute(
                        sa.text("SELECT count(*) FROM intervals WHERE state = 'accounted'")
                    ).scalar_one()
                if done >= 5:
                    break
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            asked = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(30)
            took = time.monotonic() - asked
        with engine.connect() as conn:
            states = dict(
                conn.execute(sa.text("SELECT state, count(*) FROM intervals GROUP BY 1")).all()
            )
    finally:
        engine.dispose()
    assert code == 0, log.read_text()
    assert took < 10, f"took {took:.1f} s to stop"
    assert "Traceback" not in log.read_text()
    assert states.get("accounted", 0) >= 5


def test_an_address_in_use_exits_4_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'l.db'}", port)
        done = subprocess.run(
            [str(DAEMON), "--config", str(config)], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 4, done.stderr
    assert f"cannot listen on 127.0.0.1 port {port}: Address already in use" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bogus_log_level_is_an_option_error(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'l.db'}", free_port())
    done = subprocess.run(
        [str(DAEMON), "--config", str(config), "--log-level", "bogus"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "gmd-daemon: error: invalid value for '--log-level': 'bogus' is not one of debug, info,"
        " warning, error (see gmd-daemon --help)\n"
    )
    assert "Value error" not in done.stderr and "Traceback" not in done.stderr


def test_version_is_printed_before_the_configuration_is_read(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(DAEMON), "--config", str(tmp_path / "missing.toml"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"gmd-daemon {version()}\n", "")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("[daemon]\nport = 99999\n", "daemon.port: 99999 is not in [0, 65535]"),
        (
            "[daemon]\nmax_body_bytes = 10\n",
            "daemon.max_body_bytes: 10 is not in [1024, 2147483648]",
        ),
        ("[daemon]\nport = '8470'\n", "daemon.port: expected a number, got '8470'"),
        ("[accounting]\ngamma = 2\n", "accounting.gamma: 2 is not in [0, 1]"),
        (
            "[enforcement]\nenter = [1, 0.5, 4]\nleave = [0.5, 0.25, 3]\n",
            "enforcement: enter = [1, 0.5, 4] must increase strictly; leave = [0.5, 0.25, 3]"
            " must increase",
        ),
    ],
)
def test_configuration_errors_show_numbers_as_written(
    tmp_path: Path, table: str, message: str
) -> None:
    config = tmp_path / "gmd.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "l.db"}"\n{table}')
    done = run_daemon(config)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines == [f"gmd-daemon: error: {config}: {message}"]
    assert "Value error" not in done.stderr


def run_daemon(config: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """gmd-daemon run to its end (for the ways it refuses to start)."""
    return subprocess.run(
        [str(DAEMON), "--config", str(config), *options],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_an_idle_daemon_with_0(tmp_path: Path, stop: signal.Signals) -> None:
    port = free_port()
    config = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'l.db'}", port)
    log = tmp_path / "daemon.log"
    with daemon_process(config, port, log) as proc:
        proc.send_signal(stop)
        code = proc.wait(10)
    assert code == 0, log.read_text()
    assert "Traceback" not in log.read_text()


def test_an_address_not_on_this_host_exits_4_naming_it(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'l.db'}", port)
    done = run_daemon(config, "--bind", "192.0.2.1")  # TEST-NET-1: on no host
    assert done.returncode == 4, done.stderr
    assert f"cannot listen on 192.0.2.1 port {port}: Cannot assign requested address" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr


def test_a_database_that_cannot_be_written_exits_1_not_3(tmp_path: Path) -> None:
    """Read, but not written (a read-only file, role or standby): the app's start would fail
    in uvicorn's lifespan, with a traceback and uvicorn's exit 3, which says "cannot listen"."""
    path = tmp_path / "l.db"
    engine = migrate.engine_for(f"sqlite:///{path}")
    migrate.upgrade(engine)
    engine.dispose()
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    done = run_daemon(write_config(tmp_path / "gmd.toml", url, free_port()))
    assert done.returncode == 1, done.stderr
    assert "cannot use the ledger database" in done.stderr
    assert "attempt to write a readonly database" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unusable_tls_certificate_is_a_configuration_error(tmp_path: Path) -> None:
    pem = tmp_path / "not-a.pem"
    pem.write_text("not a certificate\n")
    config = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'l.db'}", free_port())
    with config.open("a") as f:  # the [daemon] section is the file's last
        f.write(f'tls_cert = "{pem}"\ntls_key = "{pem}"\n')
    done = run_daemon(config)
    assert done.returncode == 2, done.stderr
    assert f"cannot use daemon.tls_cert {pem} with daemon.tls_key {pem}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_port_out_of_range_is_an_option_error(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'l.db'}", free_port())
    done = run_daemon(config, "--port", "99999")
    assert done.returncode == 2, done.stderr
    assert "--port" in done.stderr and "Traceback" not in done.stderr


def test_a_cloud_configured_means_verification_that_cannot_start_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[placement] verify = "auto"`` (the default) verifies hosts' claims wherever a cloud is
    configured; a clouds.yaml without that entry stops the daemon with one line."""
    clouds = tmp_path / "clouds.yaml"
    clouds.write_text("clouds: {}\n")
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
    quotas = '[enforcement.quota]\ncloud = "nowhere"\n'
    config = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'l.db'}", free_port())
    with config.open("a") as f:
        f.write(quotas)
    done = run_daemon(config)
    assert done.returncode == 2, done.stderr
    assert "[placement] cannot verify hosts' claims with the clouds.yaml entry 'nowhere'" in (
        done.stderr
    )
    assert 'verify = "off"' in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_verification_turned_off_where_a_cloud_is_configured_is_said_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(tmp_path / "none.yaml"))
    port = free_port()
    config = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'l.db'}", port)
    with config.open("a") as f:
        f.write('[enforcement.quota]\ncloud = "prod"\n[placement]\nverify = "off"\n')
    log = tmp_path / "daemon.log"
    with daemon_process(config, port, log):
        pass
    said = log.read_text()
    assert "hosts' claims trusted" in said
    assert """[placement] verify = "off" although cloud 'prod' is configured""" in said


LOG_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S"
)


def test_every_line_of_the_log_is_in_one_format_and_the_start_names_the_mode(
    tmp_path: Path,
) -> None:
    """uvicorn's own lines ("INFO:     Started server process") came in its own format beside
    gmd's; the start-up line now names the enforcement mode and the verification too."""
    port = free_port()
    config = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'l.db'}", port)
    with config.open("a") as f:
        f.write('[enforcement]\nmode = "dry-run"\n')
    log = tmp_path / "daemon.log"
    with daemon_process(config, port, log):
        pass
    lines = log.read_text().splitlines()
    assert any("uvicorn" in line for line in lines), lines
    odd = [line for line in lines if not LOG_LINE.match(line)]
    assert not odd, odd
    start = next(line for line in lines if "gmd-daemon on http://" in line)
    assert "enforcement dry-run" in start and "hosts' claims trusted" in start, start


def test_the_daemon_raises_its_own_limit_of_open_files(tmp_path: Path) -> None:
    """Started from a shell whose soft limit is 1024 (no systemd to set LimitNOFILE), the daemon
    ran with 1024 open files; it raises its soft limit to the hard one, up to 65536."""
    port = free_port()
    config = write_config(tmp_path / "gmd.toml", f"sqlite:///{tmp_path / 'l.db'}", port)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
    assert wanted > 1024, f"this machine's hard limit is {hard}: nothing to raise"

    def shell_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    log = tmp_path / "daemon.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(DAEMON), "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=shell_limit,
        )
    try:
        deadline = time.monotonic() + 30
        while httpx_up(port) is False:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        assert int(line.split()[3]) == wanted, line
    finally:
        proc.terminate()
        proc.wait(15)


def httpx_up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_sighup_reloads_what_can_change_live_and_names_what_takes_a_restart(
    tmp_path: Path,
) -> None:
    """SIGHUP killed the daemon (exit 129). It now reads gmd.toml again: a host added with its
    token may post at once, the enforcement mode changes, a new port is named as taking a
    restart (the daemon stays where it listens), and a file it would refuse changes nothing."""
    port = free_port()
    url = f"sqlite:///{tmp_path / 'l.db'}"
    first, second = HostSpec("cmp-a"), HostSpec("cmp-b")

    def host(spec: HostSpec) -> str:
        digest = hashlib.sha256(f"token-of-{spec.name}".encode()).hexdigest()
        return f'[hosts.{spec.name}]\ntoken_sha256 = "{digest}"\n'

    def write(port_now: int, hosts: list[HostSpec], mode: str, extra: str = "") -> None:
        (tmp_path / "gmd.toml").write_text(
            f'[database]\nurl = "{url}"\n'
            f"[accounting]\ninterval_s = {INTERVAL_S}\ngrace_s = 0\n"
            f'[daemon]\nauth = "token"\nbind = "127.0.0.1"\nport = {port_now}\n'
            f'[enforcement]\nmode = "{mode}"\n' + "".join(host(h) for h in hosts) + extra
        )

    def post(spec: HostSpec) -> httpx.Response:
        body = batch(spec, aligned_past(2), [cpu_only("vm-1", "p", 1.0)], key=f"{spec.name}-k")
        return httpx.post(
            f"http://127.0.0.1:{port}/v1/samples",
            json=body,
            headers={"Authorization": f"Bearer token-of-{spec.name}"},
            timeout=10,
        )

    def mode() -> str:
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        return next(
            m
            for m in ("off", "dry-run", "on")
            if f'gmd_enforcement_mode{{mode="{m}"}} 1.0' in metrics
        )

    def said(words: str, deadline_s: float = 30) -> str:
        deadline = time.monotonic() + deadline_s
        while words not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        return next(line for line in log.read_text().splitlines() if words in line)

    write(port, [first], "dry-run")
    log = tmp_path / "daemon.log"
    with daemon_process(tmp_path / "gmd.toml", port, log) as proc:
        assert post(first).status_code == 200
        assert post(second).status_code == 401
        assert mode() == "dry-run"
        write(free_port(), [first, second], "on")
        proc.send_signal(signal.SIGHUP)
        line = said("SIGHUP: reloaded")
        assert "enforcement.mode" in line and "hosts.cmp-b.token_sha256" in line, line
        restart = said("take(s) a restart")
        assert "daemon.port" in restart, restart
        assert post(second).status_code == 200, "the new host's token is taken at once"
        assert mode() == "on"
        # A file the daemon would refuse at start changes nothing.
        write(port, [first], "sometimes")
        proc.send_signal(signal.SIGHUP)
        refusal = said("SIGHUP: not reloaded")
        assert "enforcement.mode" in refusal and "'sometimes'" in refusal, refusal
        assert mode() == "on" and post(second).status_code == 200
        assert proc.poll() is None, "SIGHUP does not stop the daemon"
    assert "Traceback" not in log.read_text()
