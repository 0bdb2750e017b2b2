"""The read API's web page: the standings, and each customer's page with its explanation in
plain words, its balance and level plot, and its recent enforcement actions.

Plain server-rendered HTML (no script), from the read API's own answers, under the same
access: the operator's local mode, or a Keystone token in the ``X-Auth-Token`` header or the
``gmd_token`` cookie (a portal that signed the user in can set it). A member sees its own
project only, and what the read API gives a member of it
(:func:`~gmd.daemon.api.members.for_member`): hosts as Nova's hostId, no host's words.
Every figure the page shows carries its exact value in ``data-value``, so that what a person
reads can be checked against the API.

It is read by customers as much as by operators, on phones too: the log's kinds and statuses
are said in words (with the log's own word in ``data-value``), dry-run rows are marked, every
time is ISO 8601 UTC, the column heads explain themselves (``title``) and a short glossary
ends each page. Tables scroll sideways inside their box rather than squeeze a column to a
letter a line; the plot takes the page's width. The plot is served under ``/ui`` too, with
the page's access, so that a browser signed in with the cookie loads it.
"""

from __future__ import annotations

import html
import math
from typing import Annotated, Any

from fastapi import APIRouter, Cookie, Depends, Header, Query, Request
from fastapi.responses import HTMLResponse, Response

from gmd.daemon.api import read
from gmd.daemon.api.access import ReadCaller
from gmd.daemon.api.deps import ServicesDep
from gmd.daemon.api.errors import Refused
from gmd.daemon.reports.standings_columns import SortKey
from gmd.fairness.policy import LevelEffect, ThrottlePolicy
from gmd.ledger_schema.kinds import ActionStatus
from gmd.wire import PlanMode

router = APIRouter(prefix="/ui", include_in_schema=False)

STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: 0.5rem 1rem;
       max-width: 60rem; line-height: 1.4; color: #222; }
h1 { font-size: 1.4rem; overflow-wrap: anywhere; } h2 { font-size: 1.1rem; margin-top: 1.5rem; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 0.25rem 0.5rem; border-bottom: 1px solid #ddd; text-align: right;
         vertical-align: top; min-width: 4.5rem; }
