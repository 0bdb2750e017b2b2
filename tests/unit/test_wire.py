"""RESOURCES in gmd.wire is the one list of resources: the models, the agent's usage and
capacity, the ledger's columns and accounting must all agree with it, field for field."""

from __future__ import annotations

import typing

import numpy as np

from gmd.agent.collect.capacity import HostCapacity
from gmd.agent.collect.counters import UsageAmounts
from gmd.daemon.config import AccountingConfig
from gmd.daemon.ledger.interval_samples import supply_and_flavor, use_amounts
from gmd.ledger_schema.kinds import ActionKind
from gmd.ledger_schema.models import FLAVOR_COLUMNS, USE_COLUMNS
from gmd.ledger_schema.tables import host_intervals, samples
from gmd.wire import (
    CAPACITY_FIELDS,
    FLAVOR_FIELDS,
    RESOURCES,
    RESOURCES_COMBINED,
    RESOURCES_SPLIT,
    USAGE_FIELDS,
    Capacity,
    Flavor,
    VmUsage,
)


def test_the_models_carry_exactly_the_resources_fields() -> None:
    assert tuple(Capacity.model_fields) == CAPACITY_FIELDS
    assert tuple(typing.get_type_hints(Flavor)) == FLAVOR_FIELDS
    usage_keys = [k for k in typing.get_type_hints(VmUsage) if k in set(USAGE_FIELDS)]
    assert tuple(usage_keys) == USAGE_FIELDS
    assert set(typing.get_type_hints(VmUsage)) - set(USAGE_FIELDS) == {
        "uuid",
        "customer",
        "flavor",
        "created_s",
    }


def test_the_agent_and_the_ledger_use_the_same_fields_in_the_same_order() -> None:
    assert tuple(UsageAmounts.of(**dict.fromkeys(USAGE_FIELDS, 1.0)).as_wire()) == USAGE_FIELDS
    assert (
        tuple(HostCapacity.of(**dict.fromkeys(CAPACITY_FIELDS, 1.0)).as_wire()) == CAPACITY_FIELDS
    )
    assert USE_COLUMNS == USAGE_FIELDS
    assert {*USE_COLUMNS, *FLAVOR_COLUMNS} <= set(samples.c.keys())
    assert set(CAPACITY_FIELDS) <= set(host_intervals.c.keys())
    u = UsageAmounts(*range(1, len(USAGE_FIELDS) + 1))
    assert u.as_wire() == dict(zip(USAGE_FIELDS, map(float, range(1, 7)), strict=True))


def test_accounting_combines_and_splits_by_the_table() -> None:
    raw = np.arange(1.0, 1.0 + 2 * len(USAGE_FIELDS)).reshape(2, len(USAGE_FIELDS))
    combined = use_amounts(AccountingConfig(split_io=False), raw)
    assert combined.shape == (2, len(RESOURCES_COMBINED))
    start = 0
    for k, r in enumerate(RESOURCES):
        width = len(r.batch_fields)
        np.testing.assert_array_equal(combined[:, k], raw[:, start : start + width].sum(axis=1))
        start += width
    assert use_amounts(AccountingConfig(split_io=True), raw) is raw

    capacity = np.arange(1.0, 1.0 + len(CAPACITY_FIELDS))[None, :]
    supply, _ = supply_and_flavor(AccountingConfig(split_io=True), capacity, capacity, 10)
    expected = [10.0 * (k + 1) for k, r in enumerate(RESOURCES) for _ in r.split_names]
    assert supply[0].tolist() == expected and len(expected) == len(RESOURCES_SPLIT)


def test_action_kinds_are_stored_as_their_names() -> None:
    assert all(kind.name == kind.value for kind in ActionKind)
