"""Lengths of time in seconds, each written once.

The ledger, the reports, the configuration's bounds and the simulator all count in seconds;
a day written as a bare number in seventeen files is a day someone mistypes in the eighteenth.
"""

from __future__ import annotations

MINUTE_S = 60
HOUR_S = 60 * MINUTE_S
DAY_S = 24 * HOUR_S
WEEK_S = 7 * DAY_S
