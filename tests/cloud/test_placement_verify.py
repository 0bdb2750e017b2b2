"""Placement vouches for hosts' claims (``[placement] verify = "on"``), against the real
Placement of tests/scripts/openstack.sh.

Each test makes its own resource providers (compute hosts, named uniquely) with inventories
and allocations for consumers with a project and user, as Nova's scheduler and compute would,
and removes them afterwards. The daemon is the real one, on a real socket, posted to as an
agent would. The attacker's cases of issue 28: a stolen host token names another host's VM
(it would move the VM out of its host's plan), fakes VMs of a victim project or claims more
cores than the host has; each is refused with a 409 naming the VM, the host and what
Placement says, and the victim's rows stay as they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from gmd.agent.client import DaemonClient, Delivery
from gmd.common.config import ConfigError
from gmd.daemon.api.services import Services
from gmd.daemon.placement.settings import PlacementConfig
from gmd.daemon.placement.view import INVENTORY_EVERY, PlacementView
from gmd.ledger_schema.kinds import BatchState, IntervalState
from gmd.ledger_schema.tables import (
    actions,
    batches,
    customer_ledger,
    customers,
    hosts,
    intervals,
    quarantined_samples,
    samples,
    vms,
)
from gmd.openstack.placement import PlacementReader
from gmd.wire import CAPACITY_FIELDS
from tests.support.daemon_support import (
    INTERVAL_S,
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
    token_of,
)
from tests.support.openstack_support import LEGACY, RealCloud
from tests.support.placement_support import RealPlacement

pytest_plugins = ["tests.support.openstack_support"]


class Placement(RealPlacement):
    """The real Placement of this cloud, as gmd's admin account writes to it."""

    def __init__(self, cloud: RealCloud) -> None:
        super().__init__(cloud.connect(LEGACY))


@pytest.fixture
def placement(real_cloud: RealCloud) -> Iterator[Placement]:
    p = Placement(real_cloud)
    try:
        yield p
    finally:
        p.close()


def sqlite(tmp_path: Path, name: str = "ledger") -> str:
    return f"sqlite:///{tmp_path / name}.db"


def project() -> str:
    return uuid.uuid4().hex


def host_name(role: str) -> str:
    return f"cmp-{role}-{uuid.uuid4().hex[:8]}"


def verifying(url: str, names: list[str], cloud: str = LEGACY, **placement: Any) -> Any:
    settings = {"verify": "on", "cloud": cloud, "miss_s": 0, **placement}
    return make_config(url, dict.fromkeys(names, "operator"), placement=settings)


def services_of(daemon: Any) -> Services:
    return daemon.app.state.services  # type: ignore[no-any-return]


def post(daemon: Any, host: HostSpec, start: int, vms: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        f"{daemon.url}/v1/samples",
        json=batch(host, start, vms, key=f"{host.name}:{start}:{uuid.uuid4().hex[:6]}"),
        headers=auth(host.name),
        timeout=30,
    )


def vm_row(daemon: Any, vm: str) -> tuple[str, str] | None:
    """The VM's host and owner in the ledger."""
    with daemon.engine.connect() as conn:
        row = conn.execute(
            select(hosts.c.name, customers.c.name)
            .select_from(vms)
            .join(hosts, hosts.c.id == vms.c.host_id)
            .join(customers, customers.c.id == vms.c.customer_id)
            .where(vms.c.uuid == vm)
        ).first()
    return None if row is None else (row[0], row[1])


def samples_of(daemon: Any, customer: str) -> int:
    with daemon.engine.connect() as conn:
        return len(
            conn.execute(
                select(samples.c.vm_id)
                .join(customers, customers.c.id == samples.c.customer_id)
                .where(customers.c.name == customer)
            ).all()
        )


def refused(daemon: Any, reason: str) -> float:
    value = services_of(daemon).metrics.registry.get_sample_value(
        "gmd_placement_refused_batches_total", {"reason": reason}
    )
    return float(value or 0.0)


