"""The read API (issue 18): gmd-admin's answers over HTTP, and who may read which.

The documents are compared with what ``gmd-admin … --format json`` prints from the same ledger
(one query behind both). Authorization runs against the real Keystone of tests/scripts/openstack.sh:
its tokens are validated by keystonemiddleware and judged by the oslo.policy defaults; the
ledger's customers are the cloud's projects acme and initech, each with one VM on one host.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gmd.common.config import ConfigError
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from tests.support.daemon_support import (
    GMD_ADMIN,
    INTERVAL_S,
    HostSpec,
    aligned_past,
    as_uuid,
    auth,
    batch,
    cpu_only,
    gmd_admin,
    make_config,
    serving,
)

pytest_plugins = ("tests.support.openstack_support",)


def get(url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.get`` with room for a busy machine: a report or a plot took more than httpx's
    5 s at a load average of 16."""
    return httpx.get(url, timeout=120, **kwargs)


HOST = HostSpec("cmp-1", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
INTERVALS = 4


@contextmanager
def seeded(config: Any, customers: tuple[str, str]) -> Iterator[Any]:
    """A daemon whose ledger holds INTERVALS accounted intervals: ``customers[0]``'s VM used
    three quarters of the host's CPU, ``customers[1]``'s a quarter."""
    greedy, modest = customers
    with serving(config) as d:
        for k in range(INTERVALS, 0, -1):
            vms = [
                cpu_only(f"vm-{greedy}", greedy, 90.0, vcpus=2),
                cpu_only(f"vm-{modest}", modest, 30.0, vcpus=2),
            ]
            body = batch(HOST, aligned_past(k + 1), vms, key=f"seed-{k}")
            response = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name))
            assert response.status_code == 200, response.text
        account_due(d.engine, config.accounting, after=after_interval(config.enforcement))
        yield d


ACCOUNTING = {"endowment": "equal", "half_life_s": "none"}
# Thresholds the greedy customer crosses in the seed's intervals: the log has its levels.
ENFORCEMENT = {"mode": "dry-run", "enter": [0.2, 0.4, 0.8], "leave": [0.1, 0.3, 0.6], "dwell_s": 0}


def configured(url: str, read_api: dict[str, Any], **daemon: Any) -> Any:
    return make_config(
        url,
        {HOST.name: "operator"},
        accounting=ACCOUNTING,
        enforcement=ENFORCEMENT,
        daemon={"bind": "127.0.0.1", **daemon},
        read_api=read_api,
    )


def admin_config(ledger: Path) -> str:
    """gmd-admin's configuration file for the ledger of :func:`configured` (the same
    sections: :func:`make_config`'s accounting, then this module's). JSON's strings, numbers
    and lists of numbers are TOML's too."""
    sections = {
        "database": {"url": f"sqlite:///{ledger}"},
        "accounting": {"interval_s": INTERVAL_S, "grace_s": 0, **ACCOUNTING},
        "enforcement": ENFORCEMENT,
    }
    return "".join(
        f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items())
        for name, table in sections.items()
    )


