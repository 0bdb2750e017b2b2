"""A whole small OpenStack cloud whose Nova boots real QEMU guests (tests/scripts/nova_cloud.sh
runs it).

Runs under the cloud's own venv (var/nova/venv), not gmd's: it imports only the standard
library, that venv's openstacksdk, psycopg2 and libvirt-python. What runs, all on 127.0.0.1
(the recipe, its traps and their fixes: the project's notes on Nova's boot path):

- a private PostgreSQL cluster (run as the postgres user) with every service's database, reached
  through psycopg2 (psycopg 3 breaks Nova's ``inet`` columns and Placement's allocation writes);
- a private RabbitMQ (root, no systemd; its own epmd port, so it meets no other Erlang here);
- Keystone, Placement, Glance (file store) and the Nova API under gunicorn, one worker each;
- a second Nova API, ``RegionTwo`` of the catalog, with ``UnifiedLimitsDriver``: its quotas are
  Keystone's limits (registered for that region) and its usage is counted in Placement (at
  microversion 1.9, below the 1.38 whose ``/usages`` fails on PostgreSQL). It boots into the
  same cell, scheduler and compute host, so a member's server is the same guest either way;
- a stub of Neutron's API that lists nothing: Nova's server show/list/delete ask Neutron for the
  server's ports even when it was booted with ``networks: "none"``;
- nova-conductor, nova-scheduler and nova-compute with the libvirt driver (``virt_type = qemu``,
  TCG) on this machine's ``qemu:///system``, its domains named ``gmdnova-%08x``.

The first start builds the seed (``STATE/seed``: databases, Keystone's users, projects acme and
initech with a member each, the catalog, the registered compute host, the tiny guest's images
and a flavor), about a minute; every start after copies it to ``STATE/run`` (paths inside are
absolute) and starts the services on it, so each test session begins from the same cloud.
``start`` waits until the compute host is ready (a heartbeat newer than this start, a host
mapping, an inventory in Placement) and prints the path of ``run/cloud.json``. ``stop`` deletes
the servers left (through the API, or straight in libvirt when the API is gone), stops every
process it started by its pid, and leaves no domain of the prefix behind.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import grp
import hashlib
import http.server
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GUEST_IMAGE_PY = REPO / "tests" / "support" / "guest_image.py"
# Ports of its own, below Linux's ephemeral range (32768-60999), apart from
# tests/scripts/openstack.sh's (25357, 25378, 25774, 25775) and gmd's test PostgreSQL (54329).
PORTS = {
    "postgres": 26432,
    "rabbitmq": 26672,
    "rabbitmq-dist": 26673,
    "epmd": 26369,
    "keystone": 26357,
    "placement": 26378,
    "glance": 26292,
    "nova-api": 26774,
    "nova-api-unified": 26775,
    "neutron-stub": 26696,
}
KEYSTONE_URL = f"http://127.0.0.1:{PORTS['keystone']}/v3"
HTTP = ("keystone", "placement", "glance", "nova-api", "nova-api-unified", "neutron-stub")
"""The services that answer HTTP, in their start order."""
NOVA = ("nova-conductor", "nova-scheduler", "nova-compute")
"""Nova's RPC services (console scripts), in their start order."""
PASSWORD = "gmd-test-secret"
"""Every account's password: a throwaway cloud on loopback."""
CUSTOMERS = ("acme", "initech")
UNIFIED_REGION = "RegionTwo"
"""The region of the Nova API on unified limits (``nova-api-unified``)."""
REGISTERED = {
    "servers": 10,
    "class:VCPU": 20,
    "class:MEMORY_MB": 51200,
    "class:DISK_GB": 1000,
    "server_metadata_items": 128,
    "server_injected_files": 5,
    "server_injected_file_content_bytes": 10240,
    "server_injected_file_path_bytes": 255,
    "server_key_pairs": 100,
    "server_groups": 10,
    "server_group_members": 10,
}
"""``RegionTwo``'s registered limits: Nova's own legacy defaults (20 cores, 50 GiB, 10 servers),
so that a project starts from the same quota in either region; the same set as the quota
cloud's (tests/scripts/openstack_cloud.py), one for each resource Nova 34's unified limits name."""
PREFIX = "gmdnova-"
"""The domains' names: Nova's ``instance_name_template`` is PREFIX + ``%08x``."""
COMPUTE_HOST = "gmdnova-compute"
RABBIT_NODE = "gmdnova@localhost"
FLAVOR = {"name": "gmdnova-tiny", "vcpus": 1, "ram": 128, "disk": 1}
"""A disk of 1 GB, not 0: members may not boot zero-disk flavors (the default policy)."""
ROLES = ("spin", "idle", "job")
"""The tiny guest's roles (tests/support/guest_image.py), one AMI each."""
CMDLINE = "console=ttyS0 panic=1 no_timer_check gmd.role={role}"
DATABASES = ("keystone", "placement", "glance", "nova_api", "nova_cell0", "nova_cell1")
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path)
    parser.add_argument(
        "action",
        choices=("start", "stop", "neutron-stub", "fake-compute", "remove-fakes", "scheduler"),
        nargs="?",
    )
    parser.add_argument("--port", type=int, default=PORTS["neutron-stub"])
    parser.add_argument("--host", help="fake-compute: the compute service's host name")
    parser.add_argument("--driver", help="fake-compute: Nova's driver, e.g. fake.SmallFakeDriver")
    parser.add_argument(
        "--config-file",
        type=Path,
        action="append",
        default=[],
        help="scheduler: read after nova.conf (restarts nova-scheduler; none: as seeded)",
    )
    parser.add_argument("--pythonpath", help="scheduler: PYTHONPATH of the restarted scheduler")
    args = parser.parse_args()
    if args.action == "neutron-stub":
        serve_neutron_stub(args.port)
        return 0
    state: Path = args.state.resolve()
    if args.action == "stop":
        stop(state / "run")
        return 0
    if args.action == "fake-compute":
        start_fake_compute(state / "run", args.host, args.driver)
        return 0
    if args.action == "remove-fakes":
        remove_fake_computes(state / "run")
        return 0
    if args.action == "scheduler":
        restart_scheduler(state / "run", args.config_file, args.pythonpath)
        return 0
    started = time.monotonic()
    seed = state / "seed"
    cold = seed_recipe(seed) != recipe()
    run = state / "run"
    try:
        if cold:
            build_seed(state)
        stop(run)
        shutil.rmtree(run, ignore_errors=True)
        # cp -a, not copytree: PostgreSQL's data directory must stay the postgres user's.
        sh(["cp", "-a", str(seed), str(run)])
        start_all(state)
    except BaseException:
        say(f"start failed; stopping what started (logs stay in {run})")
        stop(run)
        raise
    info = json.loads((run / "cloud.json").read_text())
    info["started_s"] = round(time.monotonic() - started, 1)
    info["cold"] = cold
    (run / "cloud.json").write_text(json.dumps(info, indent=2))
    print(run / "cloud.json")
    return 0


