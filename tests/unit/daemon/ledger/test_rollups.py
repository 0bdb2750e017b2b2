"""Hourly and daily rollups, written by accounting, equal what the per-interval rows and the
on-time samples of their period add up to; rolling up again or after the fact gives the same
rows. On SQLite and PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from gmd.daemon.config import Config
from gmd.daemon.ledger import rollups
from gmd.daemon.ledger.accounting import account_due
from gmd.daemon.reports import series
from gmd.daemon.reports.coverage import coverage
from gmd.daemon.reports.usage import GROUPS, report
from tests.support.daemon_support import HostSpec, auth, batch, cpu_only, make_config, serving

HOUR, DAY = 3600, 86400
HOSTS = (
    HostSpec("cmp-1", cpu_cores=4, memory_bytes=16e9, disk_bytes_per_s=1e8),
    HostSpec("cmp-2", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8),
)


def ledger(url: str, interval_s: int, starts: list[int]) -> Config:
    """Two hosts, three customers whose use changes from interval to interval, one late
    batch; every interval accounted that can be."""
    config = make_config(
        url,
        {h.name: "operator" for h in HOSTS},
        accounting={"interval_s": interval_s, "grace_s": 0, "endowment": "equal"},
    )
    with serving(config) as d:

        def post(host: HostSpec, start: int, vms: list[dict[str, Any]], key: str) -> None:
            body = {**batch(host, start, vms, key=key), "interval_s": interval_s}
            response = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(host.name))
            assert response.is_success, response.text

        for k, start in enumerate(starts):
            share = 0.2 + 0.1 * (k % 5)
            cores = interval_s * HOSTS[0].cpu_cores
            post(
                HOSTS[0],
                start,
                [
                    {**cpu_only("vm-a1", "a", share * cores), "memory_byte_s": 1e9 * interval_s},
                    cpu_only("vm-b1", "b", (0.9 - share) * cores),
                ],
                f"h1-{k}",
            )
            if k % 3 != 2:  # cmp-2 misses some intervals
                vms = [cpu_only("vm-c", "c", 0.5 * interval_s), cpu_only("vm-a2", "a", 100.0)]
                post(HOSTS[1], start, vms, f"h2-{k}")
        account_due(d.engine, config.accounting, now_s=starts[-1] + interval_s)
        post(HOSTS[1], starts[2], [cpu_only("vm-c", "c", 1.0)], "late")
    return config


KEYS = {
    "rollup_periods": ("start_s",),
    "customer_rollups": ("start_s", "customer_id"),
    "customer_resource_rollups": ("start_s", "customer_id", "resource"),
    "host_rollups": ("start_s", "host_id"),
    "organization_rollups": ("start_s", "organization_id"),
}


def table(conn: sa.Connection, name: str, period_s: int) -> dict[tuple[Any, ...], dict]:
    """A rollup table's rows of one period length, by their key."""
    rows = conn.execute(
        sa.text(f"SELECT * FROM {name} WHERE period_s = :p ORDER BY start_s"), {"p": period_s}
    )
    return {tuple(r._mapping[k] for k in KEYS[name]): dict(r._mapping) for r in rows}


def raw_hour(conn: sa.Connection, lo: int, hi: int) -> dict[str, Any]:
    """What the hour's rows add up to, computed here from the rows themselves."""

    def q(sql: str) -> list[Any]:
        return list(conn.execute(sa.text(sql), {"lo": lo, "hi": hi}))

    end = q("SELECT max(id) FROM intervals WHERE id >= :lo AND id < :hi AND ledger_rows > 0")[0][0]
    return {
        "gm": {
            r[0]: (r[1], r[2], r[3])
            for r in q(
                "SELECT customer_id, sum(greediness), count(*), max(vms) FROM customer_ledger"
                " WHERE interval_id >= :lo AND interval_id < :hi GROUP BY customer_id"
            )
        },
        "balance": {
            r[0]: r[1]
            for r in q(
                f"SELECT customer_id, balance FROM customer_ledger WHERE interval_id = {end}"
            )
        },
        "cpu": {
            r[0]: r[1]
            for r in q(
                "SELECT customer_id, sum(cpu_s) FROM samples WHERE interval_id >= :lo"
                " AND interval_id < :hi AND NOT late GROUP BY customer_id"
            )
        },
        "host": {
            r[0]: (r[1], r[2])
            for r in q(
                "SELECT host_id, count(*), sum(memory_byte_s) FROM samples WHERE interval_id >= :lo"
                " AND interval_id < :hi AND NOT late GROUP BY host_id"
            )
        },
        "terms": {
            (r[0], r[1]): r[2]
            for r in q(
                "SELECT customer_id, resource, sum(term) FROM customer_resource_ledger"
                " WHERE interval_id >= :lo AND interval_id < :hi GROUP BY customer_id, resource"
            )
        },
    }


