"""Real Keystone, Placement and two Nova APIs on 127.0.0.1 for gmd's tests (run by openstack.sh).

Runs under the OpenStack venv's Python (var/openstack/venv), not gmd's: it imports only the
standard library and that venv's openstacksdk. Two Nova APIs share one Keystone and one
Placement, told apart by region: ``RegionOne`` is Nova with the legacy database quota driver,
``RegionTwo`` Nova with ``UnifiedLimitsDriver`` (limits in Keystone, usage in Placement). A
client picks one by its clouds.yaml entry's ``region_name``, as with any multi-region cloud.

The first start builds a seeded state (databases, Fernet keys, users, projects, catalog,
registered limits) under ``STATE/seed`` and takes about a minute; every start after copies it to
``STATE/run`` and starts the four servers, so each test session begins from the same cloud.
Everything listens on 127.0.0.1 only; SQLite, an in-memory cache for Keystone, ``fake://``
messaging, and today's default policies (``enforce_new_defaults``, ``enforce_scope``).

``start`` prints the path of ``run/cloud.json``: ports, the clouds.yaml, the projects' ids and
the Nova cell databases (where a test puts instances whose usage Nova counts, since this cloud
has no compute service to boot them). ``stop`` stops the servers.
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

PORTS = {"keystone": 25357, "placement": 25378, "nova-legacy": 25774, "nova-unified": 25775}
REGIONS = {"nova-legacy": "RegionOne", "nova-unified": "RegionTwo"}
PASSWORD = "gmd-test-secret"
"""Every account's password: a throwaway cloud on loopback."""
CUSTOMERS = ("acme", "initech")
# Nova's own defaults (20 cores, 50 GiB, 10 servers) as the registered limits, so that both
# configurations start a project from the same quota.
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
READY_TIMEOUT_S = 90.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("action", choices=("start", "stop"), nargs="?", default="start")
    args = parser.parse_args()
    state: Path = args.state.resolve()
    if args.action == "stop":
        stop(state / "run")
        return 0
    started = time.monotonic()
    seed = state / "seed"
    if not (seed / "cloud.json").exists():
        shutil.rmtree(seed, ignore_errors=True)
        build_seed(state)
        cold = True
    else:
        cold = False
    run = state / "run"
    stop(run)
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(seed, run, symlinks=True)
    for name in PORTS:
        serve(state, name)
    wait_ready(run)
    info = json.loads((run / "cloud.json").read_text())
    info["started_s"] = round(time.monotonic() - started, 1)
    info["cold"] = cold
    (run / "cloud.json").write_text(json.dumps(info, indent=2))
    print(run / "cloud.json")
    return 0


# --- serving ------------------------------------------------------------------------------

# oslo.config parses sys.argv: under gunicorn it would see gunicorn's options and refuse them.
WSGI = {
    "keystone": "from keystone.server.wsgi import initialize_public_application as init\n"
    "application = init()\n",
    "placement": "from placement.wsgi.api import application\n",
    "nova-legacy": "from nova.wsgi.osapi_compute import application\n",
    "nova-unified": "from nova.wsgi.osapi_compute import application\n",
}


def environment(run: Path, name: str) -> dict[str, str]:
    env = dict(os.environ, HOME=str(run))
    env.pop("OS_CLIENT_CONFIG_FILE", None)
    if name == "keystone":
        env["OS_KEYSTONE_CONFIG_FILES"] = str(run / "keystone" / "keystone.conf")
    elif name == "placement":
        env["OS_PLACEMENT_CONFIG_DIR"] = str(run / "placement")
    else:
        env["OS_NOVA_CONFIG_DIR"] = str(run / name)
    return env