def test_a_correct_batch_is_accepted_and_a_fresh_snapshot_asks_placement_nothing(
    placement: Placement, database_url: str
) -> None:
    cmp = HostSpec(host_name("a"))
    provider = placement.host(cmp.name)
    owner = project()
    mine = [placement.server(provider, owner) for _ in range(3)]
    with serving(verifying(database_url, [cmp.name])) as daemon:
        first = post(daemon, cmp, aligned_past(3), [cpu_only(v, owner, 30.0) for v in mine])
        assert first.status_code == 200, first.text
        client = services_of(daemon).placement.client  # type: ignore[union-attr]
        asked = client.calls
        # provider, inventory, the host's consumers, and each new consumer's project
        assert asked == 3 + len(mine)
        for ago in (2, 1):
            again = post(daemon, cmp, aligned_past(ago), [cpu_only(v, owner, 30.0) for v in mine])
            assert again.status_code == 200, again.text
        assert client.calls == asked, "a fresh snapshot is checked in memory"
        assert all(vm_row(daemon, v) == (cmp.name, owner) for v in mine)
        with daemon.engine.connect() as conn:
            assert not conn.execute(select(batches.c.id).where(batches.c.unverified)).all()
        metrics = httpx.get(f"{daemon.url}/metrics", timeout=10).text
        assert 'gmd_placement_refused_batches_total{reason="not_on_host"} 0.0' in metrics
        assert f"gmd_placement_requests_total {float(asked)}" in metrics


def set_aside_count(daemon: Any, reason: str) -> float:
    value = services_of(daemon).metrics.registry.get_sample_value(
        "gmd_placement_set_aside_samples_total", {"reason": reason}
    )
    return float(value or 0.0)


def quarantined_vms(daemon: Any) -> list[str]:
    with daemon.engine.connect() as conn:
        return sorted(
            conn.execute(
                select(vms.c.uuid).join(
                    quarantined_samples, quarantined_samples.c.vm_id == vms.c.id
                )
            ).scalars()
        )


def test_a_host_naming_another_hosts_vm_has_it_set_aside_and_the_vm_stays_in_its_hosts_plan(
    placement: Placement, database_url: str
) -> None:
    thief, real = HostSpec(host_name("thief")), HostSpec(host_name("real"))
    owner = project()
    own = placement.server(placement.host(thief.name), owner)
    throttled = placement.server(placement.host(real.name), owner)
    with serving(verifying(database_url, [thief.name, real.name])) as daemon:
        start = aligned_past(2)
        assert post(daemon, real, start, [cpu_only(throttled, owner, 50.0)]).status_code == 200
        answer = post(
            daemon, thief, start, [cpu_only(own, owner, 1.0), cpu_only(throttled, owner, 0.1)]
        )
        # One VM Placement contradicts costs only itself: the thief's own VM is stored.
        assert answer.status_code == 200, answer.text
        receipt = answer.json()
        assert receipt["samples"] == 1 and len(receipt["set_aside"]) == 1
        said = receipt["set_aside"][0]
        assert throttled in said and thief.name in said and "allocates it nothing" in said
        # The answer says what is wrong with the host's own claim, never where the VM is.
        assert real.name not in answer.text
        assert vm_row(daemon, throttled) == (real.name, owner)
        assert vm_row(daemon, own) == (thief.name, owner)
        assert samples_of(daemon, owner) == 2, "the real host's sample and the thief's own"
        assert quarantined_vms(daemon) == [throttled]
        assert set_aside_count(daemon, "not_on_host") == 1
        assert refused(daemon, "not_on_host") == 0
        with daemon.engine.connect() as conn:
            state, error = conn.execute(
                select(batches.c.state, batches.c.error).where(
                    batches.c.key == receipt["key"] + "/set-aside"
                )
            ).one()
        assert state == BatchState.quarantined and throttled in error
        # The agent's retry (no answer reached it) is one batch, counted once.
        again = httpx.post(
            f"{daemon.url}/v1/samples",
            json=batch(
                thief,
                start,
                [cpu_only(own, owner, 1.0), cpu_only(throttled, owner, 0.1)],
                key=receipt["key"],
            ),
            headers=auth(thief.name),
            timeout=30,
        )
        assert again.status_code == 200 and again.json()["status"] == "duplicate", again.text
        assert samples_of(daemon, owner) == 2 and quarantined_vms(daemon) == [throttled]
        assert set_aside_count(daemon, "not_on_host") == 1, "a retry's are not counted again"
        # The agent hears what was set aside (its sender logs it), next interval too.
        agent = DaemonClient(daemon.url, token_of(thief.name), timeout_s=30)
        try:
            body = batch(
                thief,
                start + INTERVAL_S,
                [cpu_only(own, owner, 1.0), cpu_only(throttled, owner, 0.1)],
            )
            outcome = agent.post_batch(json.dumps(body).encode())
        finally:
            agent.close()
        assert outcome.kind == Delivery.delivered and outcome.detail == "accepted"
        assert len(outcome.set_aside) == 1 and throttled in outcome.set_aside[0]


