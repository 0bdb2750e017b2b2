"""What a broker runs requests on: a resource handler per cloud.

A handler knows its cloud's capacity for federation work and runs requests there: the local
process handler runs each request as a process on this machine (for tests, and for a site
without OpenStack); the OpenStack handler (to come) boots a server per request in the
federation's project. The broker asks a handler only these four things, from one thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gmd import GmdError
from gmd.broker.coordination import Request

_PR_SET_PDEATHSIG = 1


def _end_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the broker dies. A broker that is killed is
    a lost site, whose foreign work the others requeue and run: its own copies must not run on
    (Linux's prctl; elsewhere the child outlives it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class HandlerUnavailable(GmdError):
    """The handler cannot say yet what runs here (its cloud has not answered since the start):
    the broker waits it out, as it waits out ZooKeeper."""


@dataclass(frozen=True)
class Finished:
    """A request that stopped running here: how long it ran, and whether it ran to its end."""

    name: str
    ran_s: float
    completed: bool


class ResourceHandler(Protocol):
    def free_cores(self) -> float:
        """Cores free for federation work now."""
        ...

    def capacity_cores(self) -> float:
        """Cores this site offers the federation in all."""
        ...

    def start(self, name: str, request: Request) -> None:
        """Start running ``request`` (the queue node ``name``) here."""
        ...

    def stop(self, name: str) -> None:
        """Stop running ``name`` (it was taken from this site: requeued as a lost site's)."""
        ...

    def running(self) -> set[str]:
        """The names of the requests running here now, and of those finished that
        :meth:`finished` has not yet reported: what this site still answers for. (Reconciling
        requeues a request this site's running node names and this set lacks: one that
        finished between the two reads would run again.)"""
        ...

    def finished(self) -> list[Finished]:
        """The requests that stopped since the last call (each once): ``completed`` false
        when one failed here (it goes back to the queue)."""
        ...

    def close(self) -> None:
        """Stop what runs here (the broker is stopping)."""
        ...


@dataclass
class _Job:
    process: subprocess.Popen[bytes]
    started: float
    cores: float


@dataclass
class LocalProcesses:
    """Each request runs as a process here for its ``run_s`` (scaled by ``speed``): a sleep
    that appends ``<site> <request id> start|end`` lines to ``journal`` when one is given, so
    that a test can count which site ran what."""

    site: str
    cores: float
    journal: Path | None = None
    speed: float = 1.0
    _jobs: dict[str, _Job] = field(default_factory=dict)
    _done: list[Finished] = field(default_factory=list)

    def capacity_cores(self) -> float:
        return self.cores

    def free_cores(self) -> float:
        self._reap()
        return self.cores - sum(j.cores for j in self._jobs.values())

    def start(self, name: str, request: Request) -> None:
        seconds = max(request.run_s / self.speed, 0.0)
        journal = str(self.journal) if self.journal is not None else ""
        script = (
            "import sys, time\n"
            "def say(what):\n"
            "    if sys.argv[1]:\n"
            "        with open(sys.argv[1], 'a') as f:\n"
            "            f.write(f'{sys.argv[2]} {sys.argv[3]} {what}\\n')\n"
            "say('start')\n"
            "time.sleep(float(sys.argv[4]))\n"
            "say('end')\n"
        )
        process = subprocess.Popen(
            [sys.executable, "-c", script, journal, self.site, request.id, str(seconds)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_end_with_parent,
        )
        self._jobs[name] = _Job(process, time.monotonic(), request.cores)

    def stop(self, name: str) -> None:
        job = self._jobs.pop(name, None)
        if job is None:
            return
        with contextlib.suppress(OSError):
            job.process.send_signal(signal.SIGTERM)
        try:
            job.process.wait(10)
        except subprocess.TimeoutExpired:
            job.process.kill()
            job.process.wait()

    def running(self) -> set[str]:
        self._reap()
        return set(self._jobs) | {done.name for done in self._done}

    def finished(self) -> list[Finished]:
        self._reap()
        done, self._done = self._done, []
        return done

    def _reap(self) -> None:
        for name, job in list(self._jobs.items()):
            code = job.process.poll()
            if code is None:
                continue
            del self._jobs[name]
            self._done.append(Finished(name, time.monotonic() - job.started, code == 0))

    def close(self) -> None:
        for name in list(self._jobs):
            self.stop(name)
