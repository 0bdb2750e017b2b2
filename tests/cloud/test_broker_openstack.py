"""gmd-broker's OpenStack handler against the whole small cloud (tests/scripts/nova_cloud.sh):
a request another site published is taken, booted by the real Nova in the federation's
project, run for its time from ACTIVE, deleted and completed once in ZooKeeper; a handler
started anew finds the server; and the site's offer follows Placement's spare VCPU (a server
booted by a tenant takes its vCPU off), with Placement that refuses to answer offering
nothing rather than failing the broker.

The federation's project (``gmd-federation``) is made here, with the operator's account (the
``admin`` entry) a member of it, as a site's operator would: the handler boots into it with
that entry scoped to it (``broker.openstack.project``) and reads Placement as ``admin``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gmd.broker.broker import Broker, BrokerSettings, Choice
from gmd.broker.config import OpenStackSettings
from gmd.broker.coordination import Request
from gmd.broker.handlers import LocalProcesses
from gmd.broker.openstack import TAG, HandlerUnavailable, OpenStackHandler
from tests.support.nova_support import COMPUTE_MICROVERSION, NovaCloud, Server
from tests.support.polling import wait_until
from tests.support.zookeeper_fixtures import client

pytest_plugins = ("tests.support.nova_support", "tests.support.zookeeper_fixtures")
pytestmark = pytest.mark.filterwarnings("ignore::openstack.warnings._RemovedInSDKWarning")

FEDERATION = "gmd-federation"
RUN_S = 8.0
"""Long enough to see the server ACTIVE and find it again with a second handler."""
BOOT_S = 180.0
"""The give-up for a boot (4-13 s measured here)."""


@pytest.fixture
def federation(nova: NovaCloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The federation's project (its id), the operator a member of it; every server left in
    it is deleted afterwards, whatever the test did."""
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(nova.clouds_yaml))
    keystone = nova.connect("keystone-admin")
    try:
        project = keystone.identity.find_project(FEDERATION, domain_id="default")
        if project is None:
            project = keystone.identity.create_project(name=FEDERATION, domain_id="default")
        user = keystone.identity.find_user("gmd", domain_id="default")
        role = keystone.identity.find_role("member")
        keystone.identity.assign_project_role_to_user(project, user, role)
    finally:
        keystone.close()
    try:
        yield str(project.id)
    finally:
        admin = nova.connect("admin")
        try:
            left = servers_in(admin, project.id)
            for server in left:
                admin.compute.delete(f"/servers/{server['id']}")
            deadline = time.monotonic() + 120
            while servers_in(admin, project.id) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not servers_in(admin, project.id), "servers left in the federation's project"
        finally:
            admin.close()


def servers_in(admin: Any, project_id: str, deleted: bool = False) -> list[dict[str, Any]]:
    """The project's servers as the cloud's admin sees them (``deleted``: those gone)."""
    query = f"all_tenants=1&project_id={project_id}" + ("&deleted=true" if deleted else "")
    response = admin.compute.get(f"/servers/detail?{query}", microversion=COMPUTE_MICROVERSION)
    assert response.status_code == 200, response.text
    return [s for s in response.json()["servers"] if deleted or s["status"] != "DELETED"]


def settings(nova: NovaCloud, **changes: Any) -> OpenStackSettings:
    values: dict[str, Any] = {
        "cloud": "admin",
        "project": FEDERATION,
        "placement_cloud": "admin",
        "image": "gmdnova-idle",  # by name: Glance is asked for its id
        "flavors": (nova.info["flavor"]["name"],),
        "poll_s": 0.5,
        "spare_s": 0.0,
        "timeout_s": 30.0,
        "boot_timeout_s": BOOT_S,
        "pause_s": 30.0,
    }
    return OpenStackSettings(**{**values, **changes})


def placement_spare(nova: NovaCloud) -> float:
    """Placement's own numbers, read apart from the handler: over the providers with VCPU,
    (total - reserved) × allocation_ratio less the VCPU used."""
    admin = nova.connect("admin")
    try:
        spare = 0.0
        providers = admin.placement.get("/resource_providers").json()["resource_providers"]
        for rp in providers:
            inventory = admin.placement.get(f"/resource_providers/{rp['uuid']}/inventories")
            vcpu = inventory.json()["inventories"].get("VCPU")
            if vcpu is None:
                continue
            usages = admin.placement.get(f"/resource_providers/{rp['uuid']}/usages").json()
            capacity = (vcpu["total"] - vcpu["reserved"]) * vcpu["allocation_ratio"]
            spare += max(0.0, capacity - usages["usages"].get("VCPU", 0))
        return spare
    finally:
        admin.close()


def settled_spare(nova: NovaCloud) -> float:
    """Placement's spare VCPU once two reads a second apart agree (a server deleted just
    before gives its allocation back a moment after Nova stops listing it)."""
    last = placement_spare(nova)
    deadline = time.monotonic() + 60
    while True:
        time.sleep(1.0)
        now = placement_spare(nova)
        if now == last or time.monotonic() > deadline:
            return now
        last = now