def test_vms_of_a_victim_project_are_set_aside_and_the_victim_has_no_sample(
    placement: Placement, database_url: str
) -> None:
    cmp = HostSpec(host_name("framer"))
    provider = placement.host(cmp.name)
    attacker, victim = project(), project()
    own, honest = placement.server(provider, attacker), placement.server(provider, attacker)
    with serving(verifying(database_url, [cmp.name])) as daemon:
        start = aligned_past(2)
        # The attacker's real VM, claimed as the victim's, beside an honest one.
        claimed = post(
            daemon, cmp, start, [cpu_only(own, victim, 900.0), cpu_only(honest, attacker, 9.0)]
        )
        assert claimed.status_code == 200, claimed.text
        (said,) = claimed.json()["set_aside"]
        assert own in said and victim in said and "another project" in said
        assert attacker not in said, "whose the VM is stays Placement's"
        # VMs Placement never heard of, in the victim's name.
        fake = str(uuid.uuid4())
        faked = post(daemon, cmp, start - INTERVAL_S, [cpu_only(fake, victim, 900.0)])
        assert faked.status_code == 200, faked.text
        (said,) = faked.json()["set_aside"]
        assert fake in said and "allocates it nothing" in said
        # Naming the victim's project (a made-up VM of it, and a name for it): the VM is set
        # aside, and the name with it.
        ghost = str(uuid.uuid4())
        renamed = httpx.post(
            f"{daemon.url}/v1/samples",
            json={
                **batch(cmp, start - 2 * INTERVAL_S, [cpu_only(ghost, victim, 1.0)]),
                "customer_names": {victim: "renamed-by-a-host"},
            },
            headers=auth(cmp.name),
            timeout=30,
        )
        assert renamed.status_code == 200 and len(renamed.json()["set_aside"]) == 1
        with daemon.engine.connect() as conn:
            shown = conn.execute(
                select(customers.c.display_name).where(customers.c.name == victim)
            ).scalar()
        assert shown is None, "a host names only the projects of the VMs it runs"
        assert samples_of(daemon, victim) == 0
        assert samples_of(daemon, attacker) == 1
        assert quarantined_vms(daemon) == sorted([own, fake, ghost])
        assert set_aside_count(daemon, "other_project") == 1
        assert set_aside_count(daemon, "not_on_host") == 2


def test_a_flavor_other_than_the_allocation_is_set_aside(
    placement: Placement, tmp_path: Path
) -> None:
    """A real 1-vCPU, 1 GiB server sent as 16 vCPUs would have its cap in the plan raised
    sixteenfold; sent as what it is, it is stored."""
    cmp = HostSpec(host_name("flavor"))
    owner = project()
    vm = placement.server(placement.host(cmp.name), owner, ram_mb=1024)
    with serving(verifying(sqlite(tmp_path), [cmp.name])) as daemon:
        inflated = post(
            daemon,
            cmp,
            aligned_past(3),
            [cpu_only(vm, owner, 30.0, vcpus=16, memory_bytes=float(2**30))],
        )
        assert inflated.status_code == 200, inflated.text
        (said,) = inflated.json()["set_aside"]
        assert "flavor.vcpus = 16" in said and "1 VCPU" in said
        more_memory = post(
            daemon, cmp, aligned_past(2), [cpu_only(vm, owner, 30.0, memory_bytes=64e9)]
        )
        (said,) = more_memory.json()["set_aside"]
        assert "flavor.memory_bytes = 6.4e+10" in said and "1024 MEMORY_MB" in said
        assert set_aside_count(daemon, "flavor") == 2
        true = post(
            daemon,
            cmp,
            aligned_past(1),
            [cpu_only(vm, owner, 30.0, vcpus=1, memory_bytes=float(2**30))],
        )
        assert true.status_code == 200 and true.json()["set_aside"] == [], true.text
        assert samples_of(daemon, owner) == 1


