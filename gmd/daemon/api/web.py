"""The read API's web page: the standings, and each customer's page with its explanation in
plain words, its balance and level plot, and its recent enforcement actions.

Plain server-rendered HTML (no script), from the read API's own answers, under the same
access: the operator's local mode, or a Keystone token in the ``X-Auth-Token`` header or the
``gmd_token`` cookie (a portal that signed the user in can set it). A member sees its own
project only. Every figure the page shows carries its exact value in ``data-value``, so that
what a person reads can be checked against the API.
"""

from __future__ import annotations

import html
import math
from typing import Annotated, Any

from fastapi import APIRouter, Cookie, Depends, Header
from fastapi.responses import HTMLResponse

from gmd.daemon.api import read
from gmd.daemon.api.access import Reader
from gmd.daemon.api.deps import ServicesDep
from gmd.daemon.reports.standings import SortKey

router = APIRouter(prefix="/ui", include_in_schema=False)

STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: 0.5rem 1rem;
       max-width: 60rem; line-height: 1.4; color: #222; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 1.5rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 0.25rem 0.5rem; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; word-break: break-all; }
.level-0 { color: #2a7; } .level-1 { color: #c80; } .level-2, .level-3 { color: #c22; }
img { width: 100%; height: auto; }
ul.summary { padding-left: 1.2rem; }
"""


def web_reader(
    services: ServicesDep,
    x_auth_token: Annotated[str | None, Header()] = None,
    gmd_token: Annotated[str | None, Cookie()] = None,
) -> Reader:
    """The read API's caller, whose token may also come in a cookie (a browser's)."""
    return read.reader(services, x_auth_token or gmd_token)


WebReader = Annotated[Reader, Depends(web_reader)]


def _page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)} · gmd</title><style>{STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )


def _number(key: str, value: Any, digits: int = 4) -> str:
    """A figure as people read it, with its exact value beside."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"<td data-key='{key}'>-</td>"
    shown = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return f"<td data-key='{key}' data-value='{html.escape(repr(value))}'>{shown}</td>"


@router.get("", response_class=HTMLResponse)
def standings_page(who: WebReader, services: ServicesDep) -> HTMLResponse:
    document = read.get_standings(who, services, SortKey.balance, False, False)
    rows = []
    for r in document["customers"]:
        customer = str(r["customer"])
        name = f" ({html.escape(str(r['name']))})" if r.get("name") else ""
        rows.append(
            f"<tr data-customer='{html.escape(customer)}'>"
            f"<td><a href='/ui/customers/{read.segment(customer)}'>"
            f"{html.escape(customer)}</a>{name}</td>"
            + _number("balance", r["balance"])
            + _number("greediness", r["greediness"])
            + f"<td data-key='level' data-value='{r['level']}' class='level-{r['level']}'>"
            f"{r['level']}</td><td>{html.escape(str(r.get('enforced') or ''))}</td></tr>"
        )
    caption = "After the interval starting " + html.escape(str(document.get("as_of") or "-"))
    return _page(
        "Standings",
        f"<h1>Standings</h1><p>{caption}</p><div class='scroll'><table>"
        "<tr><th>Customer</th><th>Balance</th><th>GM (last)</th><th>Level</th>"
        f"<th>Enforced</th></tr>{''.join(rows)}</table></div>",
    )


@router.get("/customers/{customer:path}", response_class=HTMLResponse)
def customer_page(customer: str, who: WebReader, services: ServicesDep) -> HTMLResponse:
    explained = read.get_explanation(customer, who, services, None, None, None)
    uuid = str(explained["customer"])
    log = read.get_enforcement(who, services, uuid, None, None, 20)["actions"]
    balance: dict[str, Any] = explained["balance"]
    level: dict[str, Any] = explained["level"]
    who_name = html.escape(uuid) + (
        f" ({html.escape(str(explained['name']))})" if explained.get("name") else ""
    )
    summary = "".join(f"<li>{html.escape(str(line))}</li>" for line in explained["summary"])
    actions = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(a.get(k) if a.get(k) is not None else ''))}</td>"
            for k in ("at", "kind", "status", "reason")
        )
        + "</tr>"
        for a in reversed(log)
    )
    plot = f"/v1/customers/{read.segment(uuid)}/plot.svg"
    return _page(
        uuid,
        f"<h1>{who_name}</h1>"
        f"<ul class='summary'>{summary}</ul>"
        "<div class='scroll'><table id='standing'><tr><th>Balance</th><th>Level</th>"
        "<th>Mode</th><th>Priority</th></tr><tr>"
        + _number("balance", balance["balance"])
        + f"<td data-key='level' data-value='{level['level']}' class='level-{level['level']}'>"
        f"{level['level']}</td><td>{html.escape(str(level['mode']))}</td>"
        + _number("priority", explained["priority"])
        + "</tr></table></div>"
        f"<h2>Balance and level</h2><img alt='balance, level and use over time' src='{plot}'>"
        "<h2>Recent enforcement actions</h2><div class='scroll'><table id='actions'>"
        "<tr><th>At</th><th>Action</th><th>Status</th><th>Why</th></tr>"
        f"{actions}</table></div>",
    )
