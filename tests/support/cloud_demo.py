"""``make cloud-demo``: gmd's story told in a real small OpenStack cloud, with real Nova servers.

``gmd-admin demo`` replays traces through simulated hosts; this one runs everything for real on
this machine (tests/scripts/nova_cloud.sh's cloud: Keystone, Placement, Glance, RabbitMQ and Nova's
API, conductor, scheduler and compute on libvirt/QEMU). Projects' members boot servers through the
Nova API: acme's two guests spin, initech's and the operator's idle. ``gmd-agent`` runs on the
compute host with its default collector, reading the domains Nova wrote; ``gmd-daemon`` (its
SQLite ledger, every batch vouched for by Placement, ``enforcement.mode = "on"``) accounts them
every 10 s. acme takes more than its third of the host, climbs to level 1, is capped on the
host and its Nova quota is lowered, so that its member's next boot is refused; the operator's
``gmd-admin`` and the member's ``openstack fairness explain`` say why. acme's member then
pauses its guests: its balance decays, the caps are lifted and the quota put back exactly.

The settings are the end-to-end test's (tests/support/cloud_story.py): a 30 s half-life, so that the
story takes minutes, not days. Files (configuration, ledger, logs) stay in ``--dir``.

Run by ``make cloud-demo``, which starts the cloud first and stops it after:
``python -m tests.support.cloud_demo CLOUD_JSON``. Exit codes: 0 told to the end, 1 a step failed
(the message says which, and where its log is), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from tests.support.cloud_story import (
    CAP,
    CAPPED_VCPU_QUOTA,
    ENFORCEMENT,
    INTERVAL_S,
    agent_settings,
    cpu_rate,
    daemon_sections,
    live_settings,
    quota,
    register_fairness,
    server_action,
    toml_document,
    unregister_fairness,
)
from tests.support.nova_support import NovaCloud, Server

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MARKER = ".gmd-cloud-demo"
"""Marks a directory as this demo's own, so that a rerun may empty it."""
PHASE_TIMEOUT_S = 300.0