def test_the_offer_follows_placements_spare_vcpu(nova: NovaCloud, federation: str) -> None:
    handler = OpenStackHandler("cloud", 1000.0, settings(nova))  # Placement is the limit
    booted: list[Server] = []
    try:
        handler.check()
        before = settled_spare(nova)
        assert before >= 2, before
        assert handler.free_cores() == before
        booted.append(nova.boot("acme", "idle"))  # a tenant's server, not the federation's
        after = placement_spare(nova)
        assert after == before - nova.info["flavor"]["vcpus"]
        assert handler.free_cores() == after
        assert handler.running() == set()  # a tenant's server is none of the handler's
    finally:
        for server in booted:
            nova.delete(server)
        handler.close()

    # Placement refuses a member (its policy): the site offers nothing and nothing raises
    refused = OpenStackHandler("cloud", 1000.0, settings(nova, placement_cloud="acme"))
    try:
        assert refused.free_cores() == 0.0
        with pytest.raises(HandlerUnavailable, match=r"allocation candidates.*\(HTTP 403\)"):
            refused.check()
    finally:
        refused.close()


def test_a_borrowed_request_is_booted_by_nova_runs_its_time_and_is_completed_once(
    nova: NovaCloud, federation: str, zookeeper_hosts: str, zk_root: str
) -> None:
    handler = OpenStackHandler("cloud", 1.0, settings(nova))
    handler.check()
    made: list[tuple[Broker, Any, Any]] = []

    def broker(site: str, org: str, resources: Any) -> Broker:
        zk = client(zookeeper_hosts)
        started = Broker(zk, BrokerSettings(site, org, root=zk_root, tick_s=0.2), resources)
        started.start()
        made.append((started, zk, resources))
        return started

    admin = nova.connect("admin")
    try:
        home = broker("home", "org-a", LocalProcesses("home", 0.0))
        cloud = broker("cloud", "org-b", handler)
        home.submit(Request("job-1", "org-a", "home", 1.0, RUN_S, time.time()))
        wait_until("the cloud to take the request", lambda: took(cloud), 60)
        (name,) = cloud.federation.running()  # the request's node: its server's name

        def active() -> list[dict[str, Any]]:
            return [s for s in servers_in(admin, federation) if s["status"] == "ACTIVE"]

        poll("Nova to boot its server", active, BOOT_S)
        (server,) = active()
        assert server["name"] == f"gmd-fed-{name}" and server["tenant_id"] == federation
        assert TAG in server["tags"]
        meta = server["metadata"]
        assert (meta["gmd_request"], meta["gmd_org"], meta["gmd_site"]) == (
            "job-1",
            "org-a",
            "home",
        )
        assert meta["gmd_runner"] == "cloud" and meta["gmd_name"] == name

        # a handler started anew (a restarted broker's) finds it from Nova
        again = OpenStackHandler("cloud", 1.0, settings(nova))
        try:
            again.check()
            assert again.running() == {name}
        finally:
            again.close(delete=False)

        wait_until("the completion", lambda: completed(cloud), RUN_S + 60)
        poll("the server deleted", lambda: not servers_in(admin, federation), 120)
        (gone,) = [
            s for s in servers_in(admin, federation, deleted=True) if s["id"] == server["id"]
        ]
        ran = seconds(gone["OS-SRV-USG:terminated_at"]) - seconds(gone["OS-SRV-USG:launched_at"])
        assert ran >= RUN_S - 1  # Nova's times are cut down to the second

        assert [d.request for d in cloud.decisions if d.choice == Choice.completed] == ["job-1"]
        f = home.federation
        f.sync()  # the cloud completed through its own session
        assert f.running() == {} and f.queued() == []
        sums = f.summaries()
        assert sums["org-b"].contributed == pytest.approx(sums["org-a"].used)
        assert RUN_S <= sums["org-a"].used <= RUN_S + 10  # one core for its run time
        assert sums["org-a"].contributed == 0 and sums["org-b"].used == 0
    finally:
        admin.close()
        for started, zk, resources in made:
            started.stop()
            resources.close()
            zk.stop()
            zk.close()
        if all(resources is not handler for _, _, resources in made):
            handler.close()


def poll(what: str, check: Callable[[], object], timeout_s: float) -> None:
    """``wait_until`` for a check that asks Nova: twice a second, not twenty times."""

    def slowly() -> bool:
        if check():
            return True
        time.sleep(0.5)
        return False

    wait_until(what, slowly, timeout_s)


def took(broker: Broker) -> bool:
    return any(d.choice == Choice.took for d in broker.decisions)


def completed(broker: Broker) -> bool:
    return any(d.choice == Choice.completed for d in broker.decisions)


def seconds(text: str) -> float:
    from datetime import UTC, datetime

    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
