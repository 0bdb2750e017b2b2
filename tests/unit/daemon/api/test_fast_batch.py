"""The fast reader of sample batches never accepts what the contract refuses, and reads what it
accepts as the contract does: a property test of :mod:`gmd.daemon.ingest.fast_parse` against
:class:`gmd.wire.SampleBatch` (pydantic), on valid batches and on hostile changes of them."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pydantic import ValidationError

from gmd.daemon.ingest import fast_parse
from gmd.daemon.ingest.parse import parse_record, record_of
from gmd.daemon.ingest.record import BatchRecord
from gmd.wire import SampleBatch

UUIDS = [f"{i:08x}-abcd-4000-8000-{i:012x}" for i in range(8)]
NAMES = ["acme", "proj-1", "Ünïcode Ltd", "a" * 255, "x y"]
USAGE = [
    "cpu_s",
    "memory_byte_s",
    "disk_read_bytes",
    "disk_write_bytes",
    "network_rx_bytes",
    "network_tx_bytes",
]
FLAVOR = ["vcpus", "memory_bytes", "disk_bytes_per_s", "network_bytes_per_s"]

amounts = st.one_of(
    st.floats(min_value=0, max_value=1e12, allow_nan=False),
    st.integers(min_value=0, max_value=2**53),
    st.sampled_from([0, 0.0, -0.0, 1e308, 5e-324]),
)
positives = st.one_of(
    st.floats(min_value=1e-9, max_value=1e15), st.integers(min_value=1, max_value=2**40)
)


@st.composite
def valid_batches(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 5))
    uuids = draw(st.permutations(UUIDS))[:n]
    vms = []
    for uuid in uuids:
        vm: dict[str, Any] = {"uuid": uuid, "customer": draw(st.sampled_from(NAMES))}
        vm.update({f: draw(amounts) for f in USAGE})
        if draw(st.booleans()):
            keys = draw(st.lists(st.sampled_from(FLAVOR), unique=True))
            vm["flavor"] = {k: draw(st.one_of(st.none(), positives)) for k in keys}
        if draw(st.booleans()):
            vm["created_s"] = draw(st.one_of(st.none(), st.integers(0, 2**53 - 1)))
        vms.append(vm)
    batch: dict[str, Any] = {
        "key": draw(st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1)),
        "host": draw(st.sampled_from(NAMES)),
        "interval_start_s": draw(st.integers(0, 2**53 - 1)),
        "interval_s": draw(st.integers(1, 2**53 - 1)),
        "capacity": {f: draw(positives) for f in ("cpu_cores", *FLAVOR[1:])},
        "vms": vms,
    }
    owners = sorted({vm["customer"] for vm in vms})
    if owners and draw(st.booleans()):
        named = draw(st.lists(st.sampled_from(owners), unique=True))
        batch["customer_names"] = {c: draw(st.sampled_from(NAMES)) for c in named}
    if draw(st.booleans()):
        batch["host_cpu_s"] = draw(st.one_of(st.none(), amounts))
    return batch


HOSTILE = [
    None,
    True,
    False,
    "5",
    "",
    " acme",
    "acme\n",
    "ac\u202eme",
    "a\u200bb",
    "a" * 256,
    -1,
    -0.0,
    0,
    1.5,
    2**53,
    2**64,
    10**30,
    1e308,
    [],
    {},
    {"cpu_s": 1},
    UUIDS[0].upper(),
    UUIDS[0] + "\n",
    "{" + UUIDS[0] + "}",
]


def paths(document: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in ``document`` a value sits, as a path of keys and indexes."""
    found = [here]
    if isinstance(document, dict):
        for key, value in document.items():
            found += paths(value, (*here, key))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            found += paths(value, (*here, i))
    return found


@st.composite
def hostile_batches(draw: st.DrawFn) -> bytes:
    document = draw(valid_batches())
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(document)[1:] or [()]))
        if not path:
            break
        *parent_path, last = path
        parent = document
        for step in parent_path:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        # Copies: a later step may add to a hostile {} placed here, which must not change
        # HOSTILE itself (hypothesis then sees the strategy draw differently each time).
        if action == "replace":
            parent[last] = copy.deepcopy(draw(st.sampled_from(HOSTILE + NAMES)))
        elif action == "delete" and isinstance(parent, dict):
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "uuid", "cpu_s", "vcpus"]))] = copy.deepcopy(
                draw(st.sampled_from(HOSTILE))
            )
    if document.get("vms") and isinstance(document["vms"], list) and draw(st.booleans()):
        # A VM changes hands: customer_names may now name a customer of no VM.
        vm = draw(st.sampled_from(document["vms"]))
        if isinstance(vm, dict):
            vm["customer"] = draw(st.sampled_from(NAMES))
    text = json.dumps(document, allow_nan=True)
    if draw(st.booleans()):
        # The same key twice in one object: both readers must keep the same one.
        text = text.replace('"host": ', '"host": "other", "host": ', 1)
    return text.encode()