def test_hours_add_up_to_their_intervals(database_url: str) -> None:
    now = int(time.time())
    first = now - now % HOUR - 3 * HOUR
    if (first + 3 * HOUR) // 86400 != first // 86400:
        # Within three hours after midnight UTC the day before would be complete too, and
        # rolled up beside the hours: the hours are taken earlier in that day.
        first -= 4 * HOUR
    starts = [first + 600 * k for k in range(13)]  # two whole hours and one interval more
    config = ledger(database_url, 600, starts)
    engine = sa.create_engine(config.database_url)
    with engine.connect() as conn:
        periods = table(conn, "rollup_periods", HOUR)
        assert list(periods) == [(first,), (first + HOUR,)]  # the third hour is not complete
        assert periods[(first,)]["intervals"] == 6 and periods[(first,)]["seconds"] == HOUR
        customers = table(conn, "customer_rollups", HOUR)
        hosts = table(conn, "host_rollups", HOUR)
        terms = table(conn, "customer_resource_rollups", HOUR)
        ids = dict(conn.execute(sa.text("SELECT name, id FROM customers")).all())
        for lo in (first, first + HOUR):
            want = raw_hour(conn, lo, lo + HOUR)
            for cid, (gm, n, vms) in want["gm"].items():
                row = customers[(lo, cid)]
                assert row["gm_sum"] == pytest.approx(gm, abs=1e-12)
                assert (row["intervals"], row["vms_max"]) == (n, vms)
                assert row["balance_end"] == pytest.approx(want["balance"].get(cid, 0.0))
                assert row["cpu_s"] == pytest.approx(want["cpu"][cid])
            for hid, (samples, memory) in want["host"].items():
                assert hosts[(lo, hid)]["samples"] == samples
                assert hosts[(lo, hid)]["memory_byte_s"] == pytest.approx(memory)
            for (cid, resource), total in want["terms"].items():
                assert terms[(lo, cid, resource)]["term_sum"] == pytest.approx(total, abs=1e-12)
        # cmp-1 ran a's and b's VMs in every interval: 4 cores × 600 s × 6 supplied
        cmp1 = conn.execute(sa.text("SELECT id FROM hosts WHERE name = 'cmp-1'")).scalar_one()
        assert hosts[(first, cmp1)]["cpu_supplied_core_s"] == 4 * 600 * 6
        assert (hosts[(first, cmp1)]["vms_max"], hosts[(first, cmp1)]["customers_max"]) == (2, 2)
        assert customers[(first, ids["a"])]["memory_byte_s"] == pytest.approx(6 * 600e9)
        # The late batch (interval 2) is not in any rollup: c used 0.5 × 600 core-s 4 times.
        assert customers[(first, ids["c"])]["cpu_s"] == pytest.approx(4 * 300.0)
        orgs = table(conn, "organization_rollups", HOUR)
        assert {k[1] for k in orgs} == {
            conn.execute(
                sa.text("SELECT id FROM organizations WHERE name = 'operator'")
            ).scalar_one()
        }
        before = {
            name: table(conn, name, HOUR)
            for name in (
                "rollup_periods",
                "customer_rollups",
                "customer_resource_rollups",
                "host_rollups",
                "organization_rollups",
            )
        }
    # Again, or after the fact: the same rows.
    with engine.begin() as conn:
        rollups.roll_hour(conn, first)
        for name in before:
            conn.execute(sa.text(f"DELETE FROM {name} WHERE start_s = {first + HOUR}"))
    assert rollups.backfill(engine) == 1
    assert rollups.backfill(engine) == 0
    with engine.connect() as conn:
        for name, rows in before.items():
            again = table(conn, name, HOUR)
            assert again.keys() == rows.keys(), name
            for key, row in rows.items():
                for column, value in row.items():
                    got = again[key][column]
                    if isinstance(value, float):
                        assert got == pytest.approx(value, rel=1e-12, abs=1e-15), (name, column)
                    else:
                        assert got == value, (name, key, column)
    engine.dispose()


