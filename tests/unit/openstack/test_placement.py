"""The one Placement reader (gmd.openstack.placement) over a fake connection: what the daemon's
view and the broker read, at which microversion, parsed; a malformed answer and a failure are
one OpenStackError naming the read; a Placement that did not answer is not asked again for
``pause_s``; the broker's reader says its own words. What the real Placement answers:
tests/cloud/test_placement_verify.py and tests/cloud/test_broker_openstack.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from gmd.broker.openstack import PlacementSpare
from gmd.openstack.client import OpenStackError, OpenStackErrorKind
from gmd.openstack.placement import (
    CANDIDATES_MICROVERSION,
    MICROVERSION,
    SPARE_QUERY,
    Allocation,
    Consumer,
    Inventory,
    PlacementReader,
    spare_of,
)

PROVIDER = "5b0f5fe5-6f3c-4c1c-9f8e-0d6f3e1c2a11"
VM = "0c9e7b2a-1d3f-4e5a-8b6c-7d8e9f0a1b2c"


@dataclass
class Answer:
    """What openstacksdk's adapter returns: a status, a body."""

    status_code: int
    body: Any

    @property
    def content(self) -> bytes:
        return json.dumps(self.body).encode()

    @property
    def text(self) -> str:
        return json.dumps(self.body)

    def json(self) -> Any:
        return self.body


@dataclass
class FakePlacement:
    answers: dict[str, Answer]
    asked: list[tuple[str, str]] = field(default_factory=list)

    def get(self, path: str, microversion: str) -> Answer:
        self.asked.append((path, microversion))
        return self.answers[path]


@dataclass
class FakeConnection:
    placement: FakePlacement

    def close(self) -> None:
        pass


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


ANSWERS = {
    "/resource_providers?name=cmp-1": Answer(
        200, {"resource_providers": [{"name": "cmp-1", "uuid": PROVIDER}]}
    ),
    "/resource_providers?name=cmp-2": Answer(200, {"resource_providers": []}),
    f"/resource_providers/{PROVIDER}/inventories": Answer(
        200,
        {
            "inventories": {
                "VCPU": {"total": 16, "reserved": 2, "allocation_ratio": 4.0},
                "MEMORY_MB": {"total": 65536},
            }
        },
    ),
    f"/resource_providers/{PROVIDER}/allocations": Answer(
        200,
        {
            "allocations": {
                VM.upper(): {"resources": {"VCPU": 2, "PCPU": 1, "MEMORY_MB": 2048}},
                "other": {"resources": {"DISK_GB": 10}},
            }
        },
    ),
    f"/allocations/{VM}": Answer(
        200, {"allocations": {PROVIDER: {"resources": {"VCPU": 2}}}, "project_id": "p1"}
    ),
    SPARE_QUERY: Answer(
        200,
        {
            "allocation_requests": [],
            "provider_summaries": {"a": {"resources": {"VCPU": {"capacity": 8, "used": 3}}}},
        },
    ),
}


def reader(
    answers: dict[str, Answer], kind: type[PlacementReader] = PlacementReader, **kw: Any
) -> tuple[PlacementReader, FakePlacement]:
    fake = FakePlacement(answers)
    made = kind("cloud", timeout_s=2.0, connection_factory=lambda **_: FakeConnection(fake), **kw)
    return made, fake


def test_the_daemons_reads_at_their_microversion() -> None:
    counted: list[int] = []
    placement, fake = reader(ANSWERS, on_call=lambda: counted.append(1))
    assert placement.provider("cmp-1") == PROVIDER
    assert placement.provider("cmp-2") is None
    assert placement.inventories(PROVIDER) == {
        "VCPU": Inventory(16.0, 2.0, 4.0),
        "MEMORY_MB": Inventory(65536.0, 0.0, 1.0),
    }
    assert placement.consumers_on(PROVIDER) == {
        VM: Allocation(3.0, 2048.0),
        "other": Allocation(None, None),
    }
    assert placement.consumer(VM) == Consumer(frozenset({PROVIDER}), "p1")
    assert {version for _, version in fake.asked} == {MICROVERSION}
    assert placement.calls == len(counted) == 5


def test_the_brokers_spare_vcpus_from_the_allocation_candidates() -> None:
    placement, fake = reader(ANSWERS)
    assert placement.spare_vcpus() == 5.0
    assert fake.asked == [(SPARE_QUERY, CANDIDATES_MICROVERSION)]


def test_spare_is_capacity_less_use_over_the_providers() -> None:
    body = {
        "allocation_requests": [],
        "provider_summaries": {
            "a": {"resources": {"VCPU": {"capacity": 8, "used": 3}}},
            "b": {"resources": {"VCPU": {"capacity": 4, "used": 6}}},  # overcommitted
            "c": {"resources": {"MEMORY_MB": {"capacity": 1024, "used": 0}}},
        },
    }
    assert spare_of(body) == 5.0


def test_a_malformed_answer_is_one_error_naming_the_read() -> None:
    placement, _ = reader({f"/allocations/{VM}": Answer(200, {"allocations": []})})
    with pytest.raises(OpenStackError) as caught:
        placement.consumer(VM)
    assert caught.value.kind == OpenStackErrorKind.error
    assert str(caught.value).startswith(f"read of the Placement view of consumer {VM} on cloud")
    assert "no object 'allocations'" in str(caught.value)


def test_placement_not_answering_is_not_asked_again_for_the_pause() -> None:
    clock = Clock()
    down = {"/resource_providers?name=cmp-1": Answer(503, {"message": "down"})}
    placement, fake = reader(down, pause_s=30.0, pause_named="[placement] miss_s", clock=clock)
    with pytest.raises(OpenStackError) as first:
        placement.provider("cmp-1")
    assert (first.value.kind, first.value.status, first.value.retryable) == (
        OpenStackErrorKind.unavailable,
        503,
        True,
    )
    clock.now += 29.0
    with pytest.raises(OpenStackError) as paused:
        placement.provider("cmp-1")
    assert paused.value.kind == OpenStackErrorKind.unavailable
    assert "not asked again for [placement] miss_s after it failed" in str(paused.value)
    assert len(fake.asked) == 1
    clock.now += 1.0
    with pytest.raises(OpenStackError):
        placement.provider("cmp-1")
    assert len(fake.asked) == 2


def test_a_refusal_does_not_pause() -> None:
    refused = {"/resource_providers?name=cmp-1": Answer(403, {"message": "policy"})}
    placement, fake = reader(refused, pause_s=30.0)
    for _ in range(2):
        with pytest.raises(OpenStackError) as caught:
            placement.provider("cmp-1")
        assert caught.value.kind == OpenStackErrorKind.forbidden
        assert "reading providers and allocations needs an admin" in str(caught.value)
    assert len(fake.asked) == 2


def test_the_brokers_reader_says_its_own_words() -> None:
    refused = {SPARE_QUERY: Answer(403, {"message": "policy"})}
    placement, _ = reader(refused, PlacementSpare)
    with pytest.raises(OpenStackError) as caught:
        placement.spare_vcpus()
    message = str(caught.value)
    assert message.startswith("read of the spare VCPU in Placement of every compute host")
    assert "broker.openstack.placement_cloud (HTTP 403): policy" in message
