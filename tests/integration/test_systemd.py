"""The systemd units in systemd/: valid, hardened, and starting commands that exist.

`systemd-analyze verify` checks the units the way systemd would load them, and needs no
running systemd, so it works as root in a container without systemd as PID 1. It also checks
that ExecStart='s binary exists. The units name the installed entry points under
/usr/local/bin, so each unit is verified as a copy in a temporary directory whose ExecStart
points at this virtualenv's entry point of the same name.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNITS_DIR = REPO / "systemd"
UNITS = ("gmd-daemon.service", "gmd-agent.service", "gmd-broker.service")
CGROUP_DROPIN = UNITS_DIR / "gmd-agent-cgroup.conf"
INSTALLED_BIN = "/usr/local/bin/"
# The entry points pip installed next to the interpreter that runs the tests.
VENV_BIN = Path(sys.executable).parent

ANALYZE = shutil.which("systemd-analyze")
SYSUSERS = shutil.which("systemd-sysusers")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None,
    reason="systemd-analyze is absent: install Debian's systemd package "
    "(tests/scripts/bootstrap.sh does with GMD_WITH_POSTGRES=1, as `make test` sets)",
)
needs_sysusers = pytest.mark.skipif(
    SYSUSERS is None, reason="systemd-sysusers is absent: install Debian's systemd package"
)


def directives(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment, in order (keys may repeat)."""
    out: list[tuple[str, str, str]] = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not an assignment: {raw!r}"
        out.append((section, key.strip(), value.strip()))
    return out


def values(text: str, section: str, key: str) -> list[str]:
    return [v for s, k, v in directives(text) if s == section and k == key]


def value(text: str, section: str, key: str) -> str:
    """The effective value of a single-valued key (systemd: the last assignment wins)."""
    found = values(text, section, key)
    assert found, f"[{section}] {key}= is not set"
    return found[-1]


def exec_start(unit: str) -> list[str]:
    text = (UNITS_DIR / unit).read_text()
    starts = values(text, "Service", "ExecStart")
    assert len(starts) == 1, f"{unit}: expected exactly one ExecStart=, got {starts}"
    return shlex.split(starts[0])


def for_this_venv(text: str) -> str:
    """The unit with ExecStart='s /usr/local/bin/ replaced by this virtualenv's bin/."""
    lines = []
    for line in text.splitlines(keepends=True):
        if line.startswith("ExecStart=") and INSTALLED_BIN in line:
            line = line.replace(INSTALLED_BIN, f"{VENV_BIN}/", 1)
        lines.append(line)
    return "".join(lines)


def stage(tmp_path: Path, unit: str, *, text: str | None = None, dropin: str | None = None) -> Path:
    """Copy a unit (optionally with a drop-in) into tmp_path, as systemd would find it."""
    path = tmp_path / unit
    path.write_text(for_this_venv(text if text is not None else (UNITS_DIR / unit).read_text()))
    if dropin is not None:
        (tmp_path / f"{unit}.d").mkdir()
        (tmp_path / f"{unit}.d" / "cgroup.conf").write_text(dropin)
    return path


def verify(path: Path) -> tuple[int, list[str]]:
    """Run `systemd-analyze verify`: its exit status and every line about our files.

    Unknown keys and sections are only warnings (exit status 0), so the lines matter as much
    as the status. Lines about other units (dependencies of this machine's own units) are left
    out; so are dependencies' errors (--recursive-errors=no). --man=no: do not look for
    man pages.
    """
    assert ANALYZE is not None
    proc = subprocess.run(
        [ANALYZE, "verify", "--man=no", "--recursive-errors=no", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": "cat"},
    )
    ours = (path.name, path.stem, str(path.parent))
    lines = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.strip() and any(mark in line for mark in ours)
    ]
    return proc.returncode, lines


