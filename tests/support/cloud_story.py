"""The story gmd tells in the small cloud of tests/scripts/nova_cloud.sh, told twice: by the
end-to-end test (tests/cloud/test_cloud_loop.py, which asserts it) and by ``make cloud-demo``
(tests/support/cloud_demo.py, which narrates it). One owner for what both run: the settings that
make a spinning project greedy within a minute, the agent's and daemon's configuration on the
compute host, and how the cloud's side (a guest's live caps, a project's Nova quota) is read.

The story: acme's member boots two guests that spin, initech's and the operator's one idle
guest each. acme takes more than its third of the host, climbs to level 1 within a minute (a
30 s half-life), is capped on the host and its Nova quota lowered to the floor, so that its
member's next boot is refused. Once acme's guests stop, its balance decays: the caps are lifted
and its quota put back exactly.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from tests.support.nova_support import NovaCloud

INTERVAL_S = 10
CAP = 0.3
"""Level 1 caps a guest's vCPU at 30 % of a core."""
CAP_MARGIN = 0.15
"""vcpu_quota caps the guest's vCPU thread; QEMU's own threads (its disk emulation, busy with
the spinning guest's reads and writes until the disk cap holds them) are outside it."""
DISK_CAP = 4_000_000
# Two spinning guests take 1.1-1.8 of the host's 2 cores against acme's equal share of 2/3
# (three projects run servers), which a 30 s half-life adds up past the threshold. The
# consumer is the customer: with a consumer per VM, acme's two guests would be endowed with
# two of the host's four equal shares, a whole core, which they barely exceed on a busy CI
# host (1.06 cores: a balance of 0.15 against a threshold of 0.3, never crossed).
ACCOUNTING = {
    "interval_s": INTERVAL_S,
    "grace_s": 4,
    "endowment": "equal",
    "consumer": "customer",
    "half_life_s": 30,
}
ENFORCEMENT: dict[str, Any] = {
    "mode": "on",
    "enter": [0.3],
    "leave": [0.1],
    # A level is held at least this long: once capped, acme stops taking more than its share
    # and its balance decays; the story looks at the cap, the quota and the explanation first.
    "dwell_s": 90,
    "max_step": 1,
    "weight_factors": [0.5],
    "cap_level": 1,
    "quota_level": 1,
    "cpu_cap_fractions": [CAP],
    "disk_caps_bytes_per_s": [DISK_CAP],
    # Caps on every host: this one compute host is not busy enough to count as contended.
    "contended_above": {"cpu": 0.0, "disk": 0.0},
    "quota": {
        "cloud": "admin",
        "backend": "nova",
        # One step takes the quota to its floor: below what acme runs, so its next boot fails.
        "step_cores": 1.0,
        "step_ram": 1.0,
        "step_instances": 1.0,
        "floor_cores": 1,
        "floor_ram_mb": 128,
        "floor_instances": 1,
        "every_s": 2,
    },
}
QUOTA_KEYS = ("cores", "ram", "instances")
CAPPED_VCPU_QUOTA = int(CAP * 100_000)
"""libvirt's ``vcpu_quota`` (µs per 100 ms period) of a capped guest."""


def daemon_sections(nova: NovaCloud) -> dict[str, dict[str, Any]]:
    """gmd.toml's sections but ``[database]`` and ``[hosts]``: accounting and enforcement of
    the story, the read API behind the cloud's Keystone (so that a member may ask), and every
    batch vouched for by the cloud's Placement."""
    info = nova.info
    keystone = {
        "www_authenticate_uri": info["keystone_url"],
        "auth_url": info["keystone_url"],
        "auth_type": "password",
        "username": "gmd",
        "password": "gmd-test-secret",
        "user_domain_name": "Default",
        "project_name": "admin",
        "project_domain_name": "Default",
    }
    return {
        "accounting": ACCOUNTING,
        "enforcement": ENFORCEMENT,
        "daemon": {"bind": "127.0.0.1", "account_every_s": 0.5},
        "read_api": {
            "auth": "keystone",
            "keystone": keystone,
            "admin_project_id": info["admin_project"],
        },
        "placement": {
            "verify": "on",
            "cloud": "admin",
            "refresh_s": 5,
            "providers": {info["compute_host"]: info["hypervisor_hostname"]},
        },
    }


def agent_settings(nova: NovaCloud, daemon_url: str, directory: Path) -> dict[str, Any]:
    """``[agent]`` of gmd-agent on the compute host, as an operator runs it there: the default
    collector and applier, only the cloud's domains (its token is the caller's)."""
    info = nova.info
    return {
        "daemon_url": daemon_url,
        "host": info["compute_host"],
        "libvirt_uri": info["libvirt_uri"],
        "domain_prefixes": [nova.domain_prefix],
        "tick_s": 1,
        "interval_s": INTERVAL_S,
        "post_jitter_s": 0,
        "plan_every_s": 0,
        "describe_every_s": 5,
        "spool_path": str(directory / "spool.db"),
        "enforcement_state_path": str(directory / "enforcement.json"),
        "network_bytes_per_s": 1250000000,
        "metrics_port": 0,
    }