def recipe() -> str:
    """What the seed is built by (this file, and the guest's roles, whose initramfs its images
    hold): a seed another version built is built anew."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(GUEST_IMAGE_PY.read_bytes())
    return digest.hexdigest()[:16]


def seed_recipe(seed: Path) -> str | None:
    try:
        return str(json.loads((seed / "cloud.json").read_text()).get("recipe"))
    except (OSError, ValueError):
        return None


# --- processes ----------------------------------------------------------------------------


def venv_bin(run: Path) -> Path:
    return run.parent / "venv" / "bin"


def environment(run: Path) -> dict[str, str]:
    """One environment for every service: each finds its configuration by it, and the ``sudo``
    shim (run/bin) comes first on PATH: privsep runs ``sudo privsep-helper``, and there is no
    sudo here (we are root already)."""
    env = dict(os.environ, HOME=str(run))
    env.pop("OS_CLIENT_CONFIG_FILE", None)
    env["PATH"] = f"{run / 'bin'}:{venv_bin(run)}:{env.get('PATH', '/usr/bin:/bin')}"
    env["OS_KEYSTONE_CONFIG_FILES"] = str(run / "keystone" / "keystone.conf")
    env["OS_PLACEMENT_CONFIG_DIR"] = str(run / "placement")
    env["OS_GLANCE_CONFIG_DIR"] = str(run / "glance")
    env["OS_NOVA_CONFIG_DIR"] = str(run / "nova")
    return env


# oslo.config parses sys.argv: under gunicorn it would see gunicorn's options and refuse them.
WSGI = {
    "keystone": "from keystone.server.wsgi import initialize_public_application as init\n"
    "application = init()\n",
    "placement": "from placement.wsgi.api import application\n",
    "glance": "from glance.wsgi.api import application\n",
    "nova-api": "from nova.wsgi.osapi_compute import application\n",
    "nova-api-unified": "from nova.wsgi.osapi_compute import application\n",
}
NOVA_CONFIG = {"nova-api": "nova", "nova-api-unified": "nova-unified"}
"""Each Nova API's configuration directory (``OS_NOVA_CONFIG_DIR``) under ``run``."""


def spawn(run: Path, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
    """Starts ``name`` in a session of its own (its pid is its process group's id)."""
    log = open(run / f"{name}.log", "ab")  # noqa: SIM115 - the child holds it
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=env or environment(run),
        cwd=run,
        start_new_session=True,
    )
    log.close()
    (run / f"{name}.pid").write_text(str(process.pid))


def serve(run: Path, name: str) -> None:
    port = PORTS[name]
    if not port_free(port):
        raise SystemExit(f"port {port} for {name} is taken by another program")
    if name == "neutron-stub":
        spawn(
            run,
            name,
            [
                str(venv_bin(run) / "python"),
                str(Path(__file__).resolve()),
                "neutron-stub",
                "--port",
                str(port),
            ],
        )
        return
    module = run / f"wsgi_{name.replace('-', '_')}.py"
    module.write_text("import sys\n\nsys.argv = sys.argv[:1]\n" + WSGI[name])
    env = environment(run)
    if name in NOVA_CONFIG:
        env["OS_NOVA_CONFIG_DIR"] = str(run / NOVA_CONFIG[name])
    spawn(
        run,
        name,
        [
            str(venv_bin(run) / "gunicorn"),
            "--chdir",
            str(run),
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--threads",
            "4",
            "--timeout",
            "120",
            "--no-control-socket",
            f"{module.stem}:application",
        ],
        env,
    )


def start_nova_service(run: Path, name: str) -> None:
    conf = run / "nova" / "nova.conf"
    spawn(run, name, [str(venv_bin(run) / name), "--config-file", str(conf)])


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie still has a pid; its state in /proc says it is gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def wait_for(
    what: str,
    check: Callable[[], bool],
    run: Path,
    timeout_s: float = READY_TIMEOUT_S,
    watch: tuple[str, ...] = (),
) -> None:
    """Polls ``check`` until it holds; fails naming ``what`` and the log of a watched process
    that died meanwhile (or of the first watched one, on a timeout)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        for name in watch:
            pidfile = run / f"{name}.pid"
            if pidfile.exists() and not alive(int(pidfile.read_text())):
                raise SystemExit(f"{name} exited while waiting for {what}:\n{tail(run, name)}")
        if time.monotonic() > deadline:
            logs = "\n".join(tail(run, name) for name in watch)
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}\n{logs}")
        time.sleep(0.25)


def tail(run: Path, name: str) -> str:
    log = run / f"{name}.log"
    text = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    return f"--- {log}\n{text}"


def http_answers(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).close()
    except urllib.error.HTTPError:
        return True  # any HTTP answer: the application is loaded
    except OSError:
        return False
    return True


# --- PostgreSQL and RabbitMQ --------------------------------------------------------------


def pg_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise SystemExit(
            "no PostgreSQL server under /usr/lib/postgresql (apt-get install postgresql)"
        )
    return found[-1].parent


def as_postgres(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: the cluster is the postgres user's."""
    if os.getuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