def serve(state: Path, name: str) -> None:
    run = state / "run"
    module = run / f"wsgi_{name.replace('-', '_')}.py"
    module.write_text("import sys\n\nsys.argv = sys.argv[:1]\n" + WSGI[name])
    port = PORTS[name]
    if not port_free(port):
        raise SystemExit(f"port {port} for {name} is taken by another program")
    log = open(run / f"{name}.log", "ab")  # noqa: SIM115 - the server holds it
    process = subprocess.Popen(
        [
            str(state / "venv" / "bin" / "gunicorn"),
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
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=environment(run, name),
        start_new_session=True,
    )
    (run / f"{name}.pid").write_text(str(process.pid))


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def wait_ready(run: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    for name, port in PORTS.items():
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).close()
                break
            except urllib.error.HTTPError:
                break  # any HTTP answer: the application is loaded
            except OSError:
                pid = int((run / f"{name}.pid").read_text())
                if not alive(pid) or time.monotonic() > deadline:
                    tail = (run / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise SystemExit(f"{name} did not start on port {port}:\n{tail}") from None
                time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie still has a pid; its state in /proc says it is gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


def stop(run: Path) -> None:
    for name, port in PORTS.items():
        pidfile = run / f"{name}.pid"
        if not pidfile.exists():
            continue
        pid = int(pidfile.read_text())
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pidfile.unlink(missing_ok=True)
            continue
        deadline = time.monotonic() + 15
        while (alive(pid) or not port_free(port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)
        # missing_ok: two stops at once (make test's, and one by hand) both get here.
        pidfile.unlink(missing_ok=True)


# --- the seed -----------------------------------------------------------------------------


def build_seed(state: Path) -> None:
    """Configure and seed every service under ``run``, then keep it as ``seed``."""
    run = state / "run"
    stop(run)
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    bin_ = state / "venv" / "bin"
    keystone_url = f"http://127.0.0.1:{PORTS['keystone']}/v3"
    say("seeding Keystone")
    conf = write_keystone(run)
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    manage = [str(bin_ / "keystone-manage"), "--config-file", str(conf)]
    sh([*manage, "db_sync"])
    for what in ("fernet_setup", "credential_setup"):
        sh([*manage, what, "--keystone-user", user, "--keystone-group", group])
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
        ]
    )
    serve(state, "keystone")
    wait_one(run, "keystone")
    info = seed_keystone(keystone_url)
    stop(run)

    say("seeding Placement and Nova")
    write_placement(run, keystone_url)
    sh(
        [
            str(bin_ / "placement-manage"),
            "--config-file",
            str(run / "placement/placement.conf"),
            "db",
            "sync",
        ]
    )
    api_paste = state / "venv" / "etc" / "nova" / "api-paste.ini"
    for name in ("nova-legacy", "nova-unified"):
        directory = run / name
        directory.mkdir()
        shutil.copy(api_paste, directory / "api-paste.ini")
        conf = write_nova(run, name, keystone_url, info["limits_endpoint_id"])
        nova = [str(bin_ / "nova-manage"), "--config-file", str(conf)]
        cell0 = f"sqlite:///{directory / 'nova_cell0.sqlite'}"
        cell1 = f"sqlite:///{directory / 'nova_cell1.sqlite'}"
        sh([*nova, "api_db", "sync"])
        sh([*nova, "cell_v2", "map_cell0", "--database_connection", cell0])
        sh([*nova, "db", "sync"])
        sh([*nova, "cell_v2", "create_cell", "--name", "cell1", "--database_connection", cell1])
        info["nova"][name] = {
            "region": REGIONS[name],
            "url": f"http://127.0.0.1:{PORTS[name]}/v2.1",
            "cell_db": str(directory / "nova_cell1.sqlite"),
        }
    (run / "cloud.json").write_text(json.dumps(info, indent=2))
    write_clouds_yaml(run, keystone_url)
    for name in PORTS:
        serve(state, name)
    wait_ready(run)
    stop(run)
    for log in run.glob("*.log"):
        log.unlink()
    shutil.copytree(run, state / "seed", symlinks=True)


def wait_one(run: Path, name: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while port_free(PORTS[name]):
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} did not start; see {run / (name + '.log')}")
        time.sleep(0.2)


def seed_keystone(keystone_url: str) -> dict[str, Any]:
    """Regions, services, endpoints, users, projects, roles and registered limits."""
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
    ident.create_region(id="RegionTwo", description="Nova with unified limits")
    service_project = ident.create_project(name="service", domain_id="default")
    roles = {role.name: role for role in ident.roles()}
    for name in ("nova", "placement"):
        user = ident.create_user(name=name, password=PASSWORD, domain_id="default")
        ident.assign_project_role_to_user(service_project, user, roles["admin"])
        if name == "nova":
            # oslo.limit reads Keystone's limits system-wide: Nova's user needs system reader.
            ident.assign_system_role_to_user(user, roles["reader"], "all")
    identity = next(iter(ident.services(type="identity")))
    for interface in ("public", "internal"):
        # Nova looks Keystone up in its own region's catalog to check project ids.
        ident.create_endpoint(
            service_id=identity.id, interface=interface, url=keystone_url, region_id="RegionTwo"
        )
    compute = ident.create_service(name="nova", type="compute")
    placement = ident.create_service(name="placement", type="placement")
    endpoints: dict[str, str] = {}
    for nova, region in REGIONS.items():
        for interface in ("public", "internal"):
            url = f"http://127.0.0.1:{PORTS[nova]}/v2.1"
            endpoint = ident.create_endpoint(
                service_id=compute.id, interface=interface, url=url, region_id=region
            )
            endpoints[f"{nova}/{interface}"] = endpoint.id
            ident.create_endpoint(
                service_id=placement.id,
                interface=interface,
                url=f"http://127.0.0.1:{PORTS['placement']}",
                region_id=region,
            )
    for resource, limit in REGISTERED.items():
        ident.create_registered_limit(
            service_id=compute.id,
            region_id=REGIONS["nova-unified"],
            resource_name=resource,
            default_limit=limit,
        )
    admin_project = ident.find_project("admin", domain_id="default")
    gmd = ident.create_user(name="gmd", password=PASSWORD, domain_id="default")
    # Project-scoped admin for Nova's quota API, system-scoped admin for Keystone's limits:
    # with enforce_scope each API accepts only its own scope.
    ident.assign_project_role_to_user(admin_project, gmd, roles["admin"])
    ident.assign_system_role_to_user(gmd, roles["admin"], "all")
    projects = {}
    for name in CUSTOMERS:
        project = ident.create_project(name=name, domain_id="default", description="a customer")
        member = ident.create_user(name=f"{name}-member", password=PASSWORD, domain_id="default")
        ident.assign_project_role_to_user(project, member, roles["member"])
        projects[name] = project.id
    return {
        "keystone_url": keystone_url,
        "ports": PORTS,
        "password": PASSWORD,
        "projects": projects,
        "admin_project": admin_project.id,
        "compute_service_id": compute.id,
        "limits_endpoint_id": endpoints["nova-unified/public"],
        "registered_limits": REGISTERED,
        "nova": {},
    }


def write_clouds_yaml(run: Path, keystone_url: str) -> None:
    """gmd's accounts (JSON is YAML): admin per region, a system-scoped one, a member."""

    def auth(user: str, **scope: str) -> dict[str, Any]:
        return {
            "auth_url": keystone_url,
            "username": user,
            "password": PASSWORD,
            "user_domain_name": "Default",
            **scope,
        }

    project = {"project_name": "admin", "project_domain_name": "Default"}
    clouds = {
        "legacy": {"auth": auth("gmd", **project), "region_name": "RegionOne"},
        "unified": {"auth": auth("gmd", **project), "region_name": "RegionTwo"},
        "unified-system": {"auth": auth("gmd", system_scope="all"), "region_name": "RegionTwo"},
        "legacy-system": {"auth": auth("gmd", system_scope="all"), "region_name": "RegionOne"},
        "member": {
            "auth": auth("acme-member", project_name="acme", project_domain_name="Default"),
            "region_name": "RegionOne",
        },
        "keystone-admin": {"auth": auth("admin", system_scope="all"), "region_name": "RegionOne"},
    }
    for cloud in clouds.values():
        cloud["identity_api_version"] = 3
    (run / "clouds.yaml").write_text(json.dumps({"clouds": clouds}, indent=2))


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


def service_auth(keystone_url: str, user: str, **extra: str) -> dict[str, str]:
    return {
        "auth_url": keystone_url,
        "auth_type": "password",
        "username": user,
        "password": PASSWORD,
        "user_domain_name": "Default",
        **extra,
    }


def authtoken(keystone_url: str, user: str) -> dict[str, str]:
    return {
        "www_authenticate_uri": keystone_url,
        **service_auth(keystone_url, user, project_name="service"),
        "project_domain_name": "Default",
    }


def write_keystone(run: Path) -> Path:
    directory = run / "keystone"
    return ini(
        directory / "keystone.conf",
        {
            "DEFAULT": {"use_stderr": "true"},
            "database": {"connection": f"sqlite:///{directory / 'keystone.sqlite'}"},
            "token": {"provider": "fernet"},
            "fernet_tokens": {"key_repository": directory / "fernet-keys"},
            "fernet_receipts": {"key_repository": directory / "fernet-keys"},
            "credential": {"key_repository": directory / "credential-keys"},
            # Without a cache each token validation costs ~0.7 CPU-s here.
            "cache": {"enabled": "true", "backend": "dogpile.cache.memory"},
            "identity": {"password_hash_rounds": 4},
            "oslo_policy": POLICY,
        },
    )


def write_placement(run: Path, keystone_url: str) -> Path:
    directory = run / "placement"
    return ini(
        directory / "placement.conf",
        {
            "DEFAULT": {"use_stderr": "true"},
            "placement_database": {"connection": f"sqlite:///{directory / 'placement.sqlite'}"},
            "api": {"auth_strategy": "keystone"},
            "keystone_authtoken": authtoken(keystone_url, "placement"),
            "oslo_policy": POLICY,
        },
    )


def write_nova(run: Path, name: str, keystone_url: str, limits_endpoint: str) -> Path:
    directory = run / name
    region = REGIONS[name]
    sections: dict[str, dict[str, Any]] = {
        "DEFAULT": {"transport_url": "fake://", "use_stderr": "true", "host": name},
        "api": {"auth_strategy": "keystone"},
        "api_database": {"connection": f"sqlite:///{directory / 'nova_api.sqlite'}"},
        "database": {"connection": f"sqlite:///{directory / 'nova_cell1.sqlite'}"},
        "keystone_authtoken": authtoken(keystone_url, "nova"),
        "keystone": {"region_name": region},
        "placement": {
            **service_auth(keystone_url, "nova", project_name="service"),
            "project_domain_name": "Default",
            "region_name": region,
        },
        "oslo_policy": POLICY,
        "oslo_concurrency": {"lock_path": directory / "locks"},
    }
    if name == "nova-unified":
        sections["quota"] = {"driver": "nova.quota.UnifiedLimitsDriver"}
        sections["oslo_limit"] = {
            **service_auth(keystone_url, "nova", system_scope="all"),
            "endpoint_id": limits_endpoint,
        }
    else:
        sections["quota"] = {"driver": "nova.quota.DbQuotaDriver"}
    return ini(directory / "nova.conf", sections)


def sh(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(command[:4])} … failed ({done.returncode}):\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )


def say(text: str) -> None:
    print(f"gmd test openstack: {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
