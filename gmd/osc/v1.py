"""``openstack fairness standing list``, ``fairness explain``, ``fairness report``."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote

from cliff import lister, show
from osc_lib import exceptions

from gmd.osc.client import FairnessError

STANDING_COLUMNS = (
    ("customer", "Customer"),
    ("name", "Project"),
    ("balance", "Balance"),
    ("greediness", "GM (last)"),
    ("utility", "Utility"),
    ("priority", "Priority"),
    ("vms", "VMs"),
    ("level", "Level"),
    ("enforced", "Enforced"),
    ("enforced_why", "Why"),
)


def _get(app: Any, path: str, **params: Any) -> Any:
    try:
        return app.client_manager.fairness.get(path, **params)
    except FairnessError as exc:
        raise exceptions.CommandError(str(exc)) from None


def _own_project(app: Any, project: str | None) -> str:
    """``project``, or the project the caller's token is scoped to."""
    if project:
        return project
    own = app.client_manager.auth_ref.project_id
    if not own:
        raise exceptions.CommandError("name a project: this token is not scoped to one")
    return str(own)


class ListStanding(lister.Lister):
    """Where every customer stands (gmd-admin standings): an operator sees the whole cloud,
    a project's member its own project."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument("--sort", default="balance", help="column to sort by (balance)")
        parser.add_argument("--reverse", action="store_true", help="reverse the order")
        parser.add_argument(
            "--all", action="store_true", help="also customers without a standing (zeros)"
        )
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> tuple[Sequence[str], Iterable[Any]]:
        document = _get(
            self.app,
            "/v1/standings",
            sort=parsed_args.sort,
            reverse=str(parsed_args.reverse).lower(),
            all=str(parsed_args.all).lower(),
        )
        keys = [k for k, _ in STANDING_COLUMNS]
        rows = ([r.get(k) for k in keys] for r in document["customers"])
        return [h for _, h in STANDING_COLUMNS], rows


class ShowExplanation(show.ShowOne):
    """Why a project stands where it stands, in plain words (gmd-admin explain); without a
    project, the caller's own."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument("project", nargs="?", help="project uuid or name (default: own)")
        parser.add_argument("--at", help="the interval holding this time (default: latest)")
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> tuple[Sequence[str], Iterable[Any]]:
        project = _own_project(self.app, parsed_args.project)
        doc = _get(self.app, f"/v1/customers/{quote(project, safe='')}/explain", at=parsed_args.at)
        level = doc["level"]
        fields = {
            "customer": doc["customer"],
            "name": doc["name"],
            "interval": doc["interval"]["start"],
            "greediness": doc["greediness"],
            "balance": doc["balance"]["balance"],
            "priority": doc["priority"],
            "level": level["level"],
            "mode": level["mode"],
            "summary": "\n".join(doc["summary"]),
        }
        return tuple(fields), tuple(fields.values())


class ListReport(lister.Lister):
    """A project's use and standing over a range (gmd-admin report --customer); without a
    project, the caller's own."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument("project", nargs="?", help="project uuid or name (default: own)")
        parser.add_argument("--from", dest="from_", default="now-7d", help="start (now-7d)")
        parser.add_argument("--to", default="now", help="end, exclusive (now)")
        parser.add_argument(
            "--group-by", default="day", choices=("day", "week", "host", "resource")
        )
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> tuple[Sequence[str], Iterable[Any]]:
        project = _own_project(self.app, parsed_args.project)
        doc = _get(
            self.app,
            f"/v1/customers/{quote(project, safe='')}/report",
            to=parsed_args.to,
            group_by=parsed_args.group_by,
            **{"from": parsed_args.from_},
        )
        rows = doc["rows"]
        columns = list(rows[0]) if rows else []
        return columns, ([r.get(c) for c in columns] for r in rows)