def pg_data(run: Path) -> Path:
    return run / "pg" / "data"


def db_url(name: str) -> str:
    return f"postgresql+psycopg2://postgres@127.0.0.1:{PORTS['postgres']}/{name}"


def init_postgres(run: Path) -> None:
    (run / "pg").mkdir(parents=True)
    if os.getuid() == 0:
        shutil.chown(run / "pg", "postgres", "postgres")
    sh(
        as_postgres(
            [str(pg_bin() / "initdb"), "-D", str(pg_data(run)), "-A", "trust", "-U", "postgres"]
        )
    )


def start_postgres(run: Path) -> None:
    if not port_free(PORTS["postgres"]):
        raise SystemExit(f"port {PORTS['postgres']} for PostgreSQL is taken by another program")
    log = run / "postgres.log"
    log.touch()
    if os.getuid() == 0:
        shutil.chown(log, "postgres", "postgres")
    options = (
        f"-c listen_addresses=127.0.0.1 -p {PORTS['postgres']} -k {run / 'pg'} -c fsync=off"
        " -c full_page_writes=off -c synchronous_commit=off -c max_connections=200"
    )
    sh(
        as_postgres(
            [
                str(pg_bin() / "pg_ctl"),
                "-D",
                str(pg_data(run)),
                "-l",
                str(run / "postgres.log"),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ]
        )
    )


def stop_postgres(run: Path) -> None:
    if (pg_data(run) / "postmaster.pid").exists():
        subprocess.run(
            as_postgres(
                [
                    str(pg_bin() / "pg_ctl"),
                    "-D",
                    str(pg_data(run)),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    "60",
                    "stop",
                ]
            ),
            capture_output=True,
        )


def rabbit_env(run: Path) -> dict[str, str]:
    directory = run / "rabbitmq"
    return dict(
        os.environ,
        HOME=str(directory),
        RABBITMQ_NODENAME=RABBIT_NODE,
        RABBITMQ_CONFIG_FILE=str(directory / "rabbitmq.conf"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(directory / "enabled_plugins"),
        RABBITMQ_MNESIA_BASE=str(directory / "mnesia"),
        RABBITMQ_LOG_BASE=str(directory / "log"),
        RABBITMQ_PID_FILE=str(directory / "rabbitmq.pid"),
        RABBITMQ_DIST_PORT=str(PORTS["rabbitmq-dist"]),
        ERL_EPMD_PORT=str(PORTS["epmd"]),
        ERL_EPMD_ADDRESS="127.0.0.1",
        # Erlang's schedulers busy-wait for work by default: on two shared cores that is CPU
        # taken from everything else, at start and while idle.
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none",
    )


def start_rabbitmq(run: Path) -> None:
    """RabbitMQ as root without systemd: /usr/lib/rabbitmq/bin/rabbitmq-server (the one in
    /usr/sbin switches to the rabbitmq user). Its node's database comes with the seed: a node
    that finds one starts faster than one that creates it."""
    directory = run / "rabbitmq"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "rabbitmq.conf").write_text(
        f"listeners.tcp.1 = 127.0.0.1:{PORTS['rabbitmq']}\n"
        "loopback_users = none\nlog.file.level = warning\n"
    )
    (directory / "enabled_plugins").write_text("[].\n")
    for port in ("rabbitmq", "rabbitmq-dist"):
        if not port_free(PORTS[port]):
            raise SystemExit(f"port {PORTS[port]} for RabbitMQ is taken by another program")
    spawn(run, "rabbitmq", ["/usr/lib/rabbitmq/bin/rabbitmq-server"], env=rabbit_env(run))


def stop_rabbitmq(run: Path) -> None:
    pidfile = run / "rabbitmq.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        if alive(pid):
            subprocess.run(
                ["rabbitmqctl", "stop"], env=rabbit_env(run), capture_output=True, timeout=60
            )
            terminate({"rabbitmq": pid}, run)
        pidfile.unlink(missing_ok=True)
    # Its epmd daemonizes (parent: init) and outlives rabbitmqctl stop: the one with our port.
    for pid in processes_with_env(f"ERL_EPMD_PORT={PORTS['epmd']}"):
        if Path(f"/proc/{pid}/comm").read_text().strip() == "epmd":
            os.kill(pid, signal.SIGTERM)


def processes_with_env(entry: str) -> list[int]:
    found = []
    needle = entry.encode() + b"\0"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


# --- start and stop -----------------------------------------------------------------------


def start_all(state: Path) -> None:
    """Starts every service on ``run`` and waits until the compute host is ready."""
    run = state / "run"
    t0 = time.monotonic()
    remove_domains(run)
    begun = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    start_rabbitmq(run)
    start_postgres(run)
    for name in HTTP:
        serve(run, name)
    # Not waiting for RabbitMQ: Nova's services load for seconds, then connect (retrying).
    for name in NOVA:
        start_nova_service(run, name)
    wait_for("RabbitMQ", lambda: not port_free(PORTS["rabbitmq"]), run, watch=("rabbitmq",))
    say(f"RabbitMQ answers after {time.monotonic() - t0:.1f} s")
    for name in HTTP:
        wait_for(name, lambda name=name: http_answers(PORTS[name]), run, watch=(name,))
    say(f"HTTP services answer after {time.monotonic() - t0:.1f} s")
    info = json.loads((run / "cloud.json").read_text())
    wait_compute_ready(run, info, begun)
    say(f"compute ready after {time.monotonic() - t0:.1f} s")


