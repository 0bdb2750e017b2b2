"""``gmd-agent --check`` as an operator runs it, on this host: the table of every knob (what
sets it, why not), the document the agent sends the daemon, and one error line when libvirt
cannot be read — against libvirt's test driver for the domains and this machine's own cgroup
and disk files, whatever they are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gmd.agent.capabilities import disks
from gmd.wire import HostCapabilities, Knob, KnobSupport
from tests.support.agent_fixtures import NODE, uri

AGENT = Path(sys.executable).with_name("gmd-agent")


def check(tmp_path: Path, libvirt_uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "gmd.toml"
    config.write_text(
        f'[agent]\nhost = "cmp-check"\nlibvirt_uri = "{libvirt_uri}"\n'
        f'enforcement_state_path = "{tmp_path / "state.json"}"\n'
    )
    return subprocess.run(
        [str(AGENT), "--config", str(config), "--check", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_prints_every_knob_and_changes_nothing(tmp_path: Path) -> None:
    done = check(tmp_path, uri(NODE))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("host cmp-check: backend libvirt, cgroup ")
    assert lines[1].split() == ["KNOB", "SUPPORT", "VIA", "REASON"]
    assert [line.split()[0] for line in lines[2:]] == [k.value for k in Knob]
    assert not (tmp_path / "state.json").exists()  # nothing remembered: nothing changed

    done = check(tmp_path, uri(NODE), "--format", "json")
    assert done.returncode == 0, done.stderr
    caps = HostCapabilities.model_validate_json(done.stdout)
    assert caps.backend == "libvirt"
    # This machine's disks, as their files say, whichever scheduler runs them.
    assert set(caps.schedulers) == {d.name for d in disks()}
    weight = caps.support(Knob.disk_weight)
    if any(d.active not in ("bfq", "cfq") for d in disks()):
        assert weight.support == KnobSupport.unsupported and weight.reason
    assert caps.support(Knob.disk_limit).support == KnobSupport.supported  # QEMU's own


def test_check_without_libvirt_is_one_line_and_exit_1(tmp_path: Path) -> None:
    done = check(tmp_path, "qemu+unix:///system?socket=/nonexistent/libvirt-sock")
    assert done.returncode == 1, (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("gmd-agent: error:")]
    assert len(errors) == 1 and "cannot connect to libvirt at" in errors[0]
    assert "Traceback" not in done.stderr