def test_the_read_api_answers_what_gmd_admin_prints(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    config_file = tmp_path / "gmd.toml"
    config_file.write_text(admin_config(ledger))
    config = configured(f"sqlite:///{ledger}", {"auth": "local"})
    with seeded(config, ("acme", "initech")) as d:
        standings = get(f"{d.url}/v1/standings").json()
        explained = get(f"{d.url}/v1/customers/acme/explain").json()
        window = {"from": str(int(time.time()) - 86400), "to": str(int(time.time()))}
        report = get(f"{d.url}/v1/customers/acme/report", params=window)
        plot = get(f"{d.url}/v1/customers/acme/plot.svg", params={"from": "now-1d"})
        log = get(f"{d.url}/v1/enforcement").json()
    assert standings == gmd_admin(config_file, "standings")
    assert [r["customer"] for r in standings["customers"]] == ["acme", "initech"]
    assert standings["customers"][0]["balance"] > 0 > standings["customers"][1]["balance"]
    assert explained == gmd_admin(config_file, "explain", "acme")
    assert explained["summary"] and explained["customer"] == "acme"
    assert report.status_code == 200, report.text
    same = ("--from", window["from"], "--to", window["to"])
    expected = gmd_admin(config_file, "report", "--group-by", "day", "--customer", "acme", *same)
    assert report.json() == expected
    assert log == gmd_admin(config_file, "actions")
    assert {row["customer"] for row in log["actions"]} == {"acme"}, log
    assert plot.status_code == 200 and plot.headers["content-type"] == "image/svg+xml"
    assert plot.content.startswith(b"<?xml") and b"<svg" in plot.content


def test_a_plot_names_a_customer_as_its_name_is_written(tmp_path: Path) -> None:
    """A project name with matplotlib's math markup is text on the plot (plot.svg answered
    500: matplotlib parsed the name as mathtext and raised)."""
    import sqlalchemy as sa

    markup = r"$x^$ \frac team"
    config = configured(f"sqlite:///{tmp_path / 'ledger.db'}", {"auth": "local"})
    with seeded(config, ("acme", "initech")) as d:
        with d.engine.begin() as conn:
            conn.execute(sa.text("UPDATE customers SET display_name = :n"), {"n": markup})
        plot = get(f"{d.url}/v1/customers/acme/plot.svg", params={"from": "now-1d"})
    assert plot.status_code == 200, plot.text
    # both customers bear the name now: each is told apart by its uuid's start
    assert f"{markup} (acme) (dry-run)" in plot.text


def test_any_customer_name_opens_its_routes_and_pages(tmp_path: Path) -> None:
    """Names with "/", "%", spaces and letters beyond ASCII: each customer's read routes
    answer for its name quoted or with its "/" as is, and the web page's links open its page
    and its plot (a name with "/" was a 404 everywhere)."""
    import html
    import re
    from urllib.parse import quote, urljoin

    names = ("team/a b", "100% ünï/ß")
    config = configured(f"sqlite:///{tmp_path / 'ledger.db'}", {"auth": "local"})
    with seeded(config, names) as d:
        for name in names:
            for spelled in (quote(name, safe=""), name):
                for route in ("explain", "report", "plot.svg"):
                    answer = get(f"{d.url}/v1/customers/{spelled}/{route}")
                    assert answer.status_code == 200, (spelled, route, answer.text)
                explained = get(f"{d.url}/v1/customers/{spelled}/explain").json()
                assert explained["customer"] == name
        log = get(f"{d.url}/v1/enforcement", params={"customer": names[0]})
        assert log.status_code == 200 and log.json()["actions"]
        standings = get(f"{d.url}/ui")
        links = [
            html.unescape(h) for h in re.findall(r"href='(/ui/customers/[^']*)'", standings.text)
        ]
        assert len(links) == 2
        for link in links:
            page = get(urljoin(f"{d.url}/ui", link))
            assert page.status_code == 200, (link, page.text)
            (src,) = [html.unescape(s) for s in re.findall(r"<img[^>]* src='([^']*)'", page.text)]
            assert get(urljoin(str(page.url), src)).status_code == 200, src
        shown = {
            html.unescape(h)
            for h in re.findall(
                r"<h1>([^<]*)</h1>",
                "".join(get(urljoin(f"{d.url}/ui", link)).text for link in links),
            )
        }
    assert {h.split(" (")[0] for h in shown} == set(names)


def test_every_answer_carries_the_security_headers(tmp_path: Path) -> None:
    """The page, the read routes, the plot, the agents' routes and their refusals (401, 404,
    422) all forbid framing, sniffing, caching and any origin but the daemon's own."""
    config = configured(f"sqlite:///{tmp_path / 'ledger.db'}", {"auth": "local"})
    with seeded(config, ("acme", "initech")) as d:
        answers = {
            "/ui": get(f"{d.url}/ui"),
            "/ui/customers/acme": get(f"{d.url}/ui/customers/acme"),
            "/v1/standings": get(f"{d.url}/v1/standings"),
            "plot.svg": get(f"{d.url}/v1/customers/acme/plot.svg"),
            "unknown customer": get(f"{d.url}/v1/customers/nobody/explain"),
            "unknown customer's page": get(f"{d.url}/ui/customers/nobody"),
            "no such route": get(f"{d.url}/v2/nothing"),
            "bad sort": get(f"{d.url}/v1/standings", params={"sort": "x"}),
            "no host token": get(f"{d.url}/v1/plan/{HOST.name}"),
            "healthz": get(f"{d.url}/healthz"),
        }
    statuses = {what: a.status_code for what, a in answers.items()}
    assert statuses == {
        "/ui": 200,
        "/ui/customers/acme": 200,
        "/v1/standings": 200,
        "plot.svg": 200,
        "unknown customer": 404,
        "unknown customer's page": 404,
        "no such route": 404,
        "bad sort": 422,
        "no host token": 401,
        "healthz": statuses["healthz"],  # whatever the ledger's health, the headers
    }
    for what, answer in answers.items():
        headers = answer.headers
        assert headers["x-content-type-options"] == "nosniff", what
        assert headers["cache-control"] == "no-store", what
        assert headers["x-frame-options"] == "DENY", what
        policy = [p.strip() for p in headers["content-security-policy"].split(";")]
        assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy, what
        assert "img-src 'self'" in policy, what  # the page's plot


def test_a_read_routes_refusal_says_what_was_invalid_in_its_own_words(tmp_path: Path) -> None:
    """A bad parameter of a read route is named as the parameter it is (it was "invalid
    batch: query.sort: …", a batch nobody sent); a batch's refusal keeps its own words."""
    config = configured(f"sqlite:///{tmp_path / 'ledger.db'}", {"auth": "local"})
    with serving(config) as d:
        sort = get(f"{d.url}/v1/standings", params={"sort": "size"})
        limit = get(f"{d.url}/v1/enforcement", params={"limit": "0"})
        group = get(f"{d.url}/v1/customers/acme/report", params={"group_by": "month"})
        ingest = httpx.post(f"{d.url}/v1/samples", json={"key": 1}, headers=auth(HOST.name))
    for answer in (sort, limit, group):
        assert answer.status_code == 422, answer.text
        assert "batch" not in answer.text, answer.text
    assert sort.json()["detail"].startswith("invalid request: query parameter sort: Input should")
    assert '(got "size")' in sort.json()["detail"]
    assert limit.json()["errors"] == [
        'query parameter limit: Input should be greater than or equal to 1 (got "0")'
    ]
    assert group.json()["detail"].startswith("invalid request: query parameter group_by:")
    assert ingest.status_code == 422 and ingest.json()["detail"].startswith("invalid batch: ")


def test_the_read_api_is_off_unless_configured(tmp_path: Path) -> None:
    config = make_config(f"sqlite:///{tmp_path / 'ledger.db'}", {HOST.name: "operator"})
    with serving(config) as d:
        assert get(f"{d.url}/v1/standings").status_code == 404
        assert "/v1/standings" not in get(f"{d.url}/openapi.json").json()["paths"]


def test_local_mode_is_refused_on_a_daemon_others_can_reach(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"read_api\.auth.*bind the daemon to 127\.0\.0\.1"):
        configured("sqlite://", {"auth": "local"}, bind="0.0.0.0")
    with pytest.raises(ConfigError, match=r"read_api\.keystone\.www_authenticate_uri"):
        configured("sqlite://", {"auth": "keystone"})


# --- against the real Keystone ---------------------------------------------------------------


def keystone_token(info: dict[str, Any], user: str, **scope: str) -> str:
    from keystoneauth1 import session
    from keystoneauth1.identity import v3

    plugin = v3.Password(
        auth_url=info["keystone_url"],
        username=user,
        password=info["password"],
        user_domain_name="Default",
        **scope,
    )
    return str(session.Session(auth=plugin).get_token())


def member_of(info: dict[str, Any], project: str) -> str:
    return keystone_token(
        info, f"{project}-member", project_name=project, project_domain_name="Default"
    )


@pytest.fixture
def keystone_daemon(tmp_path: Path, real_cloud: Any) -> Iterator[tuple[Any, dict[str, Any]]]:
    info = real_cloud.info
    options = {
        "www_authenticate_uri": info["keystone_url"],
        "auth_url": info["keystone_url"],
        "auth_type": "password",
        "username": "gmd",
        "password": info["password"],
        "user_domain_name": "Default",
        "project_name": "admin",
        "project_domain_name": "Default",
    }
    read_api = {"auth": "keystone", "keystone": options, "admin_project_id": info["admin_project"]}
    ledger = tmp_path / "ledger.db"
    config = configured(f"sqlite:///{ledger}", read_api)
    (tmp_path / "gmd.toml").write_text(admin_config(ledger))
    projects = (info["projects"]["acme"], info["projects"]["initech"])
    with seeded(config, projects) as d:
        yield d, info


def test_an_operator_token_reads_every_customer(keystone_daemon: Any) -> None:
    d, info = keystone_daemon
    for token in (
        keystone_token(info, "admin", system_scope="all"),
        keystone_token(info, "gmd", project_name="admin", project_domain_name="Default"),
    ):
        standings = get(f"{d.url}/v1/standings", headers={"X-Auth-Token": token})
        assert standings.status_code == 200, standings.text
        customers = {r["customer"] for r in standings.json()["customers"]}
        assert customers == {info["projects"]["acme"], info["projects"]["initech"]}
        for project in ("acme", "initech"):
            url = f"{d.url}/v1/customers/{info['projects'][project]}/explain"
            assert get(url, headers={"X-Auth-Token": token}).status_code == 200
        whatif = get(
            f"{d.url}/v1/whatif", params={"from": "2000-01-01"}, headers={"X-Auth-Token": token}
        )
        assert whatif.status_code == 200, whatif.text
        assert whatif.json()["indicators"]["intervals"] > 0


def test_a_member_reads_its_own_project_and_nothing_of_another(keystone_daemon: Any) -> None:
    d, info = keystone_daemon
    acme, initech = info["projects"]["acme"], info["projects"]["initech"]
    headers = {"X-Auth-Token": member_of(info, "acme")}
    standings = get(f"{d.url}/v1/standings", headers=headers).json()
    assert [r["customer"] for r in standings["customers"]] == [acme]
    own = get(f"{d.url}/v1/customers/{acme}/explain", headers=headers)
    assert own.status_code == 200, own.text
    # A name the ledger does not know (the batches named no project): 403 like any other
    # customer not the caller's, never a 404 that would tell what exists.
    assert get(f"{d.url}/v1/customers/acme/explain", headers=headers).status_code == 403
    body = own.text
    for secret in (initech, "initech", as_uuid(f"vm-{initech}")):
        assert secret not in body, f"{secret} in a member's explanation"
    assert as_uuid(f"vm-{acme}") in body
    log = get(f"{d.url}/v1/enforcement", headers=headers).json()["actions"]
    assert log and {row["customer"] for row in log} == {acme}, log
    assert initech not in json.dumps(log)
    other_log = get(f"{d.url}/v1/enforcement", params={"customer": initech}, headers=headers)
    assert other_log.status_code == 403
    # The federation's figures are clouds', not a project's: operators' only.
    for path in ("federation", "federation/events"):
        refused = get(f"{d.url}/v1/{path}", headers=headers)
        assert refused.status_code == 403 and "operators'" in refused.text, refused.text
    for path in ("explain", "report", "plot.svg"):
        other = get(f"{d.url}/v1/customers/{initech}/{path}", headers=headers)
        assert other.status_code == 403, (path, other.text)
        assert initech not in json.dumps(other.json()["errors"])
    # Whether a project exists is none of a member's business either.
    missing = get(f"{d.url}/v1/customers/{'0' * 32}/explain", headers=headers)
    assert missing.status_code == 403
    # A what-if replays every customer's record: operators only.
    whatif = get(f"{d.url}/v1/whatif", params={"from": "now-1d"}, headers=headers)
    assert whatif.status_code == 403, whatif.text
    assert "operators only" in whatif.json()["detail"]


def expiring_token(info: dict[str, Any], project: str, seconds: int) -> tuple[str, float]:
    """A member's token that expires in ``seconds``: issued through an application
    credential that expires then (Keystone ends such a token with its credential)."""
    import datetime

    from keystoneauth1 import session
    from keystoneauth1.identity import v3

    member = session.Session(
        auth=v3.Password(
            auth_url=info["keystone_url"],
            username=f"{project}-member",
            password=info["password"],
            user_domain_name="Default",
            project_name=project,
            project_domain_name="Default",
        )
    )
    ends = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
    created = member.post(
        f"{info['keystone_url']}/users/{member.get_user_id()}/application_credentials",
        json={
            "application_credential": {
                "name": f"gmd-test-{time.time()}",
                "expires_at": ends.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        },
    ).json()["application_credential"]
    short = session.Session(
        auth=v3.ApplicationCredential(
            auth_url=info["keystone_url"],
            application_credential_id=created["id"],
            application_credential_secret=created["secret"],
        )
    )
    return str(short.get_token()), ends.timestamp()


def test_an_expired_token_is_401(keystone_daemon: Any) -> None:
    d, info = keystone_daemon
    token, ends = expiring_token(info, "acme", seconds=5)
    while time.time() < ends + 1:
        time.sleep(0.2)
    answer = get(f"{d.url}/v1/standings", headers={"X-Auth-Token": token})
    assert answer.status_code == 401, answer.text


def test_the_web_page_takes_a_members_token_from_its_cookie(keystone_daemon: Any) -> None:
    d, info = keystone_daemon
    acme, initech = info["projects"]["acme"], info["projects"]["initech"]
    cookies = {"gmd_token": member_of(info, "acme")}
    standings = get(f"{d.url}/ui", cookies=cookies)
    assert standings.status_code == 200 and acme in standings.text
    assert initech not in standings.text
    own = get(f"{d.url}/ui/customers/{acme}", cookies=cookies)
    assert own.status_code == 200 and "Recent enforcement actions" in own.text
    assert get(f"{d.url}/ui/customers/{initech}", cookies=cookies).status_code == 403
    assert get(f"{d.url}/ui").status_code == 401
    # A what-if replays every customer: its page is the operators' (no link for a member).
    assert "/ui/whatif" not in standings.text
    whatif = get(f"{d.url}/ui/whatif", params={"from": "now-1h"}, cookies=cookies)
    assert whatif.status_code == 403 and "operators only" in whatif.text
    # the page's plot comes with the page's access: the cookie (it needed the header: 401)
    match = re.search(r"<img[^>]* src='([^']*)'", own.text)
    assert match is not None
    src = f"{d.url}{match.group(1).replace('&amp;', '&')}"
    image = get(src, cookies=cookies)
    assert image.status_code == 200 and image.headers["content-type"] == "image/svg+xml"
    assert get(src).status_code == 401
    other = get(f"{d.url}/ui/plot.svg", params={"customer": initech}, cookies=cookies)
    assert other.status_code == 403
    from tests.support.browser import Browser

    with Browser() as browser:
        browser.set_cookie(d.url, "gmd_token", cookies["gmd_token"])
        browser.open(f"{d.url}/ui/customers/{acme}", **PHONE)
        loaded = browser.evaluate("document.querySelector('figure.plot img').naturalWidth")
    assert loaded > 0, "the plot did not load with the cookie"


def test_no_token_or_a_revoked_one_is_401(keystone_daemon: Any) -> None:
    d, info = keystone_daemon
    anonymous = get(f"{d.url}/v1/standings")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == f'Keystone uri="{info["keystone_url"]}"'

    made_up = get(f"{d.url}/v1/standings", headers={"X-Auth-Token": "gAAAA-not-a-token"})
    assert made_up.status_code == 401
    token = member_of(info, "acme")
    admin = keystone_token(info, "admin", system_scope="all")
    revoked = httpx.delete(
        f"{info['keystone_url']}/auth/tokens",
        headers={"X-Auth-Token": admin, "X-Subject-Token": token},
    )
    assert revoked.status_code == 204, revoked.text
    answer = get(f"{d.url}/v1/standings", headers={"X-Auth-Token": token})
    assert answer.status_code == 401, answer.text
    assert "not valid" in answer.json()["detail"]


# --- the openstack command line ---------------------------------------------------------------


def openstack_cli(clouds_yaml: str, cloud: str, *args: str) -> Any:
    done = subprocess.run(
        [str(GMD_ADMIN.parent / "openstack"), "--os-cloud", cloud, *args, "-f", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OS_CLIENT_CONFIG_FILE": clouds_yaml},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_openstack_fairness_reads_the_catalogs_endpoint_with_the_clouds_auth(
    keystone_daemon: Any, real_cloud: Any, tmp_path: Path
) -> None:
    """The plugin as people run it: the clouds.yaml of the fixture, the endpoint of service
    type fairness from Keystone's catalog, OSC's own formatter."""
    d, info = keystone_daemon
    acme = info["projects"]["acme"]
    clouds = str(real_cloud.clouds_yaml)
    conn = real_cloud.connect()
    service = conn.identity.create_service(name="gmd", type="fairness")
    try:
        conn.identity.create_endpoint(
            service_id=service.id, interface="public", url=d.url, region_id="RegionOne"
        )
        listed = openstack_cli(clouds, "keystone-admin", "fairness", "standing", "list")
        explained = openstack_cli(clouds, "member", "fairness", "explain")
        reported = openstack_cli(clouds, "member", "fairness", "report", "--from", "now-1d")
    finally:
        for endpoint in conn.identity.endpoints(service_id=service.id):
            conn.identity.delete_endpoint(endpoint)
        conn.identity.delete_service(service)
    expected = gmd_admin(tmp_path / "gmd.toml", "standings")["customers"]
    assert [
        (r["Customer"], r["Balance"], r["GM (last)"], r["Utility"], r["Priority"], r["Level"])
        for r in listed
    ] == [
        (r["customer"], r["balance"], r["greediness"], r["utility"], r["priority"], r["level"])
        for r in expected
    ]
    assert len(listed) == 2
    # A member's own project, without naming it.
    assert explained["customer"] == acme and explained["summary"]
    assert reported and all(isinstance(row, dict) for row in reported)


# --- the web page, in a real browser ----------------------------------------------------------

PHONE = {"width": 390, "height": 844}


def test_a_customers_page_in_a_browser_shows_the_apis_balance_and_level(tmp_path: Path) -> None:
    """Debian's chromium, headless, at a phone's size: the customer's page shows the balance
    and level the API gives, its plot loaded at the page's width, and nothing is wider than
    the screen: the tables scroll in their box, no cell squeezed to a few letters a line;
    times are ISO, dry-run rows marked, the log's words said plainly with a glossary; the
    standings page says what each level does and links to the customer's page."""
    from tests.support.browser import Browser

    config = configured(f"sqlite:///{tmp_path / 'ledger.db'}", {"auth": "local"})
    with seeded(config, ("acme", "initech")) as d, Browser() as browser:
        report = {
            "generated_s": int(time.time()),
            "results": [
                {"uuid": as_uuid("vm-acme"), "action": "apply", "ok": True, "after": {"cpu": 1}}
            ],
        }
        url = f"{d.url}/v1/plan/{HOST.name}/report"
        assert httpx.post(url, json=report, headers=auth(HOST.name)).status_code == 200
        api = get(f"{d.url}/v1/customers/acme/explain").json()
        browser.open(f"{d.url}/ui/customers/acme", **PHONE)
        page = browser.evaluate(
            """({
                balance: document.querySelector("#standing [data-key=balance]").dataset.value,
                shownBalance: document.querySelector("#standing [data-key=balance]").textContent,
                level: document.querySelector("#standing [data-key=level]").dataset.value,
                summary: [...document.querySelectorAll("ul.summary li")].map(li => li.textContent),
                plotLoaded: document.querySelector("figure.plot img").naturalWidth,
                plotShown: document.querySelector("figure.plot img").getBoundingClientRect().width,
                actions: document.querySelectorAll("#actions tr").length - 1,
                dryRun: [...document.querySelectorAll("#actions tr.dry-run")].map(
                    tr => tr.textContent),
                kinds: [...document.querySelectorAll("#actions [data-key=kind]")].map(
                    td => td.textContent),
                narrowest: Math.min(...[...document.querySelectorAll("td")].map(
                    td => td.getBoundingClientRect().width)),
                em: parseFloat(getComputedStyle(document.body).fontSize),
                titled: document.querySelectorAll("th[title]").length,
                glossary: document.querySelectorAll("dl.glossary dt").length,
                text: document.body.innerText,
                wide: document.documentElement.scrollWidth,
                screen: window.innerWidth,
            })"""
        )
        screenshot = browser.screenshot()
        browser.open(f"{d.url}/ui", **PHONE)
        standings = browser.evaluate(
            """({
                links: [...document.querySelectorAll("tr[data-customer] a")].map(
                    a => a.textContent),
                does: [...document.querySelectorAll("[data-key=does]")].map(
                    td => td.textContent),
                narrowest: Math.min(...[...document.querySelectorAll("td")].map(
                    td => td.getBoundingClientRect().width)),
                wide: document.documentElement.scrollWidth,
            })"""
        )
    assert float(page["balance"]) == api["balance"]["balance"]
    assert page["shownBalance"] == f"{api['balance']['balance']:.4f}"
    assert int(page["level"]) == api["level"]["level"] > 0
    assert page["summary"] == api["summary"]
    assert page["plotLoaded"] > 0, "the plot did not load"
    assert page["plotShown"] >= 0.8 * page["screen"], page
    assert page["actions"] > 0
    # the seed's level changes were decided in dry-run; the host's report was applied
    assert page["dryRun"] and all("dry-run" in row for row in page["dryRun"]), page["dryRun"]
    assert "Limits set on a VM on cmp-1" in page["kinds"] and "host_apply" not in page["text"]
    assert not re.search(r"\b\d{10}\b", page["text"]), "a Unix time on the page"
    assert page["titled"] >= 4 and page["glossary"] >= 5
    # at 390 px no cell is squeezed below four letters' width: tables scroll instead
    assert page["narrowest"] >= 2 * page["em"], page
    assert standings["narrowest"] >= 2 * page["em"], standings
    assert page["wide"] <= page["screen"], page
    assert standings["wide"] <= page["screen"], standings
    assert screenshot.startswith(b"\x89PNG\r\n\x1a\n") and len(screenshot) > 10_000
    (tmp_path / "customer-page.png").write_bytes(screenshot)
    assert standings["links"] == ["acme", "initech"]
    assert standings["does"][0].startswith("CPU and disk weights × 0.25")
    assert standings["does"][1] == "nothing"