class DemoFailed(Exception):
    """A step of the story did not happen; the message says which and where to look."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.cloud_demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "cloud_json", type=Path, help="the cloud.json tests/scripts/nova_cloud.sh printed"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=REPO / "var" / "cloud-demo",
        help="where the demo's files go (emptied first; default var/cloud-demo)",
    )
    args = parser.parse_args(argv)
    try:
        info = json.loads(args.cloud_json.read_text())
    except (OSError, ValueError) as exc:
        parser.error(f"cannot read {args.cloud_json}: {exc}")
    try:
        run(NovaCloud(info, Path(info["clouds_yaml"])), args.dir, sys.stdout)
    except (DemoFailed, AssertionError, OSError, KeyError) as exc:
        # A step that did not happen (the cloud refused a boot, a file could not be written):
        # one line that says which, never a traceback.
        print(f"\ncloud demo: {exc}", file=sys.stderr)
        return 1
    return 0


def run(nova: NovaCloud, root: Path, out: TextIO) -> dict[str, float]:
    """The story, start to end; returns how long its phases took (seconds)."""
    began = time.monotonic()
    root = prepare(root)
    say = Narrator(out)
    # gmd-daemon (Placement, quotas, project names), gmd-admin and the openstack command line
    # find the cloud's accounts in its clouds.yaml, as on an operator's machine.
    os.environ["OS_CLIENT_CONFIG_FILE"] = str(nova.clouds_yaml)
    acme = nova.projects["acme"]
    host = nova.info["compute_host"]
    say(
        f"gmd cloud demo: a real OpenStack cloud on this machine (Nova {host}, libvirt/QEMU,"
        f" started in {nova.info.get('started_s', '?')} s); files in {root}"
    )
    original_quota = quota(nova, acme)
    servers: list[Server] = []
    times: dict[str, float] = {}
    try:
        say.step("1/5", "project members boot servers through the Nova API")
        for project, role in (("acme", "spin"), ("acme", "spin"), ("initech", "idle")):
            servers.append(nova.boot(project, role))
        servers.append(nova.boot("admin", "idle"))
        for server in servers:
            role = "spins its CPU" if "-spin-" in server.name else "idles"
            say(f"  {server.name:<34} {server.id}  domain {server.domain}: {role}")
        say(
            f"  acme's Nova quota: {fmt_quota(original_quota)}; every project's fair share is a"
            " third of the host (three run servers)"
        )
        times["boot_s"] = time.monotonic() - began

        say.step("2/5", "gmd-daemon (SQLite ledger) and gmd-agent on the compute host")
        port = free_port()
        write_configs(nova, root, port)
        url = f"http://127.0.0.1:{port}"
        with (
            process(root, "gmd-daemon", "--config", str(root / "gmd.toml"), "--port", str(port)),
            catalog_entry(nova, url),
        ):
            wait_until("gmd-daemon answers", lambda: answers(f"{url}/healthz"), root, "gmd-daemon")
            say(
                f"  gmd-daemon on {url}: accounts every {INTERVAL_S} s, checks each batch against"
                " Placement, enforcement mode on; in the catalog as service type 'fairness'"
            )
            with process(root, "gmd-agent", "--config", str(root / "agent.toml")):
                say(
                    f"  gmd-agent on {host}: reads the {nova.domain_prefix}* domains Nova wrote"
                    " (owner: Nova's metadata), posts every interval, applies the host's plan"
                )
                times.update(tell(nova, root, say, servers, acme, original_quota))
    finally:
        for server in servers:
            with contextlib.suppress(AssertionError):
                nova.delete(server)
    total = time.monotonic() - began
    say(
        f"\nDone in {total:.0f} s. The ledger, configuration and logs are in {root}:\n"
        f"  GMD_CONFIG={root / 'gmd.toml'} {BIN / 'gmd-admin'} report --group-by host\n"
        "Start the cloud alone (and leave it running) with: bash tests/scripts/nova_cloud.sh"
    )
    return {**times, "total_s": round(total, 1)}


def tell(
    nova: NovaCloud,
    root: Path,
    say: Narrator,
    servers: list[Server],
    acme: str,
    original_quota: dict[str, int],
) -> dict[str, float]:
    """Steps 3-5: acme climbs, is throttled and explained, stops and is restored."""
    t0 = time.monotonic()
    spin = servers[0]
    virt = nova.libvirt()
    try:
        dom = virt.lookupByUUIDString(spin.id)
        before = live_settings(dom)
        say.step(
            "3/5", "every interval: each project's balance (positive: took more than its share)"
        )
        watch = Watch(root, say)
        wait_until("acme at level 1", lambda: watch.level(acme) >= 1, root, "gmd-daemon", watch)
        climbed = time.monotonic() - t0
        say(f"  acme reached level 1 after {climbed:.0f} s")
        admin(root, say, "standings")

        say.step("4/5", "acme is throttled: capped on the host, its quota lowered")
        wait_until(
            "acme's guest capped",
            lambda: live_settings(dom)["sched"].get("vcpu_quota") == CAPPED_VCPU_QUOTA,
            root,
            "gmd-agent",
        )
        sched = live_settings(dom)["sched"]
        rate = cpu_rate(dom)
        say(
            f"  libvirt, LIVE on {spin.domain}: vcpu_quota {sched['vcpu_quota']} µs per"
            f" {sched['vcpu_period']} µs ({CAP:.0%} of a core); it now uses {rate:.2f} cores"
            f" (the definition on disk is unchanged)"
        )
        say("  what the compute host can set, as its agent probed it (gmd-agent --check):")
        admin(
            root,
            say,
            "hosts",
            *columns("host", "cgroup", "disks", "cpu_weight", "cpu_cap", "disk_weight"),
            *columns("disk_limit", "missing"),
        )
        wait_until(
            "acme's quota lowered",
            lambda: quota(nova, acme)["cores"] == ENFORCEMENT["quota"]["floor_cores"],
            root,
            "gmd-daemon",
        )
        say(f"  acme's Nova quota: {fmt_quota(original_quota)} → {fmt_quota(quota(nova, acme))}")
        refused = nova.ask_to_boot("acme", "idle")
        message = refused.json().get("forbidden", {}).get("message", refused.text)
        say(f"  acme's member asks Nova for one more server: {refused.status_code} {message}")
        if refused.status_code == 202:
            raise DemoFailed("Nova accepted acme's boot below its lowered quota")
        admin(root, say, "explain", "acme")
        explain = ["fairness", "explain", "--max-width", "110"]
        say(f"\n$ openstack --os-cloud acme {' '.join(explain)}      (as acme's member)")
        done = subprocess.run(
            [str(BIN / "openstack"), "--os-cloud", nova.member_cloud("acme"), *explain],
            capture_output=True,
            text=True,
            timeout=120,
        )
        say(done.stdout.rstrip() or done.stderr.rstrip())

        say.step("5/5", "acme's member pauses its guests: its balance decays")
        for server in (s for s in servers if s.project == "acme"):
            server_action(nova, server.id, "acme", "pause")
        paused = time.monotonic()
        wait_until(
            "acme back at level 0", lambda: watch.level(acme) == 0, root, "gmd-daemon", watch
        )
        wait_until("acme's caps lifted", lambda: live_settings(dom) == before, root, "gmd-agent")
        wait_until(
            "acme's quota restored",
            lambda: quota(nova, acme) == original_quota,
            root,
            "gmd-daemon",
        )
        decayed = time.monotonic() - paused
        say(
            f"  after {decayed:.0f} s: level 0, the guest's live settings are exactly what they"
            f" were, acme's quota is {fmt_quota(quota(nova, acme))} again"
        )
        admin(
            root,
            say,
            "actions",
            "--customer",
            "acme",
            *columns("at", "kind", "host", "status", "knobs"),
        )
    finally:
        virt.close()
    return {"climb_s": round(climbed, 1), "restore_s": round(decayed, 1)}


# --- the narration --------------------------------------------------------------------------


class Narrator:
    """Prints the story as it happens (flushed: ``make`` shows it line by line)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def step(self, number: str, what: str) -> None:
        self(f"\n[{number}] {what}")


