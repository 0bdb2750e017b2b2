"""Helpers for daemon tests: configurations, a real uvicorn server in a thread, batches."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
import uvicorn

from gmd.daemon.api.app import create_app
from gmd.daemon.config import Config, parse
from gmd.daemon.ingest.transport import with_body_limit
from gmd.ledger_schema import migrate
from gmd.wire import USAGE_FIELDS

INTERVAL_S = 60
GMD_ADMIN = Path(sys.executable).parent / "gmd-admin"


def gmd_admin(config_file: Path, *args: str) -> Any:
    """What ``gmd-admin --config FILE ARGS --format json`` prints (it must exit 0): the
    document a read API route is compared with."""
    done = subprocess.run(
        [str(GMD_ADMIN), "--config", str(config_file), *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def token_of(host: str) -> str:
    return f"token-for-{host}"


def make_config(url: str, hosts: dict[str, str] | None = None, **sections: Any) -> Config:
    """A configuration for ``url``; ``hosts`` maps host → owner, each with its test token."""
    doc: dict[str, Any] = {
        "database": {"url": url},
        "accounting": {"interval_s": INTERVAL_S, "grace_s": 0},
        "daemon": {"account_every_s": 0.2},
    }
    for name, table in sections.items():
        doc.setdefault(name, {}).update(table)
    doc["hosts"] = {
        h: {"owner": owner, "token_sha256": hashlib.sha256(token_of(h).encode()).hexdigest()}
        for h, owner in (hosts or {}).items()
    }
    return parse(doc, "test.toml")


@contextmanager
def fresh_postgres_database(server_url: str, name: str | None = None) -> Iterator[str]:
    """The URL of a new, empty database on the PostgreSQL server ``server_url`` (named
    ``name``, or a random name), dropped afterwards with whatever is still connected to it."""
    name = name or f"gmd_test_{uuidlib.uuid4().hex[:12]}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield server_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def kill(engine: sa.Engine, pid: int | None = None) -> int:
    """Terminate the server processes of the engine's database (or just ``pid``), as a
    restart, a failover or an idle timeout would; how many were terminated."""
    url = engine.url.set(database="postgres")
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE datname = :db AND (CAST(:pid AS integer) IS NULL OR pid = :pid)"
                    ),
                    {"db": engine.url.database, "pid": pid},
                ).scalar_one()
            )
    finally:
        admin.dispose()


@contextmanager
def unreachable_ledger(d: Daemon, url: str) -> Iterator[None]:
    """PostgreSQL refuses every connection to the ledger's database inside the block, as a
    stopped or restarting server does ("database … is not currently accepting connections"):
    its sessions are ended, new ones refused; the daemon's pool is emptied so that its next
    connection meets the outage. Connections are taken again after the block."""
    database = d.engine.url.database
    admin = sa.create_engine(url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false'))
        kill(d.engine)
        d.engine.dispose()
        yield
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true'))
        admin.dispose()


def aligned_past(intervals_ago: int) -> int:
    """The start of the interval that began ``intervals_ago`` intervals before the current."""
    return (int(time.time()) // INTERVAL_S - intervals_ago) * INTERVAL_S


@dataclass
class Daemon:
    url: str
    app: Any
    server: uvicorn.Server
    thread: threading.Thread
    engine: Any = field(repr=False, default=None)


@contextmanager
def serving(config: Config, *, accountant: bool = False, clock: Any = None) -> Iterator[Daemon]:
    """The daemon's app on a real socket on 127.0.0.1, in a thread; stopped on exit."""
    engine = migrate.engine_for(config.database_url)
    if migrate.current(engine) is None:
        migrate.upgrade(engine)
    kwargs = {"accountant": accountant}
    if clock is not None:
        kwargs["clock"] = clock
    app = create_app(config, engine, **kwargs)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    tls = config.daemon.tls_cert is not None
    server = uvicorn.Server(
        uvicorn.Config(
            with_body_limit(app, config.daemon.max_body_bytes),
            log_level="warning",
            lifespan="on",
            ssl_certfile=str(config.daemon.tls_cert) if tls else None,
            ssl_keyfile=str(config.daemon.tls_key) if tls else None,
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test daemon did not start")
        time.sleep(0.01)
    try:
        scheme = "https" if tls else "http"
        yield Daemon(f"{scheme}://127.0.0.1:{port}", app, server, thread, engine)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        engine.dispose()


def cpu_only(uuid: str, customer: str, cpu_s: float, **flavor: float) -> dict[str, Any]:
    """A VM that used ``cpu_s`` core-seconds and nothing else (hand-worked GM examples)."""
    vm: dict[str, Any] = {"uuid": uuid, "customer": customer, "cpu_s": cpu_s}
    vm.update(dict.fromkeys(USAGE_FIELDS[1:], 0.0))
    if flavor:
        vm["flavor"] = flavor
    return vm


@dataclass(frozen=True)
class HostSpec:
    name: str
    cpu_cores: float = 16
    memory_bytes: float = 64e9
    disk_bytes_per_s: float = 500e6
    network_bytes_per_s: float = 1.25e9

    @property
    def capacity(self) -> dict[str, float]:
        return {
            "cpu_cores": self.cpu_cores,
            "memory_bytes": self.memory_bytes,
            "disk_bytes_per_s": self.disk_bytes_per_s,
            "network_bytes_per_s": self.network_bytes_per_s,
        }


_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def as_uuid(name: str) -> str:
    """The wire's VM id for a test's readable VM name (a fixed UUID per name); a UUID stays
    itself."""
    return (
        name if _UUID.match(name) else str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gmd-test:{name}"))
    )


def batch(
    host: HostSpec,
    start_s: int,
    vms: list[dict[str, Any]],
    key: str | None = None,
) -> dict[str, Any]:
    """A batch of ``vms`` (whose readable names become UUIDs: see :func:`as_uuid`)."""
    vms = [{**v, "uuid": as_uuid(v["uuid"])} for v in vms]
    return {
        "key": key or f"{host.name}:{start_s}",
        "host": host.name,
        "interval_start_s": start_s,
        "interval_s": INTERVAL_S,
        "capacity": host.capacity,
        "vms": vms,
    }


def random_vms(
    rng: np.random.Generator, host: HostSpec, uuids: list[str], owners: list[str]
) -> list[dict[str, Any]]:
    """Plausible use for each VM: up to 1.5× its flavor, some flavors missing, scaled down
    where the VMs together would use more than the host has (the daemon refuses that)."""
    out = []
    for uuid, owner in zip(uuids, owners, strict=True):
        vcpus = float(rng.integers(1, 5))
        ram = float(rng.integers(1, 9)) * 2e9
        vm: dict[str, Any] = {
            "uuid": uuid,
            "customer": owner,
            "cpu_s": float(rng.uniform(0, 1.5) * vcpus * INTERVAL_S),
            "memory_byte_s": float(rng.uniform(0.1, 1.2) * ram * INTERVAL_S),
            "disk_read_bytes": float(rng.uniform(0, 0.05) * host.disk_bytes_per_s * INTERVAL_S),
            "disk_write_bytes": float(rng.uniform(0, 0.05) * host.disk_bytes_per_s * INTERVAL_S),
            "network_rx_bytes": float(rng.uniform(0, 0.02) * host.network_bytes_per_s * INTERVAL_S),
            "network_tx_bytes": float(rng.uniform(0, 0.02) * host.network_bytes_per_s * INTERVAL_S),
            "flavor": {"vcpus": vcpus, "memory_bytes": ram} if rng.random() < 0.8 else {},
        }
        out.append(vm)
    for name, capacity in (
        ("cpu_s", host.cpu_cores),
        ("memory_byte_s", host.memory_bytes),
    ):
        total = sum(v[name] for v in out)
        room = capacity * INTERVAL_S
        if total > room:
            for v in out:
                v[name] *= room / total
    return out


def auth(host: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_of(host)}"}


@contextmanager
def full_ledger(d: Daemon, url: str) -> Iterator[None]:
    """The ledger refuses every write that needs room (SQLite) or every write (PostgreSQL)
    inside the block, and writes again after it."""
    engine = d.engine
    if url.startswith("sqlite"):
        limit: dict[str, int | None] = {"pages": None}

        @sa.event.listens_for(engine, "connect")
        def _cap(dbapi_conn: Any, _record: Any) -> None:
            if limit["pages"] is not None:
                dbapi_conn.execute(f"PRAGMA max_page_count = {limit['pages']}")

        with engine.connect() as conn:
            limit["pages"] = conn.execute(sa.text("PRAGMA page_count")).scalar_one()
        engine.dispose()
        try:
            yield
        finally:
            limit["pages"] = None
            engine.dispose()
        return
    database = engine.url.database
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(
                sa.text(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
            )
        engine.dispose()
        yield
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text("SET default_transaction_read_only = off"))
            conn.execute(
                sa.text(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
            )
        admin.dispose()
        engine.dispose()
