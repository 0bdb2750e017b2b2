"""A user who installs gmd from a wheel runs its demo anywhere: nothing beside a checkout needed.

The wheel is built from this tree as a user would (``pip wheel --no-deps``), installed with only
the demo's extras (``gmd[daemon,admin]``: no libvirt binding) into a fresh virtualenv that sees
no other site-packages, and ``gmd-admin demo`` runs from a directory outside the checkout with
no ``PYTHONPATH``: the traces it replays are the ones the wheel carries
(``gmd/admin/demo_data``), the daemon's schema migrations the ones it installs. pip fetches the
dependencies from PyPI (its cache makes later runs quicker).

The demo runs with its defaults (100 VMs, 4 hosts, 3 days), as `make demo` does: the one check
that the default replay fits the shipped data end to end (tests/integration/test_demo.py runs a
shorter cloud against the traces' own figures).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from gmd.admin.demo import CUSTOMER_BLOCKS, PACKAGED_TRACES
from tests.support.source_tree import copy_source

REPO = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    """This environment without what would let the installed gmd find the checkout (or this
    virtualenv): no PYTHON*, VIRTUAL_ENV or GMD_* variables."""
    return {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "VIRTUAL_ENV", "GMD_"))
        },
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def test_a_wheel_with_daemon_and_admin_runs_the_demo_outside_the_checkout(
    tmp_path: Path,
) -> None:
    env = clean_env()
    src = copy_source(tmp_path / "src")
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("gmd-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        traces = {n for n in zf.namelist() if n.startswith("gmd/admin/demo_data/")}
    packaged = {
        p.relative_to(REPO).as_posix() for p in PACKAGED_TRACES.parent.rglob("*") if p.is_file()
    }
    assert traces == packaged and len(packaged) == 101  # 100 traces and their README

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    started = time.monotonic()
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[daemon,admin]"],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    print(f"pip install gmd[daemon,admin] from the wheel: {time.monotonic() - started:.0f} s")

    started = time.monotonic()
    demo = subprocess.run(
        [str(venv / "bin" / "gmd-admin"), "demo", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        cwd=tmp_path,
    )
    print(f"gmd-admin demo: {time.monotonic() - started:.0f} s")
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    out = demo.stdout
    assert "gmd demo: 100 Bitbrains VMs of 6 customers" in out
    assert "accounting 288 intervals" in out  # the whole 3 days of the shipped traces
    standings = out.split("gmd-admin standings\n", 1)[1].split("\n$ ", 1)[0]
    assert standings.startswith("Standings\n"), standings
    for customer, _first, _last in CUSTOMER_BLOCKS:
        assert f"\n{customer} " in standings, customer
    # The agents replayed the wheel's traces, from the virtualenv, not this checkout's.
    agent = (tmp_path / "demo" / "agent-cmp-01.toml").read_text()
    assert f'replay_dir = "{venv}/lib/' in agent and str(REPO) not in agent, agent