def same_record(fast: BatchRecord, slow: BatchRecord) -> None:
    assert fast.digest == slow.digest
    for name in ("key", "host", "interval_start_s", "interval_s", "vm_uuids", "customers"):
        assert getattr(fast, name) == getattr(slow, name), name
    assert fast.created_s == slow.created_s
    assert fast.customer_names == slow.customer_names
    assert fast.host_cpu_s == slow.host_cpu_s and type(fast.host_cpu_s) is type(slow.host_cpu_s)
    assert [type(c) for c in fast.capacity] == [float] * 4
    assert fast.capacity == slow.capacity
    assert fast.use.tobytes() == slow.use.tobytes()
    assert np.array_equal(fast.flavor, slow.flavor, equal_nan=True)


def contract_record(body: bytes) -> BatchRecord | None:
    try:
        return record_of(SampleBatch.model_validate_json(body))
    except ValidationError:
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_batches())
def test_every_valid_batch_is_read_fast_and_alike(document: dict[str, Any]) -> None:
    body = json.dumps(document).encode()
    slow = contract_record(body)
    assert slow is not None, "the generator made a batch the contract refuses"
    assert fast_parse.accept(body) is not None
    same_record(parse_record(body), slow)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_batches())
def test_the_fast_reader_never_accepts_what_the_contract_refuses(body: bytes) -> None:
    if fast_parse.accept(body) is None:
        return
    slow = contract_record(body)
    assert slow is not None, f"fast accepted what pydantic refuses: {body[:300]!r}"
    same_record(parse_record(body), slow)


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b["vms"][0].update(extra=1),
        lambda b: b["vms"][0].update(flavor=None),
        lambda b: b["vms"][0].update(flavor={"vcpus": 2, "gpus": 1}),
        lambda b: b["vms"][0].update(uuid=UUIDS[0].upper()),
        lambda b: b["vms"][0].update(uuid=UUIDS[0] + "\n"),
        lambda b: b["vms"][0].update(cpu_s=-1),
        lambda b: b["vms"][0].update(cpu_s=True),
        lambda b: b["vms"][0].update(cpu_s="5"),
        lambda b: b["vms"][0].update(created_s=5.0),
        lambda b: b["vms"][0].update(customer="ac\u202eme"),
        lambda b: b.update(key="k\n"),
        lambda b: b.update(key="k" * 129),
        lambda b: b.update(host=" cmp-1"),
        lambda b: b.update(interval_s=0),
        lambda b: b.update(customer_names={"stranger": "S"}),
        lambda b: b["capacity"].update(cpu_cores=0),
    ],
)
def test_each_rule_of_the_contract_sends_the_body_to_pydantic(change: Any) -> None:
    """Each is refused by the contract; the fast reader must leave every one to it."""
    document = {
        "key": "k1",
        "host": "cmp-1",
        "interval_start_s": 600,
        "interval_s": 60,
        "capacity": {
            "cpu_cores": 4,
            "memory_bytes": 8e9,
            "disk_bytes_per_s": 1e8,
            "network_bytes_per_s": 1e8,
        },
        "vms": [{"uuid": UUIDS[0], "customer": "acme", **dict.fromkeys(USAGE, 1.0)}],
    }
    assert fast_parse.accept(json.dumps(document).encode()) is not None
    change(document)
    body = json.dumps(document).encode()
    assert fast_parse.accept(body) is None
    assert contract_record(body) is None


def test_numbers_beyond_a_double_and_non_json_literals_are_left_to_pydantic() -> None:
    base = (
        '{"key": "k", "host": "h", "interval_start_s": 0, "interval_s": 60, "capacity": '
        '{"cpu_cores": 4, "memory_bytes": 1, "disk_bytes_per_s": 1, "network_bytes_per_s": 1},'
        ' "vms": [{"uuid": "%s", "customer": "c", "cpu_s": %s, "memory_byte_s": 0,'
        ' "disk_read_bytes": 0, "disk_write_bytes": 0, "network_rx_bytes": 0,'
        ' "network_tx_bytes": 0}]}'
    )
    assert fast_parse.accept((base % (UUIDS[0], "1")).encode()) is not None
    for number in ("1e400", "NaN", "Infinity", "-Infinity", "-1e400"):
        body = (base % (UUIDS[0], number)).encode()
        assert fast_parse.accept(body) is None, number
        assert contract_record(body) is None, number