def wait_compute_ready(run: Path, info: dict[str, Any], begun: datetime.datetime) -> None:
    """Ready: nova-compute ``up`` with a heartbeat after ``begun`` (after a restart the last
    run's heartbeat still counts as up), the host mapped to the cell (the scheduler's
    discovery) and its resource provider holding an inventory in Placement."""
    watch = ("nova-compute", "nova-conductor", "nova-scheduler")
    provider = wait_service_ready(run, "nova-compute", COMPUTE_HOST, begun, watch)
    assert provider is not None
    info["hypervisor_hostname"] = provider["name"]
    info["resource_provider"] = provider["uuid"]
    (run / "cloud.json").write_text(json.dumps(info, indent=2))


def stop(run: Path) -> None:
    """Deletes the servers left, then stops every process it started, by pid."""
    if (run / "nova-api.pid").exists():
        delete_servers(run)
    remove_domains(run)
    pids = {}
    for name in (*fake_computes(run), *NOVA, *HTTP):
        pidfile = run / f"{name}.pid"
        if pidfile.exists():
            pids[name] = int(pidfile.read_text())
    terminate(pids, run)
    for name in pids:
        (run / f"{name}.pid").unlink(missing_ok=True)
    stop_privsep(run)
    stop_rabbitmq(run)
    stop_postgres(run)