class Watch:
    """Each project's standing after every accounted interval, one line per interval, from
    ``gmd-admin standings`` (what an operator would run)."""

    def __init__(self, root: Path, say: Narrator) -> None:
        self.root, self.say = root, say
        self.levels: dict[str, int] = {}
        self.shown: set[str] = set()

    def level(self, project: str) -> int:
        rows = json.loads(gmd_admin(self.root, "standings", "-f", "json"))
        rows = rows.get("customers", rows) if isinstance(rows, dict) else rows
        line = []
        stamp = ""
        for row in rows:
            customer = str(row.get("customer"))
            name = str(row.get("name") or customer)
            self.levels[customer] = int(row.get("level") or 0)
            self.levels[name] = self.levels[customer]
            stamp = str(row.get("interval") or row.get("as_of") or stamp)
            line.append(f"{name} {float(row.get('balance', 0)):+.2f} (level {self.levels[name]})")
        key = json.dumps(rows, sort_keys=True)
        if line and key not in self.shown:
            self.shown.add(key)
            self.say(f"  {stamp or time.strftime('%H:%M:%S')}  " + " · ".join(line))
        return self.levels.get(project, 0)

    def __call__(self) -> str:
        return ", ".join(f"{k}: level {v}" for k, v in self.levels.items())


def admin(root: Path, say: Narrator, *args: str) -> None:
    """Runs ``gmd-admin ARGS`` as the operator would type it, and shows its output."""
    say(f"\n$ gmd-admin {' '.join(args)}")
    say(gmd_admin(root, *args).rstrip())


def columns(*names: str) -> list[str]:
    return [arg for name in names for arg in ("-c", name)]


def gmd_admin(root: Path, *args: str) -> str:
    env = {**os.environ, "GMD_CONFIG": str(root / "gmd.toml"), "COLUMNS": "120"}
    done = subprocess.run(
        [str(BIN / "gmd-admin"), *args], capture_output=True, text=True, env=env, timeout=120
    )
    if done.returncode != 0:
        raise DemoFailed(f"gmd-admin {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    return done.stdout


def fmt_quota(q: dict[str, int]) -> str:
    return f"{q['cores']} cores, {q['ram']} MiB, {q['instances']} servers"


# --- files and processes -------------------------------------------------------------------


def prepare(root: Path) -> Path:
    """An empty directory of the demo's own (an earlier demo's is emptied; anything else is
    refused rather than deleted)."""
    root = root.resolve()
    if root.exists() and any(root.iterdir()):
        if not (root / MARKER).exists():
            raise DemoFailed(f"{root} is not empty and not an earlier cloud demo's: give --dir")
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).touch()
    return root


def write_configs(nova: NovaCloud, root: Path, port: int) -> None:
    """gmd.toml (the daemon's and gmd-admin's) and agent.toml; the agent's token in a file,
    its SHA-256 in gmd.toml, as in production."""
    host = nova.info["compute_host"]
    token = secrets.token_urlsafe(24)
    token_file = root / "agent.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    sections = daemon_sections(nova)
    sections["daemon"] = {**sections["daemon"], "port": port, "auth": "token"}
    doc = {
        "database": {"url": f"sqlite:///{root / 'ledger.db'}"},
        **sections,
        "hosts": {
            host: {"owner": "operator", "token_sha256": hashlib.sha256(token.encode()).hexdigest()}
        },
    }
    (root / "gmd.toml").write_text(
        "# Written by make cloud-demo: gmd-daemon's and gmd-admin's configuration.\n"
        + toml_document(doc)
    )
    agent = {**agent_settings(nova, f"http://127.0.0.1:{port}", root), "token_file": "agent.token"}
    (root / "agent.toml").write_text(
        f"# Written by make cloud-demo: gmd-agent on {host}.\n" + toml_document({"agent": agent})
    )


@contextlib.contextmanager
def process(root: Path, name: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``name ARGS`` (a gmd command of this venv), logging to ROOT/NAME.log; SIGTERM at the end
    (the agent puts back what it changed on the host before it exits)."""
    with (root / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(BIN / name), *args, "--log-level", "info"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextlib.contextmanager
def catalog_entry(nova: NovaCloud, url: str) -> Iterator[None]:
    service = register_fairness(nova, url)
    try:
        yield
    finally:
        unregister_fairness(nova, service)


def wait_until(
    what: str,
    check: Callable[[], Any],
    root: Path,
    log: str,
    state: Callable[[], str] | None = None,
    timeout_s: float = PHASE_TIMEOUT_S,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            seen = f" (seen: {state()})" if state is not None else ""
            raise DemoFailed(
                f"no {what} after {timeout_s:.0f} s{seen}; see {root / (log + '.log')}"
            )
        time.sleep(1.0)


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5).close()
    except OSError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