def test_a_project_id_spelled_otherwise_is_one_customer(
    placement: Placement, tmp_path: Path
) -> None:
    """Placement and Keystone write a project id as 32 lowercase hex digits; the same id with
    dashes, or in capitals, is the same project: one customer, in one spelling, which its
    members' tokens name."""
    cmp = HostSpec(host_name("spell"))
    provider = placement.host(cmp.name)
    owner = project()
    dashed, upper = str(uuid.UUID(owner)), owner.upper()
    mine = [placement.server(provider, owner) for _ in range(3)]
    with serving(verifying(sqlite(tmp_path), [cmp.name])) as daemon:
        answer = post(
            daemon,
            cmp,
            aligned_past(1),
            [
                cpu_only(mine[0], owner, 1.0),
                cpu_only(mine[1], dashed, 1.0),
                cpu_only(mine[2], upper, 1.0),
            ],
        )
        assert answer.status_code == 200 and answer.json()["set_aside"] == [], answer.text
        with daemon.engine.connect() as conn:
            names = conn.execute(select(customers.c.name)).scalars().all()
        assert [n for n in names if n.replace("-", "").lower() == owner] == [owner]
        assert samples_of(daemon, owner) == 3


def test_more_capacity_than_the_providers_inventory_is_refused(
    placement: Placement, tmp_path: Path
) -> None:
    cmp = HostSpec(host_name("big"), cpu_cores=4096)
    provider = placement.host(cmp.name, vcpus=16, ratio=1.0)
    owner = project()
    vm = placement.server(provider, owner)
    honest = HostSpec(cmp.name, cpu_cores=16, memory_bytes=64 * 2**30)
    with serving(verifying(sqlite(tmp_path), [cmp.name])) as daemon:
        answer = post(daemon, cmp, aligned_past(2), [cpu_only(vm, owner, 4000 * INTERVAL_S)])
        assert answer.status_code == 409, answer.text
        detail = answer.json()["detail"]
        assert "capacity.cpu_cores = 4096" in detail and "VCPU total 16" in detail
        assert cmp.name in detail
        assert refused(daemon, "over_inventory") == 1
        assert vm_row(daemon, vm) is None
        ok = post(daemon, honest, aligned_past(1), [cpu_only(vm, owner, 60.0)])
        assert ok.status_code == 200, ok.text


def test_a_migrated_vm_is_accepted_from_its_new_host_and_refused_from_the_old(
    placement: Placement, database_url: str
) -> None:
    old, new = HostSpec(host_name("src")), HostSpec(host_name("dst"))
    source, target = placement.host(old.name), placement.host(new.name)
    owner = project()
    vm = placement.server(source, owner)
    with serving(verifying(database_url, [old.name, new.name])) as daemon:
        assert post(daemon, old, aligned_past(3), [cpu_only(vm, owner, 5.0)]).status_code == 200
        assert vm_row(daemon, vm) == (old.name, owner)
        placement.server(target, owner, vm)  # live migration: Nova moves the allocations
        moved = post(daemon, new, aligned_past(2), [cpu_only(vm, owner, 5.0)])
        assert moved.status_code == 200, moved.text
        assert vm_row(daemon, vm) == (new.name, owner)
        # The old host's batch that carries the VM's last seconds there is taken (it left
        # that host lately), and does not move the VM back: its row stays on the new host.
        tail = post(daemon, old, aligned_past(1), [cpu_only(vm, owner, 5.0)])
        assert tail.status_code == 200, tail.text
        assert vm_row(daemon, vm) == (new.name, owner)
    # A host that never had the VM is refused, and so is the old host once the VM left it
    # longer ago than remember_s.
    with serving(verifying(database_url, [old.name, new.name])) as daemon:
        view = services_of(daemon).placement
        assert view is not None
        view.remember_s = 0.0
        assert post(daemon, new, aligned_past(2), [cpu_only(vm, owner, 5.0)]).status_code == 200
        stale = post(daemon, old, aligned_past(1), [cpu_only(vm, owner, 5.0)])
        assert stale.status_code == 200, stale.text
        assert stale.json()["samples"] == 0 and len(stale.json()["set_aside"]) == 1
        assert new.name not in stale.text, "where the VM went is not the old host's to know"
        assert vm_row(daemon, vm) == (new.name, owner)


