"""The OpenStack handler's bookkeeping over a fake Nova and Placement (the real ones:
tests/cloud/test_broker_openstack.py): a request's server booted, run for its time from ACTIVE
and deleted; a server in ERROR, a refused boot, no flavor that fits: finished not completed, and
the site offers nothing for a while; Placement caps the offer and its failure offers nothing; a
new handler finds the servers a previous one left; nothing raises into the broker but
``running`` before Nova ever answered; and ``[broker.openstack]`` is validated."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gmd.broker.config import OpenStackSettings, parse_broker
from gmd.broker.coordination import Request
from gmd.broker.handlers import Finished
from gmd.broker.openstack import (
    TAG,
    HandlerUnavailable,
    Listed,
    NovaFlavor,
    OpenStackHandler,
)
from gmd.common.config import ConfigError
from gmd.openstack.client import OpenStackError, OpenStackErrorKind

SETTINGS = OpenStackSettings(
    cloud="fed", image="guest", poll_s=1.0, spare_s=5.0, timeout_s=2.0, pause_s=30.0
)
FLAVORS = [
    NovaFlavor("f-big", "big", 4, 4096, 10),
    NovaFlavor("f-tiny", "tiny", 1, 128, 1),
    NovaFlavor("f-two", "two", 2, 2048, 10),
    NovaFlavor("f-two-small", "two-small", 2, 1024, 10),
]


def failure(
    kind: OpenStackErrorKind = OpenStackErrorKind.unavailable, text: str = "down"
) -> OpenStackError:
    return OpenStackError(kind, text, cloud="fed", target="p", operation="x")


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeNova:
    """Nova's servers (``made``) as the handler lists them; a test moves them along."""

    wall: Clock
    made: dict[str, dict[str, Any]] = field(default_factory=dict)
    created: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    fail_list: OpenStackError | None = None
    fail_create: OpenStackError | None = None
    create_anyway: bool = False
    """with fail_create: Nova made the server, the answer was lost"""
    fail_delete: OpenStackError | None = None
    ids: Iterator[str] = field(default_factory=lambda: (f"srv-{n}" for n in itertools.count(1)))

    def flavors(self) -> list[NovaFlavor]:
        return list(FLAVORS)

    def image_id(self, image: str) -> str:
        return f"id-of-{image}"

    def create(self, body: dict[str, Any]) -> str:
        server = body["server"]
        if self.fail_create is not None and not self.create_anyway:
            raise self.fail_create
        self.created.append(server)
        server_id = next(self.ids)
        flavor = next(f for f in FLAVORS if f.id == server["flavorRef"])
        self.made[server_id] = {
            "status": "BUILD",
            "task_state": "scheduling",
            "metadata": dict(server["metadata"]),
            "vcpus": float(flavor.vcpus),
            "launched_s": None,
            "fault": "",
            "tags": list(server["tags"]),
        }
        if self.fail_create is not None:
            raise self.fail_create
        return server_id

    def servers(self) -> list[Listed]:
        if self.fail_list is not None:
            raise self.fail_list
        return [
            Listed(
                i,
                s["status"],
                s["task_state"],
                s["metadata"],
                s["vcpus"],
                s["launched_s"],
                s["fault"],
            )
            for i, s in self.made.items()
            if TAG in s["tags"]
        ]

    def delete(self, server_id: str) -> None:
        if self.fail_delete is not None:
            raise self.fail_delete
        self.deleted.append(server_id)
        if server_id in self.made:
            self.made[server_id]["task_state"] = "deleting"

    def gone(self) -> None:
        """Nova finishes the deletes."""
        for server_id in [i for i, s in self.made.items() if s["task_state"] == "deleting"]:
            del self.made[server_id]

    def activate(self, server_id: str) -> None:
        self.made[server_id].update(
            status="ACTIVE", task_state=None, launched_s=float(int(self.wall.now))
        )

    def close(self) -> None:
        pass


@dataclass
class FakePlacement:
    spare: float = 8.0
    fail: OpenStackError | None = None
    reads: int = 0

    def spare_vcpus(self) -> float:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return self.spare

    def close(self) -> None:
        pass


@dataclass
class Cloud:
    """A handler over the fakes, with a clock that the monotonic and the wall clocks share."""

    clock: Clock
    nova: FakeNova
    placement: FakePlacement
    handler: OpenStackHandler

    def later(self, seconds: float) -> None:
        self.clock.now += seconds


def cloud(
    cores: float = 4.0, spare: float = 8.0, nova: FakeNova | None = None, clock: Clock | None = None
) -> Cloud:
    clock = clock or Clock()
    nova = nova or FakeNova(clock)
    placement = FakePlacement(spare)
    handler = OpenStackHandler(
        "cloud", cores, SETTINGS, nova=nova, placement=placement, clock=clock, wall=clock
    )
    return Cloud(clock, nova, placement, handler)