def terminate(pids: dict[str, int], run: Path) -> None:
    """SIGTERM to each process group at once, SIGKILL to those still there after a while."""
    for pid in pids.values():
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(group_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for name, pid in pids.items():
        if group_alive(pid):
            print(f"gmd test nova: {name} ignored SIGTERM; killed", file=sys.stderr)
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    return alive(pgid) or any(
        alive(int(proc.name))
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit() and _pgid(proc) == pgid
    )


def _pgid(proc: Path) -> int | None:
    try:
        return int(proc.joinpath("stat").read_text().split(") ")[-1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def stop_privsep(run: Path) -> None:
    """nova-compute's privsep helper runs detached (parent: init) and normally ends with it; one
    left behind (nova-compute killed) is found by our nova.conf on its command line."""
    conf = str(run / "nova" / "nova.conf").encode()
    deadline = time.monotonic() + 10
    while True:
        left = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = proc.joinpath("cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if conf in argv and any(b"privsep-helper" in arg for arg in argv[:3]):
                left.append(int(proc.name))
        if not left:
            return
        if time.monotonic() > deadline:
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.2)


# --- fake compute hosts and the scheduler's configuration (tests/cloud/test_falb_placement.py)

FAKE = "nova-compute-"
"""A fake compute service's process name (its pid file, log and configuration directory):
FAKE + its host name."""


def fake_computes(run: Path) -> list[str]:
    return sorted(p.name.removesuffix(".pid") for p in run.glob(f"{FAKE}*.pid"))


def start_fake_compute(run: Path, host: str, driver: str) -> None:
    """Starts a nova-compute with a fake driver (no guests: its servers are ACTIVE at once)
    as compute host ``host``, and waits until it is up, mapped and has its inventory."""
    if not re.fullmatch(r"[a-z0-9-]{1,40}", host or "") or not driver:
        raise SystemExit("fake-compute needs --host (a-z, 0-9, -) and --driver")
    name = FAKE + host
    directory = run / name
    sections = nova_sections(run, KEYSTONE_URL, directory)
    sections["DEFAULT"].update(host=host, compute_driver=driver, state_path=directory / "state")
    (directory / "state").mkdir(parents=True, exist_ok=True)
    conf = ini(directory / "nova.conf", sections)
    begun = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    spawn(run, name, [str(venv_bin(run) / "nova-compute"), "--config-file", str(conf)])
    wait_service_ready(run, "nova-compute", host, begun, (name,), provider_name=host)
    say(f"fake compute {host} ({driver}) ready")


def wait_service_ready(
    run: Path,
    binary: str,
    host: str,
    begun: datetime.datetime,
    watch: tuple[str, ...],
    provider_name: str | None = None,
) -> dict[str, Any] | None:
    """``binary`` on ``host`` is up with a heartbeat after ``begun``; a compute host is also
    mapped to the cell and has a resource provider with an inventory (the one named
    ``provider_name``, else the first found), which is returned."""
    import psycopg2

    conn = connect(run, "admin")
    try:

        def heartbeat() -> bool:
            services = conn.compute.get(f"/os-services?binary={binary}").json()["services"]
            return any(
                s["host"] == host
                and s["state"] == "up"
                and s.get("updated_at")
                and datetime.datetime.fromisoformat(s["updated_at"].rstrip("Z")) > begun
                for s in services
            )

        def mapped() -> bool:
            with (
                psycopg2.connect(
                    host="127.0.0.1", port=PORTS["postgres"], user="postgres", dbname="nova_api"
                ) as db,
                db.cursor() as cursor,
            ):
                cursor.execute("SELECT 1 FROM host_mappings WHERE host = %s", (host,))
                return cursor.fetchone() is not None

        found: list[dict[str, Any]] = []

        def inventory() -> bool:
            query = "" if provider_name is None else f"?name={provider_name}"
            listed = conn.placement.get(f"/resource_providers{query}").json()
            for provider in listed["resource_providers"]:
                inv = conn.placement.get(f"/resource_providers/{provider['uuid']}/inventories")
                if inv.json()["inventories"].get("VCPU"):
                    found.append(provider)
                    return True
            return False

        t0 = time.monotonic()
        wait_for(f"{binary} on {host}: a heartbeat", heartbeat, run, watch=watch)
        say(f"{binary} on {host}: a heartbeat after {time.monotonic() - t0:.1f} s")
        if binary != "nova-compute":
            return None
        wait_for(f"{host}'s cell mapping", mapped, run, watch=watch)
        wait_for(f"{host}'s inventory in Placement", inventory, run, watch=watch)
        return found[0]
    finally:
        conn.close()


def remove_fake_computes(run: Path) -> None:
    """Deletes the fake hosts' servers, stops them, and deletes their compute services (with
    their resource providers), so that the cloud has its one compute host again."""
    names = fake_computes(run)
    hosts = [n.removeprefix(FAKE) for n in names]
    conn = connect(run, "admin")
    try:
        for host in hosts:
            for server in conn.compute.servers(all_projects=True, host=host):
                conn.compute.delete_server(server, ignore_missing=True)
        deadline = time.monotonic() + 60
        while any(list(conn.compute.servers(all_projects=True, host=h)) for h in hosts):
            if time.monotonic() > deadline:
                raise SystemExit(f"servers still on {hosts} after 60 s")
            time.sleep(0.5)
        terminate({n: int((run / f"{n}.pid").read_text()) for n in names}, run)
        for n in names:
            (run / f"{n}.pid").unlink(missing_ok=True)
        # from 2.53 a service's id is its uuid, which its DELETE wants
        services = conn.compute.get("/os-services?binary=nova-compute", microversion="2.53").json()[
            "services"
        ]
        for service in services:
            if service["host"] in hosts:
                done = conn.compute.delete(f"/os-services/{service['id']}", microversion="2.53")
                if done.status_code not in (204, 404):
                    raise SystemExit(
                        f"could not delete {service['host']}'s service: {done.status_code}"
                        f" {done.text}"
                    )
    finally:
        conn.close()
    say(f"fake computes removed: {', '.join(hosts) or 'none'}")


def restart_scheduler(run: Path, extra: list[Path], pythonpath: str | None) -> None:
    """Restarts nova-scheduler reading ``extra`` configuration files after nova.conf (none:
    the seeded configuration), and waits until it reports up again."""
    name = "nova-scheduler"
    pidfile = run / f"{name}.pid"
    if pidfile.exists():
        terminate({name: int(pidfile.read_text())}, run)
    command = [str(venv_bin(run) / name), "--config-file", str(run / "nova" / "nova.conf")]
    for path in extra:
        command += ["--config-file", str(path.resolve())]
    env = environment(run)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    begun = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    spawn(run, name, command, env)
    wait_service_ready(run, name, COMPUTE_HOST, begun, (name,))
    say(f"nova-scheduler restarted with {[str(p) for p in extra] or 'its seeded configuration'}")


def delete_servers(run: Path) -> None:
    """Deletes every server through the Nova API, as a tenant would, and waits them gone."""
    try:
        conn = connect(run, "admin")
        servers = list(conn.compute.servers(all_projects=True))
    except Exception as e:
        print(f"gmd test nova: could not list servers ({e}); removing domains", file=sys.stderr)
        return
    try:
        for server in servers:
            conn.compute.delete_server(server, ignore_missing=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not list(conn.compute.servers(all_projects=True)):
                return
            time.sleep(0.5)
        print("gmd test nova: servers still there after 60 s; removing domains", file=sys.stderr)
    except Exception as e:
        print(f"gmd test nova: deleting servers failed ({e}); removing domains", file=sys.stderr)
    finally:
        conn.close()


def remove_domains(run: Path) -> list[str]:
    """Destroys and undefines every domain of the prefix: Nova's ids restart at 1 with each copy
    of the seed, so a domain left by a killed run would collide with the first new server."""
    import libvirt

    removed: list[str] = []
    pattern = re.compile(re.escape(PREFIX) + "[0-9a-f]{8}")
    try:
        conn = libvirt.open("qemu:///system")
    except libvirt.libvirtError as e:
        say(f"libvirtd does not answer ({e}): no domain of {PREFIX}* to remove")
        return removed
    try:
        for dom in conn.listAllDomains():
            if not pattern.fullmatch(dom.name()):
                continue
            try:
                if dom.isActive():
                    dom.destroy()
                dom.undefineFlags(
                    libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
                )
            except libvirt.libvirtError as e:
                if "not found" not in str(e).lower():
                    raise
            removed.append(dom.name())
    finally:
        conn.close()
    return removed


# --- the seed -----------------------------------------------------------------------------


def build_seed(state: Path) -> None:
    """Configures and seeds every service under ``run``, then keeps it as ``seed``."""
    run = state / "run"
    seed = state / "seed"
    stop(run)
    shutil.rmtree(run, ignore_errors=True)
    shutil.rmtree(seed, ignore_errors=True)
    run.mkdir(parents=True)
    bin_ = venv_bin(run)
    keystone_url = KEYSTONE_URL
    say("building the seed (about a minute, once)")
    remove_domains(run)
    start_rabbitmq(run)
    init_postgres(run)
    start_postgres(run)
    for name in DATABASES:
        sh(
            as_postgres(
                [
                    str(pg_bin() / "createdb"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(PORTS["postgres"]),
                    "-U",
                    "postgres",
                    name,
                ]
            )
        )
    write_configs(run, keystone_url)
    env = environment(run)

    say("seeding Keystone")
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    manage = [str(bin_ / "keystone-manage"), "--config-file", str(run / "keystone/keystone.conf")]
    sh([*manage, "db_sync"], env)
    for what in ("fernet_setup", "credential_setup"):
        sh([*manage, what, "--keystone-user", user, "--keystone-group", group], env)
    sh(
        [
            *manage,
            "bootstrap",
            "--bootstrap-password",
            PASSWORD,
            "--bootstrap-admin-url",
            keystone_url,
            "--bootstrap-internal-url",
            keystone_url,
            "--bootstrap-public-url",
            keystone_url,
            "--bootstrap-region-id",
            "RegionOne",
        ],
        env,
    )
    serve(run, "keystone")  # loads while the other databases sync

    say("syncing Placement, Glance and Nova's databases")
    placement_conf = str(run / "placement" / "placement.conf")
    sh([str(bin_ / "placement-manage"), "--config-file", placement_conf, "db", "sync"], env)
    glance_conf = str(run / "glance" / "glance-api.conf")
    sh([str(bin_ / "glance-manage"), "--config-file", glance_conf, "db_sync"], env)
    nova = [str(bin_ / "nova-manage"), "--config-file", str(run / "nova/nova.conf")]
    sh([*nova, "api_db", "sync"], env)
    sh([*nova, "cell_v2", "map_cell0", "--database_connection", db_url("nova_cell0")], env)
    sh([*nova, "db", "sync"], env)
    transport = f"rabbit://guest:guest@127.0.0.1:{PORTS['rabbitmq']}/"
    sh(
        [
            *nova,
            "cell_v2",
            "create_cell",
            "--name",
            "cell1",
            "--database_connection",
            db_url("nova_cell1"),
            "--transport-url",
            transport,
        ],
        env,
    )

    wait_for("keystone", lambda: http_answers(PORTS["keystone"]), run, watch=("keystone",))
    info = seed_keystone(keystone_url)
    write_unified_nova(run, keystone_url, info["unified"]["limits_endpoint_id"])
    info["run"] = str(run)
    info["recipe"] = recipe()
    (run / "cloud.json").write_text(json.dumps(info, indent=2))
    write_clouds_yaml(run, keystone_url, info)

    say("starting the services and registering the compute host")
    begun = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    for name in HTTP[1:]:
        serve(run, name)
    wait_for("RabbitMQ", lambda: not port_free(PORTS["rabbitmq"]), run, watch=("rabbitmq",))
    for name in NOVA:
        start_nova_service(run, name)
    for name in HTTP:
        wait_for(name, lambda name=name: http_answers(PORTS[name]), run, watch=(name,))
    wait_compute_ready(run, info, begun)
    info = json.loads((run / "cloud.json").read_text())
    seed_images_and_flavor(run, info)
    (run / "cloud.json").write_text(json.dumps(info, indent=2))
    stop(run)
    for log in run.glob("*.log"):
        log.unlink()
    shutil.rmtree(run / "rabbitmq" / "log", ignore_errors=True)
    sh(["cp", "-a", str(run), str(seed)])


def connect(run: Path, cloud: str) -> Any:
    """An openstacksdk connection for an entry of this cloud's clouds.yaml (not the user's)."""
    import openstack.config
    import openstack.connection

    config = openstack.config.OpenStackConfig(
        config_files=[str(run / "clouds.yaml")], load_envvars=False
    )
    return openstack.connection.Connection(config=config.get_one(cloud=cloud), api_timeout=60)


def seed_keystone(keystone_url: str) -> dict[str, Any]:
    """Service users, the catalog (with the Neutron stub), the operator and the customers."""
    import openstack

    conn = openstack.connect(
        auth_url=keystone_url,
        username="admin",
        password=PASSWORD,
        user_domain_name="Default",
        system_scope="all",
        load_yaml_config=False,
        load_envvars=False,
    )
    ident = conn.identity
    service_project = ident.create_project(name="service", domain_id="default")
    roles = {role.name: role for role in ident.roles()}
    for name in ("nova", "placement", "glance"):
        user = ident.create_user(name=name, password=PASSWORD, domain_id="default")
        ident.assign_project_role_to_user(service_project, user, roles["admin"])
        if name == "nova":
            ident.assign_system_role_to_user(user, roles["reader"], "all")
    catalog = {
        "compute": ("nova", f"http://127.0.0.1:{PORTS['nova-api']}/v2.1"),
        "placement": ("placement", f"http://127.0.0.1:{PORTS['placement']}"),
        "image": ("glance", f"http://127.0.0.1:{PORTS['glance']}"),
        # Nova's server show/list/delete ask Neutron for ports: the stub answers "none".
        "network": ("neutron", f"http://127.0.0.1:{PORTS['neutron-stub']}"),
    }
    services = {}
    for kind, (name, url) in catalog.items():
        service = ident.create_service(name=name, type=kind)
        services[kind] = service.id
        for interface in ("public", "internal"):
            ident.create_endpoint(
                service_id=service.id, interface=interface, url=url, region_id="RegionOne"
            )
    # RegionTwo has its compute endpoint (the unified-limits Nova API) and Keystone's, as each
    # region of a real cloud has (a client of RegionTwo finds Keystone's API in its own
    # region); its Nova finds Placement, Glance and Neutron in RegionOne (its [placement] …
    # region_name). Its limits are registered for that service and region.
    ident.create_region(id=UNIFIED_REGION, description="Nova with unified limits")
    identity = next(iter(ident.services(type="identity")))
    for interface in ("public", "internal"):
        ident.create_endpoint(
            service_id=identity.id, interface=interface, url=keystone_url, region_id=UNIFIED_REGION
        )
    unified_url = f"http://127.0.0.1:{PORTS['nova-api-unified']}/v2.1"
    limits_endpoint = ""
    for interface in ("public", "internal"):
        endpoint = ident.create_endpoint(
            service_id=services["compute"],
            interface=interface,
            url=unified_url,
            region_id=UNIFIED_REGION,
        )
        if interface == "public":
            limits_endpoint = endpoint.id
    for resource, limit in REGISTERED.items():
        ident.create_registered_limit(
            service_id=services["compute"],
            region_id=UNIFIED_REGION,
            resource_name=resource,
            default_limit=limit,
        )
    admin_project = ident.find_project("admin", domain_id="default")
    operator = ident.create_user(name="gmd", password=PASSWORD, domain_id="default")
    # Project-scoped admin for Nova's and Glance's APIs, system-scoped for Keystone's.
    ident.assign_project_role_to_user(admin_project, operator, roles["admin"])
    ident.assign_system_role_to_user(operator, roles["admin"], "all")
    projects, users = {}, {}
    for name in CUSTOMERS:
        project = ident.create_project(name=name, domain_id="default", description="a customer")
        member = ident.create_user(name=f"{name}-member", password=PASSWORD, domain_id="default")
        ident.assign_project_role_to_user(project, member, roles["member"])
        projects[name] = project.id
        users[f"{name}-member"] = member.id
    conn.close()
    return {
        "ports": PORTS,
        "keystone_url": keystone_url,
        "nova_url": catalog["compute"][1],
        "placement_url": catalog["placement"][1],
        "glance_url": catalog["image"][1],
        "region": "RegionOne",
        "projects": projects,
        "admin_project": admin_project.id,
        "users": users,
        "services": services,
        "domain_prefix": PREFIX,
        "compute_host": COMPUTE_HOST,
        "libvirt_uri": "qemu:///system",
        "member_clouds": {name: name for name in CUSTOMERS},
        "unified": {
            "region": UNIFIED_REGION,
            "nova_url": unified_url,
            "limits_endpoint_id": limits_endpoint,
            "registered_limits": REGISTERED,
            # gmd's entries for that region: the project-scoped admin that reads Nova's quota
            # sets, the system-scoped one that writes Keystone's limits; and each member's.
            "cloud": "unified",
            "limits_cloud": "unified-system",
            "member_clouds": {name: f"{name}-unified" for name in CUSTOMERS},
        },
    }


def write_clouds_yaml(run: Path, keystone_url: str, info: dict[str, Any]) -> None:
    def auth(user: str, **scope: str) -> dict[str, str]:
        return {
            "auth_url": keystone_url,
            "username": user,
            "password": PASSWORD,
            "user_domain_name": "Default",
            **scope,
        }

    project = {"project_name": "admin", "project_domain_name": "Default"}
    clouds: dict[str, dict[str, Any]] = {
        "admin": {"auth": auth("gmd", **project)},
        "admin-system": {"auth": auth("gmd", system_scope="all")},
        "keystone-admin": {"auth": auth("admin", system_scope="all")},
    }
    for name in CUSTOMERS:
        clouds[name] = {
            "auth": auth(f"{name}-member", project_name=name, project_domain_name="Default")
        }
    for cloud in clouds.values():
        cloud["region_name"] = "RegionOne"
    unified = info["unified"]
    clouds[unified["cloud"]] = {"auth": auth("gmd", **project)}
    clouds[unified["limits_cloud"]] = {"auth": auth("gmd", system_scope="all")}
    for name, entry in unified["member_clouds"].items():
        clouds[entry] = {"auth": clouds[name]["auth"]}
    for cloud in clouds.values():
        cloud["identity_api_version"] = 3
        cloud.setdefault("region_name", UNIFIED_REGION)
    (run / "clouds.yaml").write_text(json.dumps({"clouds": clouds}, indent=2))
    info["clouds_yaml"] = str(run / "clouds.yaml")
    info["clouds"] = sorted(clouds)


def guest_image() -> tuple[Path, Path]:
    """The tiny guest's kernel and initramfs (built once, cached under var/guest)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.guest_image"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"tests/support/guest_image.py failed:\n{done.stderr[-3000:]}")
    paths = dict(line.split(None, 1) for line in done.stdout.splitlines() if line.strip())
    return Path(paths["kernel"].strip()), Path(paths["initrd"].strip())


def seed_images_and_flavor(run: Path, info: dict[str, Any]) -> None:
    """AMI-style images of the tiny guest (kernel, ramdisk, and per role a machine image whose
    ``os_command_line`` picks the role), public, and the flavor the tests boot."""
    kernel, initrd = guest_image()
    blank = run / "blank.img"
    with blank.open("wb") as f:
        f.truncate(8 * 2**20)
    conn = connect(run, "admin")
    try:
        images: dict[str, str] = {}

        def upload(name: str, kind: str, path: Path, **properties: str) -> str:
            body = {
                "name": name,
                "disk_format": kind,
                "container_format": kind,
                "visibility": "public",
                **properties,
            }
            image = conn.image.post("/images", json=body).json()
            with path.open("rb") as data:
                conn.image.put(
                    f"/images/{image['id']}/file",
                    data=data,
                    headers={"Content-Type": "application/octet-stream"},
                )
            return str(image["id"])

        images["kernel"] = upload("gmdnova-kernel", "aki", kernel)
        images["ramdisk"] = upload("gmdnova-ramdisk", "ari", initrd)
        for role in ROLES:
            images[role] = upload(
                f"gmdnova-{role}",
                "ami",
                blank,
                kernel_id=images["kernel"],
                ramdisk_id=images["ramdisk"],
                os_command_line=CMDLINE.format(role=role),
            )
        flavor = conn.compute.create_flavor(**FLAVOR)
        info["images"] = images
        info["flavor"] = {"id": flavor.id, **FLAVOR}
        blank.unlink()
    finally:
        conn.close()


# --- configuration ------------------------------------------------------------------------


def write_configs(run: Path, keystone_url: str) -> None:
    venv_etc = run.parent / "venv" / "etc"
    (run / "bin").mkdir()
    sudo = run / "bin" / "sudo"
    sudo.write_text(
        '#!/bin/sh\n# We are root already: privsep\'s "sudo privsep-helper …".\nexec "$@"\n'
    )
    sudo.chmod(0o755)
    ini(
        run / "keystone" / "keystone.conf",
        {
            "DEFAULT": {"use_stderr": "true"},
            "database": {"connection": db_url("keystone")},
            "token": {"provider": "fernet"},
            "fernet_tokens": {"key_repository": run / "keystone" / "fernet-keys"},
            "fernet_receipts": {"key_repository": run / "keystone" / "fernet-keys"},
            "credential": {"key_repository": run / "keystone" / "credential-keys"},
            # Without a cache each token validation costs ~0.7 CPU-s here.
            "cache": {"enabled": "true", "backend": "dogpile.cache.memory"},
            "identity": {"password_hash_rounds": 4},
            "oslo_policy": POLICY,
        },
    )
    ini(
        run / "placement" / "placement.conf",
        {
            "DEFAULT": {"use_stderr": "true"},
            "placement_database": {"connection": db_url("placement")},
            "api": {"auth_strategy": "keystone"},
            "keystone_authtoken": authtoken(keystone_url, "placement"),
            "oslo_policy": POLICY,
        },
    )
    glance = run / "glance"
    ini(
        glance / "glance-api.conf",
        {
            "DEFAULT": {"use_stderr": "true", "enabled_backends": "fs:file"},
            "database": {"connection": db_url("glance")},
            "glance_store": {"default_backend": "fs"},
            "fs": {"filesystem_store_datadir": glance / "images"},
            "os_glance_staging_store": {"filesystem_store_datadir": glance / "staging"},
            "os_glance_tasks_store": {"filesystem_store_datadir": glance / "tasks"},
            "keystone_authtoken": authtoken(keystone_url, "glance"),
            "paste_deploy": {"flavor": "keystone"},
            "oslo_policy": POLICY,
        },
    )
    shutil.copy(venv_etc / "glance" / "glance-api-paste.ini", glance / "glance-api-paste.ini")
    for sub in ("images", "staging", "tasks"):
        (glance / sub).mkdir()
    nova = run / "nova"
    ini(nova / "nova.conf", nova_sections(run, keystone_url, nova))
    shutil.copy(venv_etc / "nova" / "api-paste.ini", nova / "api-paste.ini")
    (nova / "state").mkdir()
    (run / "instances").mkdir()


def write_unified_nova(run: Path, keystone_url: str, limits_endpoint: str) -> None:
    """The unified-limits Nova API's configuration: the cloud's nova.conf with
    ``UnifiedLimitsDriver`` and the ``[oslo_limit]`` section that names its own compute endpoint
    (whose service and region Keystone's limits are read for). Nova's user reads them with its
    system-scoped reader role."""
    directory = run / NOVA_CONFIG["nova-api-unified"]
    sections = nova_sections(run, keystone_url, directory)
    sections["quota"] = {"driver": "nova.quota.UnifiedLimitsDriver"}
    sections["oslo_limit"] = {
        "auth_url": keystone_url,
        "auth_type": "password",
        "username": "nova",
        "password": PASSWORD,
        "user_domain_name": "Default",
        "system_scope": "all",
        "endpoint_id": limits_endpoint,
    }
    ini(directory / "nova.conf", sections)
    shutil.copy(run / "nova" / "api-paste.ini", directory / "api-paste.ini")


def nova_sections(run: Path, keystone_url: str, nova: Path) -> dict[str, dict[str, Any]]:
    """nova.conf of every Nova service (its lock directory under ``nova``)."""
    return {
        "DEFAULT": {
            "transport_url": f"rabbit://guest:guest@127.0.0.1:{PORTS['rabbitmq']}/",
            "host": COMPUTE_HOST,
            "my_ip": "127.0.0.1",
            "state_path": run / "nova" / "state",  # holds compute_id: the node's identity
            "instances_path": run / "instances",
            "instance_name_template": PREFIX + "%08x",
            "compute_driver": "libvirt.LibvirtDriver",
            # SIGTERM stops nova-compute in ~5 s instead of ~16 s.
            "graceful_shutdown_timeout": 5,
            "use_stderr": "true",
        },
        "api": {"auth_strategy": "keystone"},
        "api_database": {"connection": db_url("nova_api")},
        "database": {"connection": db_url("nova_cell1")},
        "keystone_authtoken": authtoken(keystone_url, "nova"),
        "keystone": {"region_name": "RegionOne"},
        "placement": {**authtoken_service(keystone_url, "nova"), "region_name": "RegionOne"},
        "glance": {"region_name": "RegionOne"},
        "neutron": {**authtoken_service(keystone_url, "nova"), "region_name": "RegionOne"},
        "libvirt": {"virt_type": "qemu", "connection_uri": "qemu:///system"},
        "vnc": {"enabled": "false"},
        # privsep runs "sudo privsep-helper" (the shim in run/bin), not nova-rootwrap.
        "workarounds": {"disable_rootwrap": "true"},
        "oslo_policy": POLICY,
        # Retry RabbitMQ every second (not 1, 3, 5 … s): the services start before it answers.
        "oslo_messaging_rabbit": {"rabbit_retry_backoff": 0},
        "oslo_concurrency": {"lock_path": nova / "locks"},
        "quota": {"driver": "nova.quota.DbQuotaDriver"},
        # The default forks one worker per CPU: ~160 MiB more for nothing here.
        "conductor": {"workers": 1},
        "scheduler": {"workers": 1, "discover_hosts_in_cells_interval": 5},
    }


def ini(path: Path, sections: dict[str, dict[str, Any]]) -> Path:
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {value}" for key, value in values.items())
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


POLICY = {"enforce_new_defaults": "true", "enforce_scope": "true"}


def authtoken_service(keystone_url: str, user: str) -> dict[str, str]:
    return {
        "auth_url": keystone_url,
        "auth_type": "password",
        "username": user,
        "password": PASSWORD,
        "user_domain_name": "Default",
        "project_name": "service",
        "project_domain_name": "Default",
    }


def authtoken(keystone_url: str, user: str) -> dict[str, str]:
    return {"www_authenticate_uri": keystone_url, **authtoken_service(keystone_url, user)}


# --- the Neutron stub ---------------------------------------------------------------------


def serve_neutron_stub(port: int) -> None:
    """Neutron's API as far as Nova asks for a server without ports: every list is empty."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            if path == "":
                self.answer(
                    200,
                    {
                        "versions": [
                            {
                                "id": "v2.0",
                                "status": "CURRENT",
                                "links": [
                                    {"href": f"http://127.0.0.1:{port}/v2.0/", "rel": "self"}
                                ],
                            }
                        ]
                    },
                )
            elif path.startswith("/v2.0/") and path.count("/") == 2:
                collection = path.split("/")[2].removesuffix(".json")
                self.answer(200, {collection.replace("-", "_"): []})
            else:
                self.answer(404, {"NeutronError": {"message": f"no {path} in this stub"}})

        def answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            print(f"neutron-stub: {format % args}", file=sys.stderr, flush=True)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


def sh(command: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(command[:5])} … failed ({done.returncode}):\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )


def say(text: str) -> None:
    print(f"gmd test nova: {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
