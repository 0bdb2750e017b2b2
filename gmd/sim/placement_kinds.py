"""The choices of a FALB placement run: how the applications arrive and how ties break.

Plain enums apart from the simulator (:mod:`gmd.sim.placement`, numpy) so that a command line
that only offers them (``gmd-admin simulate-placement``) names them without importing it.
"""

from __future__ import annotations

import enum


class Tie(enum.StrEnum):
    """Which of several equally scored nodes gets the application."""

    lowest = "lowest"
    """the first in the nodes' order (Table 1's numbering)"""
    random = "random"
    """one of them at random (a scheduler that walks its nodes in no fixed order)"""


class FalbScenario(enum.StrEnum):
    """How the applications arrive (the paper's two scenarios)."""

    batch = "batch"
    """all submitted at once, before scheduling starts"""
    stream = "stream"
    """one after another, ``gap_s`` apart (in the :class:`Arrival` order)"""


class Arrival(enum.StrEnum):
    """In what order the stream's applications arrive: the paper says only that tenants
    submit "sequentially", which reads either way."""

    interleaved = "interleaved"
    """the tenants' applications shuffled together at random"""
    sequential = "sequential"
    """tenant after tenant, in Table 3's order: user1's fifty, then user2's, …"""
