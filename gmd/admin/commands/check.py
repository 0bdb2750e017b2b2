"""``gmd-admin check``: the configuration, and every service it names, checked before a restart.

One line per thing checked, ``ok`` or ``FAIL`` and why, as ``nginx -t`` and ``named-checkconf``
answer: the file (as gmd-daemon would read it, and its ``[agent]`` as gmd-agent would), the
ledger's database and its schema, its read replica, and where a cloud is configured, the
clouds.yaml entries of Placement and of the quotas (each authenticated against Keystone and
asked one read), and the read API's Keystone. Nothing is written anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gmd.admin.common import options, shown_url, sqlite_file
from gmd.common.cli import ExitCode, fail
from gmd.common.config import ConfigError, read_document

if TYPE_CHECKING:
    from gmd.daemon.config import Config

# What reads the configuration and the ledger is imported by the check that runs
# (gmd.admin.common says why).


@dataclass(frozen=True)
class Finding:
    """One thing checked: what, and None when it is fine, else why not."""

    what: str
    problem: str | None
    detail: str = ""


def _database(what: str, url: str, schema: bool) -> Finding:
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    from gmd.ledger_schema import migrate

    file = sqlite_file(url)
    if file is not None and not file.exists():
        # Not made here: a check writes nothing.
        return Finding(what, None, f"{file} is not there yet: gmd-daemon creates it")
    try:
        engine = migrate.engine_for(url)
    except (SQLAlchemyError, OSError) as exc:
        return Finding(what, f"{shown_url(url)}: {exc}")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        if not schema:
            return Finding(what, None, shown_url(url))
        revision, head = migrate.current(engine), migrate.SCHEMA
    except (SQLAlchemyError, OSError) as exc:
        return Finding(what, f"{shown_url(url)}: {getattr(exc, 'orig', None) or exc}")
    finally:
        engine.dispose()
    if revision is None:
        return Finding(what, None, f"{shown_url(url)}: empty, gmd-daemon creates schema {head}")
    if revision != head:
        return Finding(
            what,
            f"{shown_url(url)} is at schema {revision}, this gmd needs {head}:"
            " run `gmd-admin db upgrade`",
        )
    return Finding(what, None, f"{shown_url(url)} at schema {revision} (the newest)")


def _cloud(what: str, cloud: str, ask: Callable[[Any], object]) -> Finding:
    """The clouds.yaml entry ``cloud``: it exists, authenticates, and ``ask(connection)``
    (one read) is answered."""
    from gmd.openstack.client import describe, entry_problem

    problem = entry_problem(cloud)
    if problem is not None:
        return Finding(what, f"clouds.yaml entry {cloud!r}: {problem}")
    import openstack

    try:
        conn = openstack.connect(cloud=cloud, api_timeout=10)
        try:
            ask(conn)
        finally:
            conn.close()
    except Exception as exc:  # openstacksdk and keystoneauth raise many kinds
        return Finding(what, f"cloud {cloud!r}: {describe(exc)}")
    return Finding(what, None, f"cloud {cloud!r}")


def _placement(conn: Any) -> None:
    """The read the daemon's Placement view makes first (a provider by name), at its
    microversion."""
    from gmd.openstack.placement import MICROVERSION

    answer = conn.placement.get("/resource_providers?name=gmd-check", microversion=MICROVERSION)
    answer.raise_for_status()


def _quotas(conn: Any) -> None:
    conn.authorize()
    answer = conn.compute.get("/")
    answer.raise_for_status()


def _keystone(options: dict[str, str]) -> Finding:
    import httpx

    url = options.get("www_authenticate_uri") or options.get("auth_url", "")
    what = "read API's Keystone"
    try:
        answer = httpx.get(url, timeout=10)
    except httpx.HTTPError as exc:
        return Finding(what, f"{url}: {type(exc).__name__}: {exc}")
    if answer.status_code >= 400:
        return Finding(what, f"{url}: HTTP {answer.status_code}")
    return Finding(what, None, url)


def findings(config: Config, document: dict[str, Any], source: str) -> list[Finding]:
    """Everything ``config`` names, checked in order."""
    out = [Finding("configuration", None, source)]
    if "agent" in document:
        from gmd.agent.config import parse_agent

        try:
            parse_agent(document, source, config.path)
            out.append(Finding("[agent]", None, "as gmd-agent reads it"))
        except ConfigError as exc:
            out.append(Finding("[agent]", str(exc)))
    out.append(_database("ledger database", config.database_url, schema=True))
    if config.read_url:
        out.append(_database("read replica", config.read_url, schema=False))
    placement = config.placement
    if placement.on:
        out.append(_cloud("Placement", placement.cloud, _placement))
    elif placement.trusting_a_cloud:
        out.append(
            Finding(
                "Placement",
                None,
                f'verify = "off" although cloud {placement.cloud!r} is configured: hosts\''
                " claims are trusted",
            )
        )
    quota = config.enforcement.quota
    if quota.cloud:
        out.append(_cloud("quotas", quota.cloud, _quotas))
        if quota.limits_cloud and quota.limits_cloud != quota.cloud:
            out.append(_cloud("Keystone limits", quota.limits_cloud, lambda c: c.authorize()))
    if config.read_api.auth == "keystone":
        out.append(_keystone(config.read_api.keystone))
    return out


def check_command(
    ctx: typer.Context,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only what fails.")] = False,
) -> None:
    """Check the configuration and every service it names, before a restart: the file as
    gmd-daemon reads it (and its [agent] as gmd-agent does), the ledger's database and
    schema, its read replica, Placement and the quota clouds (authenticated, one read each),
    the read API's Keystone. One line each: ok, or FAIL and why. Writes nothing.

    Exit codes: 0 everything ok, 1 something named cannot be reached or used, 2 the
    configuration itself is refused (one line on stderr says where, as gmd-daemon would).
    """
    from gmd.daemon.config import parse

    where = options(ctx).config
    try:
        document, source, path = read_document(where)
        config = parse(document, source, path)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    failed = False
    for found in findings(config, document, source):
        if found.problem is None:
            if not quiet:
                print(f"ok   {found.what}: {found.detail}")
        else:
            failed = True
            print(f"FAIL {found.what}: {found.problem}")
    if failed:
        raise typer.Exit(ExitCode.UNAVAILABLE)