def scripts() -> dict[str, str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


# --- the units are valid -----------------------------------------------------------------


@needs_analyze
@pytest.mark.parametrize("unit", UNITS)
def test_unit_verifies_cleanly(tmp_path: Path, unit: str) -> None:
    path = stage(tmp_path, unit)
    assert str(VENV_BIN) in path.read_text(), "ExecStart was not pointed at the virtualenv"
    status, lines = verify(path)
    assert (status, lines) == (0, []), f"systemd-analyze verify {unit}:\n" + "\n".join(lines)


@needs_analyze
def test_agent_with_cgroup_dropin_verifies_cleanly(tmp_path: Path) -> None:
    path = stage(tmp_path, "gmd-agent.service", dropin=CGROUP_DROPIN.read_text())
    status, lines = verify(path)
    assert (status, lines) == (0, []), "with gmd-agent-cgroup.conf:\n" + "\n".join(lines)


def edit_setting(text: str, old: str, new: str) -> str:
    """Replace old with new in the first line that is not a comment (and insist it is there)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if not line.lstrip().startswith(("#", ";")) and old in line:
            lines[i] = line.replace(old, new, 1)
            return "".join(lines)
    raise AssertionError(f"{old!r} is not in the unit")


BREAKAGES = {
    # a misspelt directive: systemd ignores it with a warning and exit status 0
    "typo-directive": ("Restart=on-failure", "Restrat=on-failure", "Restrat"),
    # a value systemd cannot parse
    "bad-value": ("ProtectSystem=strict", "ProtectSystem=strickt", "strickt"),
    # a misspelt section: its directives are all ignored (and no ExecStart remains)
    "typo-section": ("[Service]", "[Servce]", "Servce"),
    # a start command that does not exist
    "missing-binary": ("/usr/local/bin/gmd-daemon", "/usr/local/bin/gmd-deamon", "gmd-deamon"),
}


@needs_analyze
@pytest.mark.parametrize("breakage", BREAKAGES)
def test_verify_catches_a_broken_unit(tmp_path: Path, breakage: str) -> None:
    """The check above can fail: deliberately broken copies of the daemon's unit are caught."""
    old, new, named = BREAKAGES[breakage]
    text = (UNITS_DIR / "gmd-daemon.service").read_text()
    broken = edit_setting(text, old, new)
    if breakage == "missing-binary":
        path = tmp_path / "gmd-daemon.service"  # not pointed at the venv: it cannot exist
        path.write_text(broken)
    else:
        path = stage(tmp_path, "gmd-daemon.service", text=broken)
    status, lines = verify(path)
    assert (status, lines) != (0, []), f"{breakage}: systemd-analyze verify found nothing"
    assert any(named in line for line in lines), lines


@needs_analyze
def test_verify_catches_a_broken_dropin(tmp_path: Path) -> None:
    dropin = edit_setting(CGROUP_DROPIN.read_text(), "ReadWritePaths=", "ReadWritePath=")
    status, lines = verify(stage(tmp_path, "gmd-agent.service", dropin=dropin))
    assert any("ReadWritePath" in line for line in lines), (status, lines)


@needs_analyze
@pytest.mark.parametrize(
    ("unit", "dropin", "limit"),
    [
        ("gmd-daemon.service", False, 2.0),
        ("gmd-agent.service", False, 2.0),
        ("gmd-agent.service", True, 2.5),  # as root, with /sys/fs/cgroup writable
    ],
)
def test_exposure_stays_low(tmp_path: Path, unit: str, dropin: bool, limit: float) -> None:
    """systemd's own hardening score (0 best, 10 worst) does not creep up unnoticed."""
    path = stage(tmp_path, unit, dropin=CGROUP_DROPIN.read_text() if dropin else None)
    proc = subprocess.run(
        [
            ANALYZE,
            "security",
            "--offline=yes",
            "--no-pager",
            f"--threshold={round(limit * 10)}",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr


# --- what the units say ------------------------------------------------------------------


@pytest.mark.parametrize("unit", UNITS)
def test_exec_start_is_an_installed_console_script(unit: str) -> None:
    argv = exec_start(unit)
    program = Path(argv[0])
    assert str(program.parent) + "/" == INSTALLED_BIN, argv
    assert program.name == unit.removesuffix(".service")
    assert program.name in scripts(), f"{program.name} is not in pyproject's [project.scripts]"
    assert (VENV_BIN / program.name).is_file(), f"{VENV_BIN / program.name}: not installed"
    # a command word first where the program has several (gmd-broker run)
    assert argv[-2:] == ["--config", "/etc/gmd/gmd.toml"]
    assert all(word.isalpha() for word in argv[1:-2]), argv


@pytest.mark.parametrize("unit", UNITS)
def test_exec_start_options_are_accepted(unit: str) -> None:
    """The entry point parses ExecStart's arguments (--help stops it before it starts)."""
    argv = exec_start(unit)
    program = str(VENV_BIN / Path(argv[0]).name)
    ok = subprocess.run([program, *argv[1:], "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "--config" in ok.stdout
    # the control: an option the program does not have is refused the same way
    bad = subprocess.run(
        [program, "--confg", "/etc/gmd/gmd.toml", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2, bad.stderr


HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "StateDirectory": "gmd",
    "ConfigurationDirectory": "gmd",
    "Restart": "on-failure",
    "RestartPreventExitStatus": "2",  # a bad configuration: restarting cannot help
    "CapabilityBoundingSet": "",
    "User": "gmd",
    "Group": "gmd",
}


@pytest.mark.parametrize("unit", UNITS)
def test_unit_is_hardened(unit: str) -> None:
    text = (UNITS_DIR / unit).read_text()
    for key, want in HARDENING.items():
        assert value(text, "Service", key) == want, f"{unit}: {key}"
    assert value(text, "Service", "RestartSec")
    assert value(text, "Service", "WorkingDirectory") == "/var/lib/gmd"
    after = " ".join(values(text, "Unit", "After")).split()
    assert "network-online.target" in after
    assert "network-online.target" in value(text, "Unit", "Wants").split()
    # gmd-daemon and gmd-agent reload on SIGHUP (systemctl reload); gmd-broker does not,
    # and has no ExecReload= to pretend so
    reload = ["/bin/kill -HUP $MAINPID"] if unit != "gmd-broker.service" else []
    assert values(text, "Service", "ExecReload") == reload
    assert value(text, "Install", "WantedBy") == "multi-user.target"


def test_agent_reaches_libvirt() -> None:
    text = (UNITS_DIR / "gmd-agent.service").read_text()
    assert "libvirtd.service" in " ".join(values(text, "Unit", "After")).split()
    assert value(text, "Service", "SupplementaryGroups") == "libvirt"
    assert "AF_UNIX" in value(text, "Service", "RestrictAddressFamilies").split()


def test_cgroup_dropin_opens_exactly_the_cgroup_tree() -> None:
    unit = (UNITS_DIR / "gmd-agent.service").read_text()
    text = CGROUP_DROPIN.read_text()
    assert value(text, "Service", "User") == "root"
    assert value(text, "Service", "Group") == "root"
    assert value(text, "Service", "SupplementaryGroups") == ""
    assert value(text, "Service", "ProtectControlGroups") == "no"
    assert values(text, "Service", "ReadWritePaths") == ["/sys/fs/cgroup"]
    # what it overrides is set in the unit (else the drop-in would silently do nothing)
    for key in ("User", "Group", "SupplementaryGroups", "ProtectControlGroups"):
        assert values(unit, "Service", key), key
    # and it loosens nothing else
    assert {k for s, k, _ in directives(text)} == {
        "User",
        "Group",
        "SupplementaryGroups",
        "ProtectControlGroups",
        "ReadWritePaths",
    }


# --- the user ----------------------------------------------------------------------------


@needs_sysusers
def test_sysusers_create_gmd_in_group_libvirt(tmp_path: Path) -> None:
    """systemd-sysusers --root writes a scratch /etc: no real user is created."""
    (tmp_path / "etc").mkdir()
    proc = subprocess.run(
        [
            SYSUSERS,
            f"--root={tmp_path}",
            str(UNITS_DIR / "gmd.sysusers"),
            str(UNITS_DIR / "gmd-agent.sysusers"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    passwd = {
        line.split(":")[0]: line.split(":")
        for line in (tmp_path / "etc" / "passwd").read_text().splitlines()
    }
    groups = {
        line.split(":")[0]: line.split(":")
        for line in (tmp_path / "etc" / "group").read_text().splitlines()
    }
    gmd = passwd["gmd"]
    assert gmd[5] == "/var/lib/gmd"  # home: the state directory
    assert gmd[6].endswith("nologin")
    assert int(gmd[2]) < 1000  # a system user
    assert groups["gmd"][2] == gmd[3]  # its own primary group
    assert "gmd" in groups["libvirt"][3].split(",")
