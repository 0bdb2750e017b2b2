"""`make demo` sets up only what the demo runs, with no root and no apt when Python has venv.

The demo runs gmd-daemon, gmd-admin and gmd-agent replaying traces, none of which needs
libvirt: `make setup-demo` installs gmd[daemon,admin] (tests/scripts/bootstrap.sh with GMD_EXTRAS),
so neither libvirt-python nor the compiler and headers it is built with, which only apt (as
root) can provide. These tests run the real bootstrap.sh (and make, and pip) with ``apt-get``,
``dpkg-query`` and ``sudo`` replaced on PATH by tripwires that record any call and fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EVERY_EXTRA = "dev,postgres,agent,daemon,admin,openstack"
TRIPWIRES = ("apt-get", "dpkg-query", "sudo")


def tripwired_env(tmp_path: Path, venv: Path) -> tuple[dict[str, str], Path]:
    """The environment for bootstrap.sh and make: VENV in ``tmp_path``, and the package tools
    on PATH replaced by scripts that append their command line to the returned log."""
    trap = tmp_path / "trap"
    trap.mkdir()
    log = tmp_path / "apt-calls.log"
    for tool in TRIPWIRES:
        script = trap / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\nexit 1\n')
        script.chmod(0o755)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "GMD_"))},
        "PATH": f"{trap}:{os.environ['PATH']}",
        "VENV": str(venv),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    return env, log


def stamp(extras: str) -> str:
    """What bootstrap.sh writes after installing ``extras`` from today's pyproject.toml."""
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    return f"{digest} extras={extras}\n"


def bootstrap(env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "tests" / "scripts" / "bootstrap.sh")],
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_venv_set_up_for_the_tests_serves_the_demo_as_it_is(tmp_path: Path) -> None:
    """After `make setup` (every extra), `make demo`'s set-up installs nothing; a venv that
    lacks an extra the demo needs is installed into (here it fails, as the venv has no pip,
    with one line saying what), and neither touches apt."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    env, log = tripwired_env(tmp_path, venv)
    marker = venv / ".gmd-installed"
    marker.write_text(stamp(EVERY_EXTRA))

    done = bootstrap(env, GMD_EXTRAS="daemon,admin")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and done.stdout == ""
    assert marker.read_text() == stamp(EVERY_EXTRA)

    marker.write_text(stamp("daemon"))
    wants_admin = bootstrap(env, GMD_EXTRAS="daemon,admin")
    assert wants_admin.returncode == 1
    assert "installing gmd[daemon,admin]" in wants_admin.stderr
    last = wants_admin.stderr.strip().splitlines()[-1]
    assert last.startswith("gmd setup: could not install gmd[daemon,admin]"), last
    assert not log.exists(), log.read_text()


def test_make_demo_sets_up_without_libvirt_or_apt_and_the_demo_runs(tmp_path: Path) -> None:
    """`make setup-demo` (what `make demo` runs first) makes a virtualenv with Python's venv
    module and pip only: no apt, no libvirt-python. The demo then runs from that venv."""
    venv = tmp_path / "venv"
    env, log = tripwired_env(tmp_path, venv)
    made = subprocess.run(
        ["make", "-C", str(REPO), "--no-print-directory", "setup-demo", f"VENV={venv}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    assert not log.exists(), log.read_text()
    assert (venv / ".gmd-installed").read_text() == stamp("daemon,admin")

    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(listed.stdout)}
    assert {"gmd", "matplotlib", "sqlalchemy", "httpx", "prometheus-client"} <= installed
    assert "libvirt-python" not in installed

    demo = subprocess.run(
        [
            *(str(venv / "bin" / "gmd-admin"), "demo", "--dir", str(tmp_path / "demo")),
            *("--vms", "1-2,41", "--hosts", "1", "--days", "0.1"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert (tmp_path / "demo" / "standings.png").read_bytes()[:4] == b"\x89PNG"