def request(rid: str = "job1", cores: float = 1.0, run_s: float = 10.0) -> Request:
    return Request(rid, "org-a", "home", cores, run_s, 1.0)


def test_a_request_boots_runs_its_time_from_active_and_is_deleted_and_completed() -> None:
    c = cloud()
    h = c.handler
    assert h.free_cores() == 4.0 and h.capacity_cores() == 4.0
    h.start("req-1", request(cores=1.5, run_s=10.0))
    (body,) = c.nova.created
    assert body["name"] == "gmd-fed-req-1" and body["flavorRef"] == "f-two-small"
    assert body["imageRef"] == "id-of-guest" and body["networks"] == "none"
    assert body["tags"] == [TAG]
    assert body["metadata"] == {
        "gmd_name": "req-1",
        "gmd_request": "job1",
        "gmd_org": "org-a",
        "gmd_site": "home",
        "gmd_runner": "cloud",
        "gmd_run_s": "10.0",
        "gmd_cores": "1.5",
    }
    assert h.free_cores() == 2.0  # its flavor's two vCPUs are held
    assert h.running() == {"req-1"}
    c.later(30)  # booting takes long: run time counts from ACTIVE
    assert h.finished() == []
    c.nova.activate("srv-1")
    c.later(1)
    assert h.finished() == [] and h.running() == {"req-1"}
    c.later(9.5)  # ACTIVE at :00 (cut down to the second) + 1 s, 10 s to run
    assert h.finished() == []
    c.later(1)
    (done,) = h.finished()
    assert done.name == "req-1" and done.completed and 10.0 <= done.ran_s < 11.0
    assert c.nova.deleted == ["srv-1"]
    assert h.finished() == [] and h.running() == set()
    c.nova.gone()
    c.later(1)
    assert h.free_cores() == 4.0


def test_a_server_in_error_fails_is_deleted_and_the_site_pauses_its_offer() -> None:
    c = cloud()
    h = c.handler
    h.start("req-1", request())
    c.nova.made["srv-1"].update(status="ERROR", task_state=None, fault="No valid host")
    c.later(1)
    assert h.finished() == [Finished("req-1", 0.0, False)]
    assert c.nova.deleted == ["srv-1"]
    assert h.free_cores() == 0.0  # paused
    c.later(SETTINGS.pause_s)
    assert h.free_cores() == 4.0


def test_a_refused_boot_or_no_fitting_flavor_fails_at_once() -> None:
    c = cloud(cores=8.0)
    h = c.handler
    c.nova.fail_create = failure(OpenStackErrorKind.forbidden, "Quota exceeded for cores")
    h.start("req-1", request())
    assert h.finished() == [Finished("req-1", 0.0, False)] and h.free_cores() == 0.0
    c.later(SETTINGS.pause_s)
    c.nova.fail_create = None
    h.start("req-2", request(cores=5.0))  # the biggest flavor has 4
    assert h.finished() == [Finished("req-2", 0.0, False)] and not c.nova.created


def test_an_unanswered_boot_is_found_by_its_metadata_or_failed() -> None:
    c = cloud()
    h = c.handler
    c.nova.fail_create, c.nova.create_anyway = failure(OpenStackErrorKind.timeout), True
    h.start("req-1", request())
    assert h.running() == {"req-1"}
    c.nova.fail_create, c.nova.create_anyway = None, False
    c.later(1)
    c.nova.activate("srv-1")
    c.later(1)
    h.finished()
    assert h.running() == {"req-1"}
    c.later(11)
    assert [d.completed for d in h.finished()] == [True]

    # no server made: failed once a listing well after the boot does not show it
    c.nova.fail_create = failure(OpenStackErrorKind.timeout)
    h.start("req-2", request())
    c.later(1)
    assert h.finished() == []
    c.later(2 * SETTINGS.timeout_s + SETTINGS.poll_s)
    assert h.finished() == [Finished("req-2", 0.0, False)]


def test_placement_caps_the_offer_is_cached_and_its_failure_offers_nothing() -> None:
    c = cloud(cores=4.0, spare=3.0)
    h = c.handler
    assert h.free_cores() == 3.0
    h.start("req-1", request())
    assert h.free_cores() == 2.0  # the boot since Placement's answer is taken off it
    assert c.placement.reads == 1
    c.placement.spare = 0.0
    c.later(SETTINGS.spare_s)
    assert h.free_cores() == 0.0 and c.placement.reads == 2
    c.placement.fail = failure()
    c.later(SETTINGS.spare_s)
    assert h.free_cores() == 0.0  # a warning, nothing raised
    c.placement.fail, c.placement.spare = None, 100.0
    c.later(SETTINGS.spare_s)
    assert h.free_cores() == 3.0  # the offer less what its server holds


