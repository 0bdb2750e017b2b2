"""``gmd-admin hosts``: every host and the knobs its agent can set (docs/enforcement.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from gmd.admin.common import reading
from gmd.admin.output import Listing, Output, View, emit, output_options
from gmd.common.cli import ExitCode, fail

# What reads the ledger is imported by the command that runs (gmd.admin.common says why).


@output_options
def hosts_command(
    ctx: typer.Context,
    host: Annotated[
        str | None, typer.Argument(help="Only this host (its whole probe with -f json).")
    ] = None,
    *,
    out: Output,
) -> None:
    """Every compute host the ledger knows or that told the daemon its knobs: its owner, its
    last batch, its enforcement backend and cgroup layout, its disks' I/O schedulers, and per
    knob (CPU weight, CPU cap, disk weight, disk limit, network limit) whether its agent can
    set it — yes, no (why: the Why not column) or ? (its agent said nothing: older than
    capabilities, or not enforcing). What the plans do where a knob is missing is
    [enforcement] disk_weight_fallback's (docs/enforcement.md).

    Exit codes: 0 shown (also when none), 1 database unavailable, 2 bad option, 3 no such
    host.
    """
    from gmd.daemon.reports.host_knobs import HOST_COLUMNS, hosts

    with reading(ctx) as engine, engine.connect() as conn:
        rows = hosts(conn, host)
    if host is not None and not rows:
        raise fail(
            f"no host {host!r} in the ledger, and none by that name said its knobs",
            ExitCode.NOT_FOUND,
        )
    lacking = sum(1 for r in rows if r["missing"])
    caption = f"{len(rows)} host(s)" + (f", {lacking} missing a knob" if lacking else "")
    view = View(rows, HOST_COLUMNS, title="Hosts", notes=[caption], name="hosts", keep=("host",))
    emit(
        Listing(
            [view],
            lambda views: {
                "hosts": [
                    {**shown, "capabilities": full["capabilities"]}
                    for shown, full in zip(views[0], rows, strict=True)
                ]
            },
        ),
        out,
    )
