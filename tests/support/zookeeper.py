"""A real ZooKeeper ensemble on loopback (Debian's ``zookeeper`` package, private data
directories and ports), for the federation's tests: the shared one ``make test`` starts
(tests/scripts/zookeeper.sh runs this module's ``start``), and private ones that a fault test
may stop node by node (:func:`private_ensemble`).

Standard library only: tests/scripts/zookeeper.sh runs it with the system's python3. What runs
and why (measured on these machines): each node is the JVM itself (no wrapper shell, so its pid
is the one to signal), with Debian's classpath plus an SLF4J binding (without one the server
logs nothing), a small serial-GC heap (~70 MB a node), no AdminServer, client ports on
127.0.0.1 only. ``ruok`` answers before a quorum exists: a node is serving when ``srvr`` says
``Mode: leader|follower|standalone``, an ensemble when it has one leader and the rest follow.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

CLASSPATH = ":".join(
    (
        "/etc/zookeeper/conf",
        "/usr/share/java/zookeeper.jar",
        "/usr/share/java/slf4j-log4j12.jar",
        "/usr/share/java/log4j-1.2.jar",
    )
)
JVM = ("-Xmx64m", "-Xms16m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k")
MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
SHARED_PORTS = (27181, 27281, 27381)
"""The shared ensemble's first client, peer and election ports (node i adds i - 1): below
Linux's ephemeral range, apart from the clouds' (tests/scripts/*.sh) and PostgreSQL's."""
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def four_letters(port: int, command: str = "srvr", timeout: float = 1.0) -> str | None:
    """A node's answer to a four-letter word, or None when it does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout) as sock:
            sock.sendall(command.encode())
            chunks = []
            while data := sock.recv(4096):
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None


def mode(port: int) -> str | None:
    """``leader``, ``follower`` or ``standalone`` when the node serves; else None."""
    for line in (four_letters(port) or "").splitlines():
        if line.startswith("Mode:"):
            return line.split()[1]
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


class Ensemble:
    """``n`` nodes under ``base`` (node i in ``base/n<i>``), its ports either fixed (the shared
    ensemble) or free ones (a private one); the state (ports, pids) in ``base/ensemble.json``
    so that another process (``stop``) finds the nodes again."""

    def __init__(
        self,
        base: Path,
        n: int = 3,
        ports: tuple[int, int, int] | None = None,
        tick_ms: int = 2000,
        force_sync: bool = False,
    ) -> None:
        self.base, self.n, self.tick_ms = base, n, tick_ms
        self.force_sync = force_sync
        """ZooKeeper's own default (each write fsynced before it is acknowledged); off for the
        tests' ensembles, whose data is thrown away, so that a 2-core machine keeps up"""
        if ports is None:
            self.client = [free_port() for _ in range(n)]
            self.peer = [(free_port(), free_port()) for _ in range(n)]
        else:
            c, p, e = ports
            self.client = [c + i for i in range(n)]
            self.peer = [(p + i, e + i) for i in range(n)]
        self.pids: dict[int, int] = {}

    @property
    def hosts(self) -> str:
        """kazoo's connection string for every node."""
        return ",".join(f"127.0.0.1:{p}" for p in self.client)

    def node_dir(self, i: int) -> Path:
        return self.base / f"n{i}"

    def configure(self) -> None:
        """Each node's zoo.cfg and myid (fresh data directories)."""
        for i in range(1, self.n + 1):
            d = self.node_dir(i)
            shutil.rmtree(d, ignore_errors=True)
            (d / "data").mkdir(parents=True)
            lines = [
                f"tickTime={self.tick_ms}",
                "initLimit=10",
                "syncLimit=5",
                f"dataDir={d / 'data'}",
                f"clientPort={self.client[i - 1]}",
                "clientPortAddress=127.0.0.1",
                "admin.enableServer=false",
                "4lw.commands.whitelist=srvr,ruok,mntr,stat",
                # a 2-core test machine: no fsync per write (the data is thrown away)
                f"forceSync={'yes' if self.force_sync else 'no'}",
            ]
            if self.n > 1:
                (d / "data" / "myid").write_text(f"{i}\n")
                lines += [f"server.{j}=127.0.0.1:{p}:{e}" for j, (p, e) in enumerate(self.peer, 1)]
            (d / "zoo.cfg").write_text("\n".join(lines) + "\n")

    def start(self, i: int) -> None:
        """Start node ``i`` (its JVM in a session of its own: a Ctrl-C of pytest does not
        reach it, the teardown stops it by pid)."""
        for port in (self.client[i - 1], *self.peer[i - 1]):
            if not port_free(port):
                raise RuntimeError(
                    f"port {port} of ZooKeeper node {i} is taken (a node another run left?)"
                )
        d = self.node_dir(i)
        with (d / "server.log").open("ab") as log:
            process = subprocess.Popen(
                [
                    "java",
                    *JVM,
                    f"-Dzookeeper.log.dir={d}",
                    "-Dzookeeper.root.logger=INFO,CONSOLE",
                    "-cp",
                    CLASSPATH,
                    MAIN,
                    str(d / "zoo.cfg"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pids[i] = process.pid
        self.save()

    def stop(self, i: int, sig: int = signal.SIGTERM) -> None:
        """Stop node ``i`` and wait until its JVM is gone (SIGKILL after a while)."""
        pid = self.pids.pop(i, None)
        self.save()
        if pid is not None:
            _end([pid], sig)

    def stop_all(self) -> None:
        pids, self.pids = list(self.pids.values()), {}
        self.save()
        _end(pids, signal.SIGTERM)

    def modes(self) -> dict[int, str | None]:
        return {i: mode(self.client[i - 1]) for i in self.pids}

    def wait_serving(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until the running nodes serve: one standalone, or one leader and followers.

        A node whose JVM is gone before it ever served (seen once on a loaded 2-core machine:
        its log stopped, the others went on) is started again, once, and said on stderr; the
        error, if it still does not serve, names each node's process state and its log's last
        lines other than our own polls."""
        deadline = time.monotonic() + timeout_s
        restarted: set[int] = set()
        while True:
            for i, pid in list(self.pids.items()):
                if not _alive(pid) and i not in restarted:
                    restarted.add(i)
                    print(f"ZooKeeper node {i} (pid {pid}) exited before serving: started again",
                          file=sys.stderr)  # fmt: skip
                    self.start(i)
            modes = list(self.modes().values())
            if self.n == 1 and modes == ["standalone"]:
                return
            if (
                self.n > 1
                and modes.count("leader") == 1
                and all(m in ("leader", "follower") for m in modes)
            ):
                return
            if time.monotonic() > deadline:
                tails = "\n".join(self._tail(i) for i in self.pids)
                raise RuntimeError(
                    f"ZooKeeper did not serve in {timeout_s:.0f} s: {modes}\n{tails}"
                )
            time.sleep(0.05)

    def leader(self) -> int:
        """The node that leads now."""
        return next(i for i, m in self.modes().items() if m == "leader")

    def _tail(self, i: int) -> str:
        """Node ``i``'s process state and its log's last lines, our ``srvr`` polls left out."""
        log = self.node_dir(i) / "server.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else ["(no log)"]
        said = [line for line in lines if "Processing srvr command" not in line]
        pid = self.pids.get(i)
        state = "running" if pid is not None and _alive(pid) else "exited"
        return f"--- node {i} ({state}): {log}\n" + "\n".join(said[-15:])

    def save(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        state = {"hosts": self.hosts, "client": self.client, "peer": self.peer, "pids": self.pids}
        (self.base / "ensemble.json").write_text(json.dumps(state))

    @classmethod
    def load(cls, base: Path) -> Ensemble | None:
        """The ensemble whose state ``base`` holds (None: none)."""
        try:
            state = json.loads((base / "ensemble.json").read_text())
        except (OSError, ValueError):
            return None
        ensemble = cls(base, len(state["client"]), ports=(0, 0, 0))
        ensemble.client = list(state["client"])
        ensemble.peer = [tuple(p) for p in state["peer"]]  # type: ignore[misc]
        ensemble.pids = {int(i): int(pid) for i, pid in state["pids"].items()}
        return ensemble


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie of ours is gone for every purpose here
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


def _end(pids: list[int], sig: int) -> None:
    """Signal every pid at once, then wait for each (SIGKILL past STOP_TIMEOUT_S), reaping
    those that are our children."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


@contextlib.contextmanager
def private_ensemble(
    base: Path, n: int = 3, tick_ms: int = 500, force_sync: bool = False
) -> Iterator[Ensemble]:
    """An ensemble of its own (free ports, ``tick_ms`` short: sessions may be as short as two
    ticks), serving on entry and stopped on exit: for tests that stop, freeze or kill nodes."""
    ensemble = Ensemble(base, n, tick_ms=tick_ms, force_sync=force_sync)
    ensemble.configure()
    try:
        for i in range(1, n + 1):
            ensemble.start(i)
        ensemble.wait_serving()
        yield ensemble
    finally:
        ensemble.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description="The tests' shared ZooKeeper ensemble.")
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    base: Path = args.dir.resolve()
    running = Ensemble.load(base)
    if args.action == "stop":
        if running is not None:
            running.stop_all()
        return 0
    if running is not None and running.pids and all(_alive(p) for p in running.pids.values()):
        running.wait_serving()
        print(running.hosts)
        return 0
    if running is not None:
        running.stop_all()
    ensemble = Ensemble(base, 3, ports=SHARED_PORTS)
    ensemble.configure()
    try:
        for i in (1, 2, 3):
            ensemble.start(i)
        ensemble.wait_serving()
    except BaseException:
        ensemble.stop_all()
        raise
    print(ensemble.hosts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
