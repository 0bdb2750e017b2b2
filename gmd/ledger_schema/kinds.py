"""The ledger's kinds: what a row's state, action, status or name source can be.

Plain enums apart from the tables (:mod:`gmd.ledger_schema.models`), so that what only names a
kind (a command line's choices, a report's filter) does not build SQLAlchemy's mapped classes.
"""

from __future__ import annotations

import enum


class IntervalState(enum.StrEnum):
    open = "open"
    closed = "closed"
    accounted = "accounted"


class BatchState(enum.StrEnum):
    """What became of a batch. ``quarantined``: accounting failed with it and went on without
    it (its samples wait in ``quarantined_samples``); the operator then ``released`` it (its
    samples are back as late ones, which no accounted interval is recomputed from) or
    ``dropped`` it (its samples are deleted; the row stays, so a retry is still a duplicate)."""

    accepted = "accepted"
    quarantined = "quarantined"
    released = "released"
    dropped = "dropped"


class ActionKind(enum.StrEnum):
    """What an ``enforcement_actions`` row records. Stored as its value; the names are the
    values so that any driver's adaptation of an enum gives the same text."""

    level = "level"
    host_apply = "host_apply"
    host_restore = "host_restore"
    quota_lower = "quota_lower"
    quota_restore = "quota_restore"
    reset = "reset"
    batch_quarantine = "batch_quarantine"
    batch_release = "batch_release"
    batch_drop = "batch_drop"


class ActionStatus(enum.StrEnum):
    """How an enforcement action ended; ``would`` is a dry-run decision, nothing changed."""

    ok = "ok"
    would = "would"
    failed = "failed"
    decided = "decided"
    """a level the accountant decided (``dry_run`` says whether it is applied)"""


class NameSource(enum.StrEnum):
    """Where a customer's project name was read (``customers.display_source``). Keystone is
    the authority; the Nova metadata an agent read from a domain only fills in until it
    speaks."""

    keystone = "keystone"
    nova = "nova"