def test_a_day_adds_up_its_hours(database_url: str) -> None:
    now = int(time.time())
    day = now - now % DAY - 2 * DAY
    starts = [day + 21600 * k for k in range(5)]  # four 6-hour intervals, and the next day's
    config = ledger(database_url, 21600, starts)
    engine = sa.create_engine(config.database_url)
    with engine.connect() as conn:
        days = table(conn, "customer_rollups", DAY)
        hours = table(conn, "customer_rollups", HOUR)
        assert {k[0] for k in days} == {day}
        assert len({k[0] for k in hours}) == 5  # one hour per interval holds it
        for (_, cid), row in days.items():
            mine = [h for (s, c), h in hours.items() if c == cid and day <= s < day + DAY]
            assert row["gm_sum"] == pytest.approx(sum(h["gm_sum"] for h in mine), abs=1e-12)
            assert row["cpu_s"] == pytest.approx(sum(h["cpu_s"] for h in mine))
            assert row["intervals"] == sum(h["intervals"] for h in mine)
            last = max(mine, key=lambda h: h["start_s"])
            assert row["balance_end"] == last["balance_end"]
        period = table(conn, "rollup_periods", DAY)[(day,)]
        assert (period["intervals"], period["seconds"]) == (4, DAY)
        assert period["end_interval_id"] == starts[3]
        host_days = table(conn, "host_rollups", DAY)
        host_hours = table(conn, "host_rollups", HOUR)
        for (_, hid), row in host_days.items():
            mine = [h for (s, h_id), h in host_hours.items() if h_id == hid and s < day + DAY]
            assert row["samples"] == sum(h["samples"] for h in mine)
            assert row["cpu_supplied_core_s"] == sum(h["cpu_supplied_core_s"] for h in mine)
    engine.dispose()


@pytest.mark.parametrize("interval_s", [600, 21600])
def test_reports_read_rollups_and_say_what_the_intervals_say(
    database_url: str, interval_s: int
) -> None:
    """Every report over a range with rolled-up hours (600 s intervals) or days (6 h ones)
    equals the same report read from the per-interval rows alone."""
    now = int(time.time())
    if interval_s == 600:
        first = now - now % HOUR - 3 * HOUR
        starts = [first + 600 * k for k in range(13)]
    else:
        first = now - now % DAY - 2 * DAY
        starts = [first + interval_s * k for k in range(5)]
    config = ledger(database_url, interval_s, starts)
    engine = sa.create_engine(config.database_url)
    # From inside the first period to past the last: ragged ends read per interval.
    lo, hi = first + interval_s, starts[-1] + interval_s

    def reports() -> dict[tuple[str, str | None], list[dict[str, Any]]]:
        with engine.connect() as conn:
            assert coverage(conn, lo, hi).rolled or not rolled_up()
            return {
                (group, who): report(conn, group, lo, hi, customer=who).rows
                for group in GROUPS
                for who in (None, "a")
                if not (group == "organization" and who)
            }

    def rolled_up() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM rollup_periods")).scalar_one())

    with engine.connect() as conn:
        runs = coverage(conn, lo, hi).rolled
    assert runs  # the middle of the range is read from rollups
    with_rollups = reports()
    with engine.begin() as conn:
        for name in KEYS:
            conn.execute(sa.text(f"DELETE FROM {name}"))
    assert rolled_up() == 0
    without = reports()
    for key, rows in without.items():
        assert len(with_rollups[key]) == len(rows), key
        for got, want in zip(with_rollups[key], rows, strict=True):
            assert got.keys() == want.keys()
            for column, value in want.items():
                if isinstance(value, float):
                    assert got[column] == pytest.approx(value, rel=1e-9, abs=1e-12), (key, column)
                else:
                    assert got[column] == value, (key, column)
    engine.dispose()


def test_a_long_plot_reads_hours_where_they_are_rolled_up(database_url: str) -> None:
    now = int(time.time())
    first = now - now % HOUR - 3 * HOUR
    starts = [first + 600 * k for k in range(13)]
    config = ledger(database_url, 600, starts)
    engine = sa.create_engine(config.database_url)
    with engine.connect() as conn:
        line = series.timeline(conn)
        assert len(line) == 13
        short = series.downsampled(conn, line, max_points=4)
        # two rolled-up hours, then the interval of the third hour
        assert list(short.start_s) == [first, first + HOUR, starts[12]]
        assert list(short.length_s) == [HOUR, HOUR, 600]
        assert short.resolution_s == HOUR
        ids = dict(conn.execute(sa.text("SELECT name, id FROM customers")).all())
        fine = series.balances(conn, ids, line)
        coarse = series.balances(conn, ids, short)
        # the hour's point holds the balance after its last interval, and its GM sum
        for name in ids:
            i = fine.row(name)
            assert coarse.balance[i, 0] == pytest.approx(fine.balance[i, 5])
            assert coarse.greediness[i, 1] == pytest.approx(fine.greediness[i, 6:12].sum())
            assert coarse.balance[i, 2] == pytest.approx(fine.balance[i, 12])
        terms = series.resource_terms(conn, ids, short)
        fine_terms = series.resource_terms(conn, ids, line)
        assert terms.terms[:, :, 0] == pytest.approx(fine_terms.terms[:, :, :6].sum(axis=2))
        assert series.top_customers(conn, short, 1) == series.top_customers(conn, line, 1)
        assert series.downsampled(conn, line, max_points=13) is line
    engine.dispose()