def toml(value: object) -> str:
    """A TOML value (strings, numbers, lists, inline tables): enough for gmd's files."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml(k)} = {toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    return repr(value)


def toml_document(doc: dict[str, dict[str, Any]]) -> str:
    """``doc`` (table → keys, one level of sub-tables) as a TOML file."""

    def key(name: str) -> str:
        return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else toml(name)

    lines: list[str] = []
    for name, table in doc.items():
        lines.append(f"[{key(name)}]")
        subtables = {k: v for k, v in table.items() if isinstance(v, dict)}
        lines += [f"{key(k)} = {toml(v)}" for k, v in table.items() if k not in subtables]
        for sub, values in subtables.items():
            lines.append(f"\n[{key(name)}.{key(sub)}]")
            lines += [f"{key(k)} = {toml(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)


def live_settings(dom: Any) -> dict[str, Any]:
    """What gmd changes on a guest, as libvirt reports it live: scheduler, blkio, iotune.
    On a host whose disks no BFQ or CFQ runs, libvirt refuses the blkio weight of a running
    guest (VIR_ERR_OPERATION_INVALID): ``blkio`` then holds its words as ``unsupported``."""
    import libvirt

    live = libvirt.VIR_DOMAIN_AFFECT_LIVE
    try:
        blkio = dom.blkioParameters(live)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_OPERATION_INVALID or not dom.isActive():
            raise
        blkio = {"unsupported": exc.get_error_message()}
    return {
        "sched": dom.schedulerParametersFlags(live),
        "blkio": blkio,
        "iotune": dom.blockIoTune("vda", live),
    }


def cpu_rate(dom: Any, window_s: float = 3.0) -> float:
    """The cores a domain's vCPUs used over ``window_s`` (its CPU time, from libvirt)."""
    first, t0 = dom.info()[4], time.monotonic()
    time.sleep(window_s)
    second, t1 = dom.info()[4], time.monotonic()
    return (second - first) / 1e9 / (t1 - t0)


def quota_of(nova: NovaCloud, cloud: str, project: str) -> dict[str, int]:
    """The project's quota set as ``cloud``'s Nova reports it."""
    conn = nova.connect(cloud)
    try:
        answer = conn.compute.get(f"/os-quota-sets/{project}")
        if answer.status_code != 200:
            raise AssertionError(
                f"GET /os-quota-sets/{project}: {answer.status_code} {answer.text}"
            )
        got = answer.json()["quota_set"]
        return {k: int(got[k]) for k in QUOTA_KEYS}
    finally:
        conn.close()


def quota(nova: NovaCloud, project: str) -> dict[str, int]:
    """The project's legacy quota (RegionOne's Nova, whose quota gmd lowers in the story)."""
    return quota_of(nova, "admin", project)


def server_action(nova: NovaCloud, server_id: str, project: str, action: str) -> None:
    """``POST /servers/ID/action`` (pause, unpause …) as the project's member."""
    conn = nova.connect(nova.member_cloud(project))
    try:
        answer = conn.compute.post(f"/servers/{server_id}/action", json={action: None})
        if answer.status_code != 202:
            raise AssertionError(f"{action} of {server_id}: {answer.status_code} {answer.text}")
    finally:
        conn.close()


def member_token(nova: NovaCloud, project: str) -> str:
    """A Keystone token of the project's member (the web page takes it as a cookie)."""
    conn = nova.connect(nova.member_cloud(project))
    try:
        return str(conn.session.get_token())
    finally:
        conn.close()


def register_fairness(nova: NovaCloud, url: str) -> str:
    """gmd's read API in the cloud's catalog (type ``fairness``), as the OSC plugin finds it;
    returns the service id for :func:`unregister_fairness`."""
    admin = nova.connect("keystone-admin")
    try:
        service = admin.identity.create_service(name="gmd", type="fairness")
        admin.identity.create_endpoint(
            service_id=service.id, interface="public", url=url, region_id="RegionOne"
        )
        return str(service.id)
    finally:
        admin.close()


def unregister_fairness(nova: NovaCloud, service_id: str) -> None:
    admin = nova.connect("keystone-admin")
    try:
        for endpoint in admin.identity.endpoints(service_id=service_id):
            admin.identity.delete_endpoint(endpoint)
        admin.identity.delete_service(service_id)
    finally:
        admin.close()