def test_a_departed_vm_is_taken_from_its_old_host_only_for_intervals_begun_before_it_left(
    placement: Placement, tmp_path: Path
) -> None:
    """The old host's batch that carries a migrated VM's last seconds is taken; a batch of an
    interval that began after the departure was seen is not (a host cannot go on charging a
    VM's owner for a VM it no longer runs)."""
    old, new = HostSpec(host_name("left")), HostSpec(host_name("arrived"))
    source, target = placement.host(old.name), placement.host(new.name)
    owner = project()
    vm = placement.server(source, owner)
    with serving(verifying(sqlite(tmp_path), [old.name, new.name])) as daemon:
        view = services_of(daemon).placement
        assert view is not None
        assert post(daemon, old, aligned_past(4), [cpu_only(vm, owner, 5.0)]).status_code == 200
        placement.server(target, owner, vm)
        # The departure is seen (the new host's first batch reads its snapshot) at a time of
        # day just before interval aligned_past(1) began.
        view.wall = lambda: float(aligned_past(1) - 1)
        assert post(daemon, new, aligned_past(3), [cpu_only(vm, owner, 5.0)]).status_code == 200
        before = post(daemon, old, aligned_past(2), [cpu_only(vm, owner, 5.0)])
        assert before.status_code == 200 and before.json()["set_aside"] == [], before.text
        after = post(daemon, old, aligned_past(1), [cpu_only(vm, owner, 5.0)])
        assert after.status_code == 200, after.text
        assert after.json()["samples"] == 0 and len(after.json()["set_aside"]) == 1
        assert vm_row(daemon, vm) == (new.name, owner)


def test_a_deleted_servers_last_seconds_are_taken_from_its_host(
    placement: Placement, database_url: str
) -> None:
    """Nova drops a server's allocations when it deletes it; its host's next batch still
    carries its last seconds, beside every other VM's: the batch is taken whole."""
    cmp = HostSpec(host_name("del"))
    provider = placement.host(cmp.name)
    owner = project()
    kept, doomed = placement.server(provider, owner), placement.server(provider, owner)
    with serving(verifying(database_url, [cmp.name])) as daemon:
        both = [cpu_only(kept, owner, 5.0), cpu_only(doomed, owner, 5.0)]
        assert post(daemon, cmp, aligned_past(3), both).status_code == 200
        placement.conn.placement.request(f"/allocations/{doomed}", "DELETE", raise_exc=False)
        view = services_of(daemon).placement
        assert view is not None
        view.config = PlacementConfig(**{**vars(view.config), "refresh_s": 1.0})
        with view._lock:
            for entry in view._hosts.values():
                entry.fetched = float("-inf")
        assert view.refresh() == 1  # the host read again: the server is gone from it
        last = post(daemon, cmp, aligned_past(2), both)
        assert last.status_code == 200, last.text
        assert vm_row(daemon, doomed) == (cmp.name, owner)
        # A VM the host never had, in no allocation, is still set aside.
        stranger = str(uuid.uuid4())
        ghost = post(daemon, cmp, aligned_past(1), [cpu_only(stranger, owner, 5.0)])
        assert ghost.status_code == 200 and ghost.json()["samples"] == 0, ghost.text
        assert quarantined_vms(daemon) == [stranger]


def test_a_provider_named_otherwise_is_found_through_the_map(
    placement: Placement, tmp_path: Path
) -> None:
    cmp = HostSpec(host_name("short"))
    fqdn = f"{cmp.name}.cloud.example"
    owner = project()
    vm = placement.server(placement.host(fqdn), owner)
    config = verifying(sqlite(tmp_path), [cmp.name], providers={cmp.name: fqdn})
    with serving(config) as daemon:
        assert post(daemon, cmp, aligned_past(1), [cpu_only(vm, owner, 5.0)]).status_code == 200
    stranger = HostSpec(host_name("stranger"))
    with serving(verifying(sqlite(tmp_path, "other"), [stranger.name])) as daemon:
        answer = post(daemon, stranger, aligned_past(1), [cpu_only(vm, owner, 5.0)])
        assert answer.status_code == 409, answer.text
        assert "no resource provider named" in answer.json()["detail"]


# -- Placement unreachable ---------------------------------------------------------------------