th { white-space: nowrap; }
th[title] { text-decoration: underline dotted; cursor: help; }
.text { text-align: left; }
.name { min-width: 9rem; overflow-wrap: anywhere; }
.time { white-space: nowrap; }
.words { min-width: 14rem; }
.why { min-width: 18rem; }
.words, .why, ul.summary { overflow-wrap: anywhere; }
tr.dry-run td { color: #555; background: #f6f6f6; }
.mark { font-size: 0.85em; border: 1px solid #999; border-radius: 0.2rem; padding: 0 0.2rem;
        white-space: nowrap; }
.level-0 { color: #2a7; } .level-1 { color: #c80; } .level-2, .level-3 { color: #c22; }
figure.plot { margin: 0; width: 100%; }
figure.plot img { display: block; width: 100%; height: auto; }
ul.summary { padding-left: 1.2rem; }
dl.glossary dt { font-weight: 600; margin-top: 0.4rem; }
dl.glossary dd { margin-left: 1rem; }
.refused { color: #a11; font-weight: 600; }
.keys { font-size: 0.9em; color: #555; }
textarea, input { font: inherit; max-width: 100%; }
"""

# What a reader sees for the log's words (the log's own word stays in data-value).
KIND_WORDS = {
    "level": "Throttle level changed",
    "host_apply": "Limits set on a VM",
    "host_restore": "Limits lifted from a VM",
    "quota_lower": "Quota lowered",
    "quota_restore": "Quota restored",
    "reset": "Balance reset by an operator",
    "batch_quarantine": "Usage report set aside",
    "batch_release": "Usage report counted again",
    "batch_drop": "Usage report dropped",
}
STATUS_WORDS: dict[str, str] = {
    ActionStatus.ok: "done",
    ActionStatus.decided: "decided",
    ActionStatus.would: "would be done",
    ActionStatus.failed: "failed",
}
HEADS = {
    "customer": "The project: its uuid, and its name where gmd knows it",
    "balance": "What it took beyond its fair share, added up over time (fading with age);"
    " positive means it took more than its share",
    "greediness": "Greediness of the latest interval: positive when it took more than its share",
    "level": "Throttle level: 0 is none; each level holds its VMs back more",
    "does": "What its throttle level does to its VMs and quota",
    "enforced": "Whether the level is applied on its hosts now (dry-run: decided, not applied)",
    "mode": "Whether gmd applies levels (on), only records them (dry-run), or is off",
    "priority": "Credit for what its own hosts give the cloud (DirectContr priority): higher"
    " is better; negative when it uses more of others' hosts than it provides",
    "at": "When gmd recorded it (UTC)",
    "action": "What was done",
    "status": "How it ended",
    "why": "Why, in the log's words (a host's report said in gmd's own to a project's members)",
    # the what-if page's columns
    "throttle_hours": "Hours at a level above 0, replayed (recorded in brackets)",
    "max_level": "The highest level reached, replayed (recorded in brackets)",
    "first_action": "The first replayed level change, in force from (UTC)",
    "last_action": "The last replayed level change, in force from (UTC)",
    "differences": "Level changes the replay adds, removes, or makes earlier or later than"
    " recorded (before→after, after the interval starting then)",
}
GLOSSARY = (
    (
        "Fair share",
        "The cloud's capacity divided among the customers running VMs in an interval.",
    ),
    (
        "Greediness (GM)",
        "How much a customer took beyond its share in one interval, counting only what others"
        " on the same hosts needed; negative when it left its share to others.",
    ),
    ("Balance", HEADS["balance"] + "."),
    (
        "Throttle level",
        "Set from the balance: at level 1 and above its VMs get less CPU and disk time when a"
        " host is busy; from a higher level on, hard caps where the host is contended and a"
        " lower quota.",
    ),
    ("Weights", "A VM's share of a busy host's CPU and disk time against the other VMs."),
    ("Cap", "A hard limit on a VM's CPU (a share of its vCPUs) or disk throughput."),
    ("Dry-run", "gmd decides and records levels and limits, but applies none."),
    ("Credit (priority)", HEADS["priority"] + "."),
    (
        "What-if (operators)",
        "The recorded usage replayed under other settings, beside what was recorded; nothing"
        " is changed by asking.",
    ),
)


def web_reader(
    services: ServicesDep,
    x_auth_token: Annotated[str | None, Header()] = None,
    gmd_token: Annotated[str | None, Cookie()] = None,
) -> ReadCaller:
    """The read API's caller, whose token may also come in a cookie (a browser's)."""
    return read.reader(services, x_auth_token or gmd_token)


WebReader = Annotated[ReadCaller, Depends(web_reader)]


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        status_code=status,
        content="<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)} · gmd</title><style>{STYLE}</style></head>"
        f"<body>{body}{_glossary()}</body></html>",
    )


def _glossary() -> str:
    items = "".join(
        f"<dt>{html.escape(term)}</dt><dd>{html.escape(meaning)}</dd>" for term, meaning in GLOSSARY
    )
    return f"<h2>What these words mean</h2><dl class='glossary'>{items}</dl>"


def _head(key: str, label: str, css: str = "") -> str:
    """A column head with its explanation as title text."""
    title = f" title='{html.escape(HEADS[key])}'" if key in HEADS else ""
    cls = f" class='{css}'" if css else ""
    return f"<th{cls}{title}>{html.escape(label)}</th>"


def _number(key: str, value: Any, digits: int = 4) -> str:
    """A figure as people read it, with its exact value beside."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"<td data-key='{key}'>-</td>"
    shown = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return f"<td data-key='{key}' data-value='{html.escape(repr(value))}'>{shown}</td>"


def _word(key: str, value: object, shown: str, css: str = "text") -> str:
    """A cell saying ``value`` (the log's or the API's word, kept in data-value) in words."""
    raw = "" if value is None else str(value)
    return (
        f"<td class='{css}' data-key='{key}' data-value='{html.escape(raw)}'>"
        f"{html.escape(shown)}</td>"
    )


def level_does(effect: LevelEffect, policy: ThrottlePolicy) -> str:
    """What a level does to a customer's VMs and quota, in words, for the standings."""
    if effect.level == 0:
        return "nothing"
    parts = [f"CPU and disk weights × {effect.weight_factor:g} where a host is busy"]
    if effect.cpu_cap_fraction is not None:
        parts.append(
            f"CPU capped at {100 * effect.cpu_cap_fraction:g} % of its vCPUs where a host is"
            " contended"
        )
    if effect.disk_bytes_per_s:
        parts.append(f"disk capped at {effect.disk_bytes_per_s / 1e6:g} MB/s per VM there")
    if effect.quota_steps:
        parts.append(f"quota lowered by {effect.quota_steps} step(s)")
    elif policy.quota_level <= policy.levels:
        parts.append("quota unchanged")
    return "; ".join(parts)


@router.get("", response_class=HTMLResponse)
def standings_page(who: WebReader, services: ServicesDep) -> HTMLResponse:
    document = read.get_standings(who, services, SortKey.balance, False, False)
    policy = services.config.enforcement.policy
    rows = []
    for r in document["customers"]:
        customer = str(r["customer"])
        name = f" ({html.escape(str(r['name']))})" if r.get("name") else ""
        level = int(r["level"])
        enforced = r.get("enforced")
        rows.append(
            f"<tr data-customer='{html.escape(customer)}'>"
            f"<td class='text name'><a href='/ui/customers/{read.segment(customer)}'>"
            f"{html.escape(customer)}</a>{name}</td>"
            + _number("balance", r["balance"])
            + _number("greediness", r["greediness"])
            + f"<td data-key='level' data-value='{level}' class='level-{level}'>{level}</td>"
            + _word("does", level, level_does(policy.effect(level), policy), "text words")
            + _word(
                "enforced",
                enforced,
                str(enforced or "") + (f": {r['enforced_why']}" if r.get("enforced_why") else ""),
                "text words",
            )
            + "</tr>"
        )
    caption = "After the interval starting " + html.escape(str(document.get("as_of") or "-"))
    whatif = (
        "<p><a href='/ui/whatif'>What if the settings were otherwise?</a> Replay the record"
        " under other thresholds, γ, half-life or endowment.</p>"
        if who.everyone
        else ""
    )
    mode = services.config.enforcement.mode
    return _page(
        "Standings",
        f"<h1>Standings</h1><p>{caption} (UTC). Enforcement is"
        f" {html.escape(PlanMode(mode).words)}.</p>{whatif}"
        "<div class='scroll'><table id='standings'><tr>"
        + _head("customer", "Customer", "text")
        + _head("balance", "Balance")
        + _head("greediness", "Last interval")
        + _head("level", "Level")
        + _head("does", "What the level does", "text")
        + _head("enforced", "Enforced", "text")
        + f"</tr>{''.join(rows)}</table></div>",
    )


WHATIF_EXAMPLES = "accounting.gamma=0.3\nenforcement.enter=[1, 3, 6]\nenforcement.leave=[0.5, 2, 5]"


def _whatif_form(from_: str, to: str, changes: list[str]) -> str:
    """The what-if's question: its range and changes, one KEY=VALUE a line."""
    from gmd.daemon.reports.whatif import CHANGEABLE, TABLES

    keys = ", ".join(
        f"{section}.{key}" + (".RESOURCE" if key in TABLES else "")
        for section, names in CHANGEABLE.items()
        for key in names
    )
    return (
        "<form id='whatif-form' method='get' action='/ui/whatif'>"
        "<p><label>From <input name='from' required size='22'"
        f" value='{html.escape(from_)}'></label> "
        f"<label>to <input name='to' size='22' value='{html.escape(to)}'></label></p>"
        "<p><label>Changes, one KEY=VALUE a line, values as in gmd.toml<br>"
        "<textarea name='set' rows='4' cols='48'"
        f" placeholder='{html.escape(WHATIF_EXAMPLES)}'>{html.escape(chr(10).join(changes))}"
        "</textarea></label></p>"
        f"<p class='keys'>What can change: {html.escape(keys)}. Times: ISO 8601 (UTC), now,"
        " now-3d, now-12h, or Unix seconds; only intervals whose raw samples are kept.</p>"
        "<p><button type='submit'>Replay</button></p></form>"
    )


def _whatif_row(r: dict[str, Any]) -> str:
    customer = str(r["customer"])
    name = f" ({html.escape(str(r['name']))})" if r.get("name") else ""
    # One line per kind of difference; the cell's data-value holds them all, "; "-joined.
    lines = [f"{key}: {r[key]}" for key in ("added", "removed", "earlier", "later") if r.get(key)]
    differences = "; ".join(lines)
    level = int(r["max_level"])
    return (
        f"<tr data-customer='{html.escape(customer)}'>"
        f"<td class='text name'>{html.escape(customer)}{name}</td>"
        f"<td data-key='throttle_hours' data-value='{r['throttle_hours']!r}'>"
        f"{r['throttle_hours']:.2f} ({r['recorded_throttle_hours']:.2f})</td>"
        f"<td data-key='max_level' data-value='{level}' class='level-{level}'>"
        f"{level} ({r['recorded_max_level']})</td>"
        + _word("first_action", r["first_action"], str(r["first_action"] or "-"), "text time")
        + _word("last_action", r["last_action"], str(r["last_action"] or "-"), "text time")
        + f"<td class='text why' data-key='differences' data-value='{html.escape(differences)}'>"
        + ("<br>".join(html.escape(line) for line in lines) or "as recorded")
        + "</td>"
        + "</tr>"
    )


@router.get("/whatif", response_class=HTMLResponse)
async def whatif_page(
    request: Request,
    who: WebReader,
    services: ServicesDep,
    from_: Annotated[str | None, Query(alias="from")] = None,
    to: Annotated[str, Query()] = "now",
    changes: Annotated[list[str] | None, Query(alias="set")] = None,
) -> HTMLResponse:
    """The what-if for operators: a form (the range, the changes a line each) and, once asked,
    the replay beside the record, as ``GET /v1/whatif`` answers it. A refusal is shown above
    the form, with the request's own status, in the API's words."""
    sets = [line.strip() for given in changes or [] for line in given.splitlines() if line.strip()]
    head = "<h1>What if the settings were otherwise?</h1>"
    if not who.everyone:
        return _page(
            "What-if",
            head + "<p class='refused'>A what-if replays every customer's record: operators"
            " only.</p>",
            403,
        )
    form = _whatif_form(from_ or "now-1d", to, sets)
    if from_ is None:
        return _page("What-if", head + form)
    try:
        document = await read.whatif_document(request, who, services, from_, to, sets)
    except Refused as exc:
        return _page(
            "What-if",
            f"{head}<p class='refused' role='alert'>{html.escape(exc.detail)}</p>{form}",
            exc.status,
        )
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in document["summary"])
    rows = "".join(_whatif_row(r) for r in document["customers"])
    return _page(
        "What-if",
        f"{head}{form}<h2>Replayed beside recorded</h2><ul class='summary'>{summary}</ul>"
        "<div class='scroll'><table id='whatif'><tr>"
        + _head("customer", "Customer", "text")
        + _head("throttle_hours", "Throttled h")
        + _head("max_level", "Max level")
        + _head("first_action", "First change", "text")
        + _head("last_action", "Last change", "text")
        + _head("differences", "Against the record", "text")
        + f"</tr>{rows}</table></div>",
    )


@router.get("/plot.svg", response_class=Response)
def plot_image(
    who: WebReader,
    services: ServicesDep,
    customer: Annotated[str, Query(description="a project uuid or name")],
) -> Response:
    """The customer's plot for its page, under the page's access (the cookie, too)."""
    return read.get_plot(customer, who, services, "now-7d", "now")


def _action_row(a: dict[str, Any]) -> str:
    """One row of the log in words; a dry-run row is marked (class and text)."""
    dry = bool(a.get("dry_run"))
    kind, status = a.get("kind"), a.get("status")
    status_words = STATUS_WORDS.get(str(status), str(status or ""))
    where = f" on {a['host']}" if a.get("host") else ""
    mark = " <span class='mark'>dry-run: not applied</span>" if dry else ""
    reason = str(a.get("reason") or "")
    return (
        f"<tr class='{'dry-run' if dry else 'applied'}'>"
        f"<td class='text time' data-key='at'>{html.escape(str(a.get('at') or ''))}</td>"
        f"<td class='text words' data-key='kind' data-value='{html.escape(str(kind))}'>"
        f"{html.escape(KIND_WORDS.get(str(kind), str(kind)) + where)}</td>"
        f"<td class='text' data-key='status' data-value='{html.escape(str(status))}'>"
        f"{html.escape(status_words)}{mark}</td>"
        f"<td class='text why' data-key='reason'>{html.escape(reason)}</td></tr>"
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
    actions = "".join(_action_row(a) for a in reversed(log))
    plot = f"/ui/plot.svg?customer={read.segment(uuid)}"
    mode = str(level["mode"])
    return _page(
        uuid,
        f"<h1>{who_name}</h1>"
        f"<ul class='summary'>{summary}</ul>"
        "<div class='scroll'><table id='standing'><tr>"
        + _head("balance", "Balance")
        + _head("level", "Level")
        + _head("mode", "Enforcement", "text")
        + _head("priority", "Credit (priority)")
        + "</tr><tr>"
        + _number("balance", balance["balance"])
        + f"<td data-key='level' data-value='{level['level']}' class='level-{level['level']}'>"
        f"{level['level']}</td>"
        + _word("mode", mode, PlanMode(mode).words, "text words")
        + _number("priority", explained["priority"])
        + "</tr></table></div>"
        "<h2>Balance and level over the last 7 days</h2><figure class='plot'>"
        f"<a href='{plot}'><img alt='balance, level and use over time' src='{plot}'></a>"
        "</figure><h2>Recent enforcement actions</h2><div class='scroll'><table id='actions'><tr>"
        + _head("at", "At (UTC)", "text")
        + _head("action", "Action", "text")
        + _head("status", "Status", "text")
        + _head("why", "Why", "text")
        + f"</tr>{actions}</table></div>",
    )
