"""A compute host runs gmd-agent without the daemon's libraries, and the daemon without libvirt.

tests/repository/test_layout.py reads the imports; these tests run them: a fresh interpreter loads
each entry point (and then every module of its process) and looks at what ended up in
``sys.modules``. The slow test installs ``gmd[agent]`` into a clean virtualenv (no system
site-packages) from PyPI, as a compute host would, and runs ``gmd-agent --help`` there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_packaging import DAEMON_DISTRIBUTIONS
from tests.repository.test_layout import DAEMON_LIBRARIES
from tests.support import needs
from tests.support.source_tree import copy_source

REPO = Path(__file__).resolve().parents[2]

# Run the entry point's --help, then import every module of its process, then print the
# top-level names of everything loaded.
LOAD = """
import importlib, json, pkgutil, sys
sys.argv = [{script!r}, "--help"]
from gmd.{process} import cli
try:
    cli.main()
except SystemExit as stop:
    assert stop.code in (0, None), f"{script} --help exited {{stop.code}}"
import gmd.{process} as package
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by(
    process: str, script: str, python: str = sys.executable, cwd: Path = REPO
) -> list[str]:
    """The modules a fresh interpreter holds after ``script --help`` and importing every
    module of ``gmd.<process>``."""
    proc = subprocess.run(
        [python, "-c", LOAD.format(process=process, script=script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert proc.returncode == 0, f"{script}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Usage" in proc.stdout, proc.stdout[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def tops(modules: list[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_the_agent_loads_none_of_the_daemons_libraries() -> None:
    needs.extra("libvirt")
    modules = loaded_by("agent", "gmd-agent")
    assert "gmd.agent.collect.libvirt" in modules  # every module was imported
    assert not tops(modules) & DAEMON_LIBRARIES, sorted(tops(modules) & DAEMON_LIBRARIES)
    crossing = [m for m in modules if m.startswith(("gmd.daemon", "gmd.admin"))]
    assert not crossing, crossing


def test_the_daemon_loads_no_libvirt() -> None:
    modules = loaded_by("daemon", "gmd-daemon")
    assert "gmd.daemon.api.app" in modules
    assert "libvirt" not in tops(modules)
    crossing = [m for m in modules if m.startswith(("gmd.agent", "gmd.admin"))]
    assert not crossing, crossing


@pytest.mark.slow
def test_gmd_agent_installs_and_runs_in_a_clean_virtualenv(tmp_path: Path) -> None:
    """`pip install gmd[agent]` into a virtualenv that sees no other site-packages: pip
    fetches the agent's dependencies from PyPI and builds libvirt-python against the libvirt
    headers (tests/scripts/bootstrap.sh installs libvirt-dev); pip's wheel cache makes later runs
    quicker. Nothing of the daemon's is installed, and gmd-agent runs."""
    src = copy_source(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    no_site = subprocess.run(
        [
            python,
            "-c",
            "import sys; print(sys.flags.no_site, any('site-packages' in p "
            "and not p.startswith(sys.prefix) for p in sys.path))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert no_site.stdout.split() == ["0", "False"], "the virtualenv sees outside site-packages"

    started = time.monotonic()
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", f"{src}[agent]"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    took = time.monotonic() - started
    assert install.returncode == 0, (
        f"pip install gmd[agent] failed after {took:.0f} s:\n"
        f"{install.stdout[-3000:]}\n{install.stderr[-3000:]}"
    )
    print(f"pip install gmd[agent] took {took:.0f} s")

    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(listed.stdout)}
    assert {"gmd", "libvirt-python", "httpx", "prometheus-client", "pydantic"} <= installed
    assert not installed & DAEMON_DISTRIBUTIONS, sorted(installed & DAEMON_DISTRIBUTIONS)

    agent = subprocess.run(
        [str(venv / "bin" / "gmd-agent"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert agent.returncode == 0, agent.stderr[-3000:]
    assert "Usage" in agent.stdout

    # every module of the agent imports there, libvirt's included
    modules = loaded_by("agent", "gmd-agent", python=python, cwd=tmp_path)
    assert "libvirt" in tops(modules)
    assert not tops(modules) & DAEMON_LIBRARIES
    # and from the installed copy, not this checkout
    where = subprocess.run(
        [python, "-c", "import gmd; print(gmd.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert where.stdout.strip().startswith(str(venv)), where.stdout