def test_nova_unreachable_raises_nothing_but_running_before_the_first_listing() -> None:
    c = cloud()
    h = c.handler
    c.nova.fail_list = failure()
    assert h.free_cores() == 0.0  # what runs here is not known yet
    assert h.finished() == []
    with pytest.raises(HandlerUnavailable, match="not listed"):
        h.running()
    c.nova.fail_list = None
    c.later(1)
    assert h.running() == set() and h.free_cores() == 4.0
    h.start("req-1", request())
    c.nova.fail_list = failure()
    c.later(5)
    assert h.running() == {"req-1"} and h.finished() == []  # kept while Nova is away


def test_check_refuses_what_waiting_cannot_mend() -> None:
    c = cloud()
    c.nova.fail_list = failure(OpenStackErrorKind.unauthorized, "authentication refused")
    with pytest.raises(HandlerUnavailable, match="authentication refused"):
        c.handler.check()
    c = cloud()
    c.placement.fail = failure(OpenStackErrorKind.forbidden, "placement policy")
    with pytest.raises(HandlerUnavailable, match="placement policy"):
        c.handler.check()
    c = cloud()
    c.nova.fail_list = failure(OpenStackErrorKind.timeout)
    c.handler.check()  # waited out


def test_a_new_handler_finds_the_servers_its_site_left_and_deletes_what_no_one_owns() -> None:
    first = cloud()
    first.handler.start("req-1", request(run_s=100.0))
    first.handler.start("req-2", request("job2", run_s=100.0))
    first.nova.activate("srv-1")
    first.later(1)
    first.handler.running()
    first.handler.close(delete=False)  # a crash: the servers stay
    # another site's server in the same project is none of this site's business
    first.nova.made["srv-x"] = {
        **first.nova.made["srv-2"],
        "metadata": {"gmd_name": "req-9", "gmd_runner": "elsewhere"},
    }
    first.later(60)

    again = cloud(nova=first.nova, clock=first.clock)
    assert again.handler.running() == {"req-1", "req-2"}
    assert again.handler.free_cores() == 2.0
    again.later(40)  # ACTIVE 101 s ago: its 100 s are up
    assert [(d.name, d.completed) for d in again.handler.finished()] == [("req-1", True)]
    again.handler.stop("req-2")  # the broker's reconciliation: no longer this site's
    assert again.nova.deleted == ["srv-1", "srv-2"] and again.handler.finished() == []

    # a server of this site that no request here owns goes
    first.nova.made["srv-o"] = {
        **first.nova.made["srv-x"],
        "metadata": {"gmd_name": "req-7", "gmd_runner": "cloud"},
    }
    again.later(1)
    again.handler.running()
    assert "srv-o" in again.nova.deleted and "srv-x" not in again.nova.deleted


def test_a_failed_delete_is_asked_again_until_nova_lists_it_no_more() -> None:
    c = cloud()
    h = c.handler
    h.start("req-1", request(run_s=1.0))
    c.nova.activate("srv-1")
    c.later(1)
    h.finished()
    c.nova.fail_delete = failure()
    c.later(2)
    assert [d.completed for d in h.finished()] == [True]  # completed all the same
    assert c.nova.deleted == []
    c.nova.fail_delete = None
    c.later(1)
    h.finished()
    assert c.nova.deleted == ["srv-1"]
    c.nova.gone()
    c.later(1)
    h.finished()
    c.later(1)
    h.finished()
    assert c.nova.deleted == ["srv-1"]


def test_close_deletes_every_server() -> None:
    c = cloud()
    c.handler.start("req-1", request())
    c.handler.start("req-2", request("job2"))
    c.handler.close()
    assert sorted(c.nova.deleted) == ["srv-1", "srv-2"]


def test_the_openstack_table_is_validated_naming_file_and_key() -> None:
    def parsed(broker: dict[str, Any]) -> Any:
        return parse_broker({"broker": broker}, "gmd.toml")

    ok = parsed(
        {
            "handler": "openstack",
            "cores": 4,
            "openstack": {"cloud": "fed", "image": "guest", "flavors": ["tiny"]},
        }
    )
    assert ok.openstack.cloud == "fed" and ok.openstack.flavors == ("tiny",)
    assert parsed({}).openstack == OpenStackSettings()
    for broker, message in [
        (
            {"handler": "openstack"},
            'broker.openstack.cloud: is required with handler = "openstack"',
        ),
        (
            {"handler": "openstack", "openstack": {"cloud": "fed"}},
            'broker.openstack.image: is required with handler = "openstack"',
        ),
        ({"openstack": {"network": "lan"}}, 'broker.openstack.network: \'lan\': "none", "auto"'),
        ({"openstack": {"flavors": [""]}}, "broker.openstack.flavors: '': each a flavor's"),
        ({"openstack": {"poll_s": 0}}, "broker.openstack.poll_s: 0 is not in [0.1, 3600]"),
        ({"openstack": {"clod": "x"}}, "broker.openstack.clod: unknown key (misspelt?)"),
    ]:
        with pytest.raises(ConfigError) as caught:
            parsed(broker)
        assert str(caught.value).startswith(f"gmd.toml: {message}"), caught.value