class Forwarder:
    """A TCP relay from a port of its own to the real Placement: while it does not listen,
    Placement cannot be reached (connection refused), as when its API is down; started, the
    real Placement answers through it. Nothing of Placement's answers is made up."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._open: set[asyncio.StreamWriter] = set()

    def start(self) -> None:
        ready = threading.Event()

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.close()

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._open |= {writer, up_writer}
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            server = loop.run_until_complete(asyncio.start_server(relay, "127.0.0.1", self.port))
            ready.set()
            loop.run_forever()
            # Stopped: every relayed connection is cut, as when Placement goes away.
            for writer in self._open:
                writer.transport.abort()
            self._open.clear()
            server.close()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(server.wait_closed())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert ready.wait(10)

    def stop(self) -> None:
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)


@pytest.fixture
def flaky_cloud(
    real_cloud: RealCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Forwarder]:
    """clouds.yaml entry "flaky": the admin account, with Placement reached through a
    :class:`Forwarder` (not started: Placement cannot be reached until the test starts it)."""
    forwarder = Forwarder(int(real_cloud.info["ports"]["placement"]))
    clouds = json.loads(real_cloud.clouds_yaml.read_text())
    clouds["clouds"]["flaky"] = {
        **clouds["clouds"][LEGACY],
        "placement_endpoint_override": f"http://127.0.0.1:{forwarder.port}",
    }
    path = tmp_path / "clouds.yaml"
    path.write_text(json.dumps(clouds))
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(path))
    try:
        yield forwarder
    finally:
        forwarder.stop()


def test_while_placement_is_away_batches_wait_unverified_then_are_verified_or_quarantined(
    placement: Placement, flaky_cloud: Forwarder, database_url: str
) -> None:
    honest, thief = HostSpec(host_name("honest")), HostSpec(host_name("thief"))
    owner, attacker, victim = project(), project(), project()
    mine = placement.server(placement.host(honest.name), owner)
    own = placement.server(placement.host(thief.name), attacker)
    start = aligned_past(3)
    config = verifying(database_url, [honest.name, thief.name], cloud="flaky", wait_s=600)
    # Before the outage: the honest host's VM is in the ledger, on its host.
    with flaky_cloud_up(flaky_cloud), serving(config) as daemon:
        first = post(daemon, honest, start - INTERVAL_S, [cpu_only(mine, owner, 30.0)])
        assert first.status_code == 200, first.text
    with serving(config) as daemon:
        services = services_of(daemon)
        # Placement cannot be reached: the honest batch and the thief's (the honest host's VM,
        # and its own in the victim's name) are both taken, unverified; no VM row moves.
        good = post(daemon, honest, start, [cpu_only(mine, owner, 30.0)])
        bad = post(daemon, thief, start, [cpu_only(mine, owner, 1.0), cpu_only(own, victim, 50.0)])
        assert good.status_code == 200, good.text
        assert bad.status_code == 200, bad.text
        assert vm_row(daemon, mine) == (honest.name, owner)
        with daemon.engine.connect() as conn:
            waiting = conn.execute(
                select(batches.c.key).where(batches.c.unverified, batches.c.interval_id == start)
            ).scalars()
            assert sorted(waiting) == sorted([good.json()["key"], bad.json()["key"]])
        # Accounting waits for them (the interval before the outage is accounted).
        now = start + INTERVAL_S + 1
        report = services.accountant.run_once(now)
        assert report is not None and report.waiting is not None
        assert report.waiting.start_s == start and report.waiting.batches == 2
        assert start - INTERVAL_S in report.accounted
        assert interval_state(daemon, start) == IntervalState.closed
        still = services.run_placement()
        assert still.unreachable is not None and still.waiting == 2
        # Placement answers again: the honest batch is verified, the thief's quarantined.
        with flaky_cloud_up(flaky_cloud):
            done = services.run_placement()
        assert done.unreachable is None and done.waiting == 0
        assert done.verified == [good.json()["key"]]
        assert [k for k, _, _ in done.quarantined] == [bad.json()["key"]]
        report = services.accountant.run_once(now)
        assert report is not None and start in report.accounted
        with daemon.engine.connect() as conn:
            state, error = conn.execute(
                select(batches.c.state, batches.c.error).where(batches.c.key == bad.json()["key"])
            ).one()
            assert state == BatchState.quarantined
            assert mine in error and thief.name in error and honest.name not in error
            kept = conn.execute(
                select(quarantined_samples.c.vm_id).where(
                    quarantined_samples.c.interval_id == start
                )
            ).all()
            assert len(kept) == 2, "the thief's samples are kept aside, not lost"
            logged = list(
                conn.execute(
                    select(actions.c.reason).where(actions.c.kind == "batch_quarantine")
                ).scalars()
            )
            assert any("Placement disagrees" in r and mine in r for r in logged)
        assert samples_of(daemon, owner) == 2, "every honest sample is there"
        assert samples_of(daemon, victim) == 0
        assert vm_row(daemon, mine) == (honest.name, owner)
        quarantined = services.metrics.registry.get_sample_value(
            "gmd_placement_quarantined_batches_total", {"reason": "not_on_host"}
        )
        assert quarantined == 1


def test_accounting_waits_for_unverified_batches_no_longer_than_wait_s(
    placement: Placement, flaky_cloud: Forwarder, tmp_path: Path
) -> None:
    cmp = HostSpec(host_name("alone"))
    owner = project()
    vm = placement.server(placement.host(cmp.name), owner)
    start = aligned_past(3)
    config = verifying(sqlite(tmp_path), [cmp.name], cloud="flaky", wait_s=120, miss_s=60)
    with serving(config) as daemon:
        services = services_of(daemon)
        client = services.placement.client  # type: ignore[union-attr]
        assert post(daemon, cmp, start, [cpu_only(vm, owner, 6.0)]).status_code == 200
        asked = client.calls
        assert asked == 1
        # Placement just failed: the next batch is stored unverified without asking it (a
        # Placement that swallows requests would hold every batch for timeout_s).
        second = post(daemon, cmp, start + INTERVAL_S, [cpu_only(vm, owner, 6.0)])
        assert second.status_code == 200, second.text
        assert client.calls == asked
        end = start + INTERVAL_S
        report = services.accountant.run_once(end + 119)
        assert report is not None and report.waiting is not None and not report.accounted
        report = services.accountant.run_once(end + 121)
        assert report is not None and start in report.accounted
        # Accounted without the batches Placement never vouched for: kept, as late ones, and
        # counted for nobody, whatever Placement says of them later.
        assert samples_of(daemon, owner) == 2
        with daemon.engine.connect() as conn:
            waiting = conn.execute(
                select(batches.c.interval_id, batches.c.late).where(batches.c.unverified)
            ).all()
            assert sorted(waiting) == [(start, True), (start + INTERVAL_S, False)]
            assert not conn.execute(
                select(customer_ledger.c.customer_id)
                .join(customers, customers.c.id == customer_ledger.c.customer_id)
                .where(customer_ledger.c.interval_id == start, customers.c.name == owner)
            ).all(), "no standing holds what Placement did not vouch for"


def test_a_vm_migrated_while_placement_was_away_moves_with_the_first_verified_batch(
    placement: Placement, flaky_cloud: Forwarder, tmp_path: Path
) -> None:
    source, target = HostSpec(host_name("from")), HostSpec(host_name("to"))
    owner = project()
    vm = placement.server(placement.host(source.name), owner)
    moved_to = placement.host(target.name)
    resident = placement.server(moved_to, owner)
    config = verifying(sqlite(tmp_path), [source.name, target.name], cloud="flaky")
    both = [cpu_only(resident, owner, 5.0), cpu_only(vm, owner, 5.0)]
    with serving(config) as daemon:
        with flaky_cloud_up(flaky_cloud):
            # Both hosts, the VM and its owner known to the ledger before the outage.
            first = aligned_past(5)
            assert post(daemon, source, first, both[1:]).status_code == 200
            assert post(daemon, target, first, both[:1]).status_code == 200
        placement.server(moved_to, owner, vm)
        # Placement away: the new host's batch is stored, the VM stays where it was.
        unverified = post(daemon, target, aligned_past(3), both)
        assert unverified.status_code == 200, unverified.text
        assert vm_row(daemon, vm) == (source.name, owner)
        with flaky_cloud_up(flaky_cloud):
            # The same VMs from the same host, verified now: the VM moves (the unverified
            # batch's lookup was not remembered as the host's).
            verified = post(daemon, target, aligned_past(2), both)
            assert verified.status_code == 200, verified.text
            assert vm_row(daemon, vm) == (target.name, owner)
            done = services_of(daemon).run_placement()
        assert done.verified == [unverified.json()["key"]] and not done.quarantined


@contextlib.contextmanager
def flaky_cloud_up(forwarder: Forwarder) -> Iterator[None]:
    forwarder.start()
    try:
        yield
    finally:
        forwarder.stop()


def interval_state(daemon: Any, start: int) -> str:
    with daemon.engine.connect() as conn:
        return str(
            conn.execute(select(intervals.c.state).where(intervals.c.start_s == start)).scalar_one()
        )


def test_placement_calls_per_interval_follow_the_refresh_policy(placement: Placement) -> None:
    """One request per host per ``refresh_s`` (and its inventory every
    :data:`INVENTORY_EVERY` of those), none per batch: over an hour of 60 s intervals, with
    the daemon's job every ``miss_s``, each of these hosts costs 12 + 1 requests. For 5,000
    hosts that is 65,000 an hour, 1,083 per interval (docs/api.md)."""
    count, vms_each, refresh_s, miss_s = 6, 4, 300.0, 30.0
    names = [host_name(f"n{i}") for i in range(count)]
    owner = project()
    servers = {}
    for name in names:
        provider = placement.host(name)
        servers[name] = [placement.server(provider, owner) for _ in range(vms_each)]
    now = [0.0]
    config = make_config(
        "sqlite://",
        placement={"verify": "on", "cloud": LEGACY, "refresh_s": refresh_s, "miss_s": miss_s},
    ).placement
    view = PlacementView(config, PlacementReader(LEGACY, timeout_s=10), 0.1, lambda: now[0])
    capacity = HostSpec("any").capacity
    cap = tuple(capacity[f] for f in CAPACITY_FIELDS)

    def interval() -> None:
        for name in names:
            verdict = view.check(name, cap, servers[name], [owner] * vms_each)
            assert verdict.verified, verdict

    try:
        interval()  # first sight: provider, inventory, consumers, and each server's project
        assert view.client.calls == count * (3 + vms_each)

        def hour(first_minute: int) -> int:
            before = view.client.calls
            for minute in range(first_minute, first_minute + 60):
                for half in (0.0, miss_s):
                    now[0] = minute * INTERVAL_S + half + 1
                    view.refresh()
                interval()
            return view.client.calls - before

        hour(0)  # the first hour holds the first sight's reads
        asked = hour(60)
        per_host_hour = 3600 / refresh_s + 3600 / refresh_s / INVENTORY_EVERY
        assert asked == count * per_host_hour
        # A daemon that runs no jobs (daemon.accounting = false) reads a host again from its
        # batch once its snapshot is 2 × refresh_s old: 6 reads an hour (and an inventory).
        before = view.client.calls
        for minute in range(120, 180):
            now[0] = minute * INTERVAL_S + 1
            interval()
        assert count * 6 <= view.client.calls - before <= count * 7
    finally:
        view.close()


def test_placement_settings_are_checked_where_they_are_read() -> None:
    assert make_config("sqlite://").placement == PlacementConfig()
    assert not PlacementConfig().on, "clouds without OpenStack keep trusting hosts' tokens"
    assert not PlacementConfig().trusting_a_cloud
    # Wherever a cloud is configured, hosts' claims are verified unless turned off.
    quotas = {"quota": {"cloud": "prod"}}
    verified = make_config("sqlite://", enforcement=quotas).placement
    assert (verified.on, verified.cloud, verified.trusting_a_cloud) == (True, "prod", False)
    own = make_config("sqlite://", enforcement=quotas, placement={"cloud": "reader"}).placement
    assert (own.on, own.cloud) == (True, "reader")
    off = make_config("sqlite://", enforcement=quotas, placement={"verify": "off"}).placement
    assert (off.on, off.trusting_a_cloud) == (False, True)
    with pytest.raises(ConfigError, match=r"placement\.cloud: is required"):
        make_config("sqlite://", placement={"verify": "on"})
    with pytest.raises(ConfigError, match=r"placement\.verify: 'yes' is not one of auto, on, off"):
        make_config("sqlite://", placement={"verify": "yes"})
    with pytest.raises(ConfigError, match=r"placement\.refresh_s"):
        make_config("sqlite://", placement={"refresh_s": 0})
    mapped = make_config("sqlite://", placement={"providers": {"cmp-1": "cmp-1.example"}})
    assert mapped.placement.provider_name("cmp-1") == "cmp-1.example"
    assert mapped.placement.provider_name("cmp-2") == "cmp-2"
