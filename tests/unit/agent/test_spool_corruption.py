"""A spool SQLite cannot read: the real ``gmd-agent`` says so in one line, naming the spool
and what to do, and exits 1 (its documented code for a spool it cannot use), never with a
traceback. The file is a real spool, damaged in its middle (a b-tree page overwritten) or in
its header."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gmd.agent.spool import Spool, SpoolError
from tests.support.agent_fixtures import NODE, uri

AGENT = Path(sys.executable).with_name("gmd-agent")


def spool_with_batches(path: Path, n: int = 200) -> None:
    spool = Spool(path, max_bytes=2**30, max_batches=10**6)
    for i in range(n):
        spool.commit(b'{"v": 1}', [(f"cmp-1/{i * 60}/k", i * 60, b"x" * 3000)])
    spool.close()


def damage(path: Path, where: str) -> None:
    """Overwrite one whole page: in the middle of the file, or its first (the header)."""
    size = path.stat().st_size
    offset = (size // 2) // 4096 * 4096 if where == "middle" else 0
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(b"\xde\xad\xbe\xef" * 1024)


@pytest.mark.parametrize("where", ["middle", "header"])
def test_gmd_agent_refuses_a_corrupt_spool_in_one_line(tmp_path: Path, where: str) -> None:
    spool = tmp_path / "spool.db"
    spool_with_batches(spool)
    damage(spool, where)
    toml = tmp_path / "gmd.toml"
    toml.write_text(
        f'[agent]\nlibvirt_uri = "{uri(NODE)}"\ncollector = "libvirt"\n'
        f'daemon_url = "http://127.0.0.1:9"\nspool_path = "{spool}"\nenforce_backend = "none"\n'
    )
    env = {**os.environ, "COLUMNS": "200"}
    out = subprocess.run(
        [str(AGENT), "--config", str(toml), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    said = [line for line in out.stderr.splitlines() if "spool" in line and "corrupt" in line]
    assert len(said) == 1, out.stderr
    (line,) = said
    assert f"spool {spool} is corrupt (" in line
    assert f"move it aside, with any -wal and -shm file beside it (mv {spool} {spool}.corrupt)" in (
        line
    )
    assert "batches it held that the daemon had not acknowledged" in line
    # Nothing after the error line: the agent stopped there.
    assert out.stderr.splitlines()[-1] == line


def test_a_spool_breaking_while_open_raises_the_same_one_line_error(tmp_path: Path) -> None:
    """The file replaced under an open spool (as a failing disk would change it): the next
    use of the spool raises SpoolError, which the agent's loop does not swallow."""
    path = tmp_path / "spool.db"
    spool_with_batches(path)
    spool = Spool(path, max_bytes=2**30, max_batches=10**6)
    try:
        damage(path, "middle")
        spool._db.execute("PRAGMA cache_size = 0")  # no page kept from before the damage
        with pytest.raises(SpoolError, match=r"is corrupt \(database disk image is malformed\)"):
            for _ in range(3):
                spool.oldest(1000)
                spool.size()
    finally:
        spool.close()


def test_the_agents_loop_stops_on_a_spool_it_cannot_use(tmp_path: Path) -> None:
    """Not a traceback at every tick for ever: the loop lets SpoolError out (gmd-agent then
    logs its one line and exits 1)."""
    import threading

    from gmd.agent.collect.libvirt import LibvirtCollector
    from gmd.agent.config import parse_agent
    from gmd.agent.loop import AgentLoop

    path = tmp_path / "spool.db"
    spool_with_batches(path)
    spool = Spool(path, max_bytes=2**30, max_batches=10**6)
    config = parse_agent({"agent": {"host": "cmp-1", "tick_s": 0.05, "libvirt_uri": uri(NODE)}})
    agent = AgentLoop(config, LibvirtCollector(uri(NODE)), spool, None)
    damage(path, "middle")
    spool._db.execute("PRAGMA cache_size = 0")
    stop = threading.Event()
    timer = threading.Timer(30, stop.set)  # a loop that swallowed the error would end here
    timer.start()
    try:
        with pytest.raises(SpoolError, match="is corrupt"):
            agent.run(stop)
    finally:
        timer.cancel()
        agent.collector.close()
        spool.close()
