"""A project member's answers name no hypervisor (issue 42): no compute host's name, no
cgroup path, no libvirt domain, no host's error text, in any read route, the web page (in
chromium too) and ``openstack fairness``; an operator's answers still carry all of them.

The ledger: two hosts of one organization, a greedy project with a VM on each and a modest
one beside it on the first; the greedy project's level was decided (dry-run), and the hosts
reported on its VMs: the first could not apply the plan (libvirt's error naming the domain and
its cgroup), the second applied it. Members are authenticated by the real Keystone
(tests/scripts/openstack.sh) and, for the quick loop, by a stand-in access that takes the
token for the project it is a member of.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gmd.daemon.api.access import ReadCaller
from gmd.daemon.api.members import PATH_WORDS, MemberView, host_id, report_words
from gmd.daemon.enforce.levels import after_interval
from gmd.daemon.ledger.accounting import account_due
from tests.support.daemon_support import (
    HostSpec,
    aligned_past,
    as_uuid,
    auth,
    batch,
    cpu_only,
    make_config,
    serving,
)
from tests.unit.daemon.api.test_read import (
    ACCOUNTING,
    PHONE,
    get,
    keystone_token,
    member_of,
    openstack_cli,
)

pytest_plugins = ("tests.support.openstack_support",)

HOST_A = HostSpec("hv-secret-17.dc1.example", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
HOST_B = HostSpec("hv-secret-18.dc1.example", cpu_cores=2, memory_bytes=8e9, disk_bytes_per_s=1e8)
OWNER = "globex-hardware"
DOMAIN = "instance-0000002a"
CGROUP = (
    "/sys/fs/cgroup/machine.slice/machine-qemu\\x2d42\\x2dinstance\\x2d0000002a.scope"
    "/libvirt/cpu.weight"
)
SECRETS = (
    HOST_A.name,
    HOST_B.name,
    "hv-secret",
    OWNER,
    DOMAIN,
    "/sys/fs/cgroup",
    "machine.slice",
    "libvirt error",
    "Permission denied",
)
"""What no answer to a member may hold, anywhere"""
INTERVALS = 4
# Thresholds the greedy project climbs to level 3 by in the seed (+0.0625 an interval): its
# CPU caps are wanted, and the first host said it cannot set them.
ENFORCEMENT = {
    "mode": "dry-run",
    "enter": [0.05, 0.1, 0.2],
    "leave": [0.01, 0.05, 0.1],
    "dwell_s": 0,
}


PROBE = f"libvirt: Unable to read {CGROUP} of {DOMAIN}: libvirt error: Permission denied"
"""Why an agent's probe says a knob cannot be set on HOST_A (its own words)"""


def capabilities(reason: str) -> dict[str, Any]:
    """A host's knobs as its agent reports them (PUT /v1/hosts/{host}/capabilities): no CPU
    cap, for ``reason``."""
    return {
        "backend": "libvirt",
        "cgroup": "v2",
        "schedulers": {"sda": "mq-deadline"},
        "knobs": [
            {"knob": "cpu_weight", "support": "supported", "via": "libvirt cpu_shares"},
            {"knob": "cpu_cap", "support": "unsupported", "reason": reason},
        ],
        "probed_s": aligned_past(INTERVALS + 2),
    }


def host_error(vm: str) -> str:
    """What an agent reports when libvirt refuses a VM's knob (gmd.agent.apply.base.prefixed)."""
    return (
        f"VM {vm} ({DOMAIN}): cpu_shares failed: libvirt error: Unable to write to"
        f" '{CGROUP}': Permission denied"
    )


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def configured(url: str, read_api: dict[str, Any]) -> Any:
    return make_config(
        url,
        {HOST_A.name: OWNER, HOST_B.name: OWNER},
        accounting=ACCOUNTING,
        enforcement=ENFORCEMENT,
        daemon={"bind": "127.0.0.1"},
        read_api=read_api,
    )


@contextmanager
def seeded(config: Any, customers: tuple[str, str]) -> Iterator[Any]:
    """The module docstring's ledger, ``customers`` (greedy, modest)."""
    greedy, modest = customers
    with serving(config) as d:
        said = httpx.put(
            f"{d.url}/v1/hosts/{HOST_A.name}/capabilities",
            json=capabilities(PROBE),
            headers=auth(HOST_A.name),
        )
        assert said.status_code == 200, said.text
        for k in range(INTERVALS, 0, -1):
            start = aligned_past(k + 1)
            on_a = [
                cpu_only(f"vm-a-{greedy}", greedy, 90.0, vcpus=2),
                cpu_only(f"vm-{modest}", modest, 30.0, vcpus=2),
            ]
            on_b = [cpu_only(f"vm-b-{greedy}", greedy, 90.0, vcpus=2)]
            for host, vms in ((HOST_A, on_a), (HOST_B, on_b)):
                body = batch(host, start, vms, key=f"{host.name}-{k}")
                posted = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(host.name))
                assert posted.status_code == 200, posted.text
        account_due(d.engine, config.accounting, after=after_interval(config.enforcement))
        vm_a, vm_b = as_uuid(f"vm-a-{greedy}"), as_uuid(f"vm-b-{greedy}")
        reports = {
            HOST_A: {
                "uuid": vm_a,
                "action": "apply",
                "ok": False,
                "error": host_error(vm_a),
                "before": {"cpu_shares": 1024},
                "knobs": [{"knob": "cpu_weight", "outcome": "failed", "detail": host_error(vm_a)}],
            },
            HOST_B: {
                "uuid": vm_b,
                "action": "apply",
                "ok": True,
                "before": {"cpu.max": "max 100000"},
                "after": {"cpu.max": "50000 100000"},
                "knobs": [
                    {"knob": "cpu_weight", "outcome": "applied"},
                    {
                        "knob": "disk_weight",
                        "outcome": "unsupported",
                        "detail": f"no BFQ: {CGROUP}",
                    },
                ],
            },
        }
        for host, result in reports.items():
            report = {"generated_s": aligned_past(0), "results": [result]}
            url = f"{d.url}/v1/plan/{host.name}/report"
            answer = httpx.post(url, json=report, headers=auth(host.name))
            assert answer.status_code == 200 and answer.json()["recorded"] == 1, answer.text
        yield d


def answers(url: str, customer: str, **credentials: Any) -> dict[str, httpx.Response]:
    """Everything a reader of ``customer`` may ask of the daemon, by name."""
    routes = {
        "standings": "/v1/standings",
        "explain": f"/v1/customers/{customer}/explain",
        "report by day": f"/v1/customers/{customer}/report?from=now-1d",
        "report by host": f"/v1/customers/{customer}/report?from=now-1d&group_by=host",
        "report by resource": f"/v1/customers/{customer}/report?from=now-1d&group_by=resource",
        "enforcement": f"/v1/enforcement?customer={customer}",
        "plot": f"/v1/customers/{customer}/plot.svg?from=now-1d",
        "page": f"/ui/customers/{customer}",
        "standings page": "/ui",
    }
    out = {what: get(f"{url}{path}", **credentials) for what, path in routes.items()}
    for what, answer in out.items():
        assert answer.status_code == 200, (what, answer.text)
    return out


def check_a_members_view(got: dict[str, httpx.Response], project: str) -> None:
    """No secret anywhere; the hosts as Nova's hostId for the project; the host's failure in
    plain words; the VMs (its own) still named."""
    for what, answer in got.items():
        assert not leaks(answer.text), (what, leaks(answer.text), answer.text[:3000])
    labels = {host_id(project, h.name) for h in (HOST_A, HOST_B)}
    explained = got["explain"].json()
    assert {h["host"] for h in explained["hosts"]} == labels
    assert all("organization" not in h for h in explained["hosts"])
    assert {c["host"] for c in explained["caps"]} == labels
    assert all(label in explained["summary"][2] for label in labels), explained["summary"]
    log = got["enforcement"].json()["actions"]
    reports = {r["host"]: r for r in log if r["kind"] == "host_apply"}
    assert set(reports) == labels
    failed = reports[host_id(project, HOST_A.name)]
    assert failed["status"] == "failed"
    assert failed["reason"].startswith("the host could not apply the plan's limits to this VM")
    assert "(plan of " in failed["reason"]
    applied = reports[host_id(project, HOST_B.name)]
    assert applied["reason"].startswith("the host applied the plan's limits to this VM")
    assert applied["after"]["cpu.max"] == "50000 100000"  # the VM's own settings stay
    by_host = got["report by host"].json()["rows"]
    assert {r["host"] for r in by_host} == labels
    assert all("organization" not in r for r in by_host)
    page = got["page"].text
    assert "the host could not apply the plan" in page
    assert f"on {host_id(project, HOST_A.name)}" in page


def check_an_operators_view(got: dict[str, httpx.Response]) -> None:
    """Everything as the ledger holds it: names, owners, the host's own words."""
    explained = got["explain"].json()
    assert {h["host"] for h in explained["hosts"]} == {HOST_A.name, HOST_B.name}
    assert {h["organization"] for h in explained["hosts"]} == {OWNER}
    assert HOST_A.name in explained["summary"][2]
    log = json.dumps(got["enforcement"].json())
    for secret in (DOMAIN, "libvirt error", "Permission denied", f"reported by host {HOST_A.name}"):
        assert secret in log, secret
    assert any(CGROUP in str(r["reason"]) for r in got["enforcement"].json()["actions"])
    rows = got["report by host"].json()["rows"]
    assert {(r["host"], r["organization"]) for r in rows} == {
        (HOST_A.name, OWNER),
        (HOST_B.name, OWNER),
    }
    assert f"Limits set on a VM on {HOST_A.name}" in got["page"].text
    assert DOMAIN in got["page"].text


# --- the rules, on documents ---------------------------------------------------------------------


def test_a_members_view_replaces_names_paths_and_host_words_wherever_they_are() -> None:
    view = MemberView("p1", [HOST_A.name, HOST_B.name, "rack 7 node"])
    a, b = host_id("p1", HOST_A.name), host_id("p1", HOST_B.name)
    operator = {
        "host": HOST_A.name,
        "organization": OWNER,
        "summary": [f"weights on {HOST_A.name}, {HOST_B.name}; caps on {HOST_B.name}."],
        "notes": ["moved from rack 7 node: see /var/lib/gmd/agent/state.json"],
        "by_host": {HOST_B.name: 1},
        "knobs": [
            {"knob": "cpu_cap", "outcome": "failed", "detail": host_error("x")},
            {"knob": "disk_weight", "outcome": "unsupported", "detail": f"no BFQ on {CGROUP}"},
            {"knob": "cpu_weight", "outcome": "applied", "detail": ""},
        ],
        "rate": "10 MB/s, 1/2 of it",
        "column": {
            "knobs": {"cpu_cap": ["failed", host_error("x")], "cpu_weight": ["applied", ""]}
        },
    }
    member = view.document(operator)
    text = json.dumps(member)
    assert not leaks(text) and "rack 7 node" not in text and "/var/lib" not in text, text
    assert member["host"] == a and "organization" not in member
    assert member["summary"] == [f"weights on {a}, {b}; caps on {b}."]
    assert member["notes"] == [
        f"moved from {host_id('p1', 'rack 7 node')}: see {PATH_WORDS}",
    ]
    assert member["by_host"] == {b: 1}
    assert [k.get("detail") for k in member["knobs"]] == [
        "the host could not set it",
        "this host cannot set it",
        "",
    ]
    assert member["column"]["knobs"] == {
        "cpu_cap": ["failed", "the host could not set it"],
        "cpu_weight": ["applied", ""],
    }
    assert member["rate"] == "10 MB/s, 1/2 of it"
    assert operator["host"] == HOST_A.name, "the operator's document is not changed"
    # Nova's hostId: sha224 of the project id and the host, in that order
    assert a == hashlib.sha224(f"p1{HOST_A.name}".encode()).hexdigest()


def test_a_hosts_report_is_said_in_gmds_words_never_the_hosts() -> None:
    row = {
        "kind": "host_apply",
        "status": "failed",
        "dry_run": False,
        "after": {"vm": "u"},
        "reason": host_error("u")
        + f" (plan of 2026-01-02T03:04:05Z, reported by host {HOST_A.name})",
    }
    assert report_words(row) == (
        "the host could not apply the plan's limits to this VM (plan of 2026-01-02T03:04:05Z)"
    )
    assert report_words({**row, "after": {"vm": "u", "cpu_shares": 256}}).startswith(
        "the host applied part of the plan's limits"
    )
    restored = {**row, "kind": "host_restore", "status": "ok", "dry_run": True}
    restored["reason"] = f" (gmd-agent --restore-all, reported by host {HOST_A.name})"
    assert report_words(restored) == (
        "dry-run: the host would have put this VM's own settings back (gmd-agent --restore-all)"
    )
    # the knobs the host could not set, named (the log's column, or the wire's list)
    lacking = {
        **row,
        "status": "ok",
        "knobs": {
            "cpu_weight": ["applied", ""],
            "disk_weight": ["unsupported", f"no BFQ: {CGROUP}"],
        },
        "reason": f"disk weight not supported on this host: no BFQ: {CGROUP}"
        f" (plan of 2026-01-02T03:04:05Z, reported by host {HOST_A.name})",
    }
    assert report_words(lacking) == (
        "the host applied the plan's limits to this VM; its disk weight: this host cannot set it"
        " (plan of 2026-01-02T03:04:05Z)"
    )
    wire = {**lacking, "knobs": [{"knob": "cpu_cap", "outcome": "failed", "detail": "EPERM"}]}
    assert "; its CPU cap: the host could not set it (plan of" in report_words(wire)
    assert not leaks(json.dumps(MemberView("p", [HOST_A.name]).document([lacking, wire])))
    # a reason that is not audit.py's: the words alone
    assert report_words({**row, "reason": "garbled"}) == (
        "the host could not apply the plan's limits to this VM"
    )
    member = MemberView("p", [HOST_A.name]).document([row])
    assert not leaks(json.dumps(member))


def test_host_labels_are_the_host_ids_nova_shows_a_member(openstack_info: Any) -> None:
    """The hostId Nova's own code gives a server of the project on the host (Nova 34.0.0 of
    tests/scripts/openstack.sh): a member can match gmd's sentences to its servers."""
    venv = Path(__file__).resolve().parents[4] / "var" / "openstack" / "venv" / "bin" / "python"
    project = openstack_info["projects"]["acme"]
    done = subprocess.run(
        [
            str(venv),
            "-c",
            "import sys; from nova import utils; print(utils.generate_hostid(*sys.argv[1:]))",
            HOST_A.name,
            project,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == host_id(project, HOST_A.name)
    assert host_id(project, HOST_A.name) != host_id(
        openstack_info["projects"]["initech"], HOST_A.name
    )


# --- the daemon, with a stand-in for Keystone ----------------------------------------------------


class _OwnProject:
    """oslo.policy's default for a member, for the stand-in: its own project only."""

    def enforce(self, rule: str, target: dict[str, Any], creds: Any) -> bool:
        return bool(target.get("project_id") == creds)


class StandInAccess:
    """A token is the name of the project its bearer is a member of; "operator" reads all."""

    def reader(self, token: str | None) -> ReadCaller:
        if token == "operator":
            return ReadCaller("an operator", everyone=True)
        return ReadCaller(f"{token}-member", False, token, policy=token, rules=_OwnProject())


def test_a_members_answers_and_pages_name_no_host_where_an_operators_do(tmp_path: Path) -> None:
    config = configured(f"sqlite:///{tmp_path / 'ledger.db'}", {"auth": "local"})
    with seeded(config, ("acme", "initech")) as d:
        d.app.state.services.read_access = StandInAccess()
        member = answers(d.url, "acme", headers={"X-Auth-Token": "acme"})
        operator = answers(d.url, "acme", headers={"X-Auth-Token": "operator"})
        own_log = get(f"{d.url}/v1/enforcement", headers={"X-Auth-Token": "acme"})
    check_a_members_view(member, "acme")
    check_an_operators_view(operator)
    assert own_log.json() == member["enforcement"].json()


# --- the daemon, with the real Keystone -----------------------------------------------------------


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
    config = configured(f"sqlite:///{tmp_path / 'ledger.db'}", read_api)
    with seeded(config, (info["projects"]["acme"], info["projects"]["initech"])) as d:
        yield d, info


def test_a_keystone_member_sees_host_ids_where_an_operator_sees_hosts(
    keystone_daemon: Any, real_cloud: Any
) -> None:
    """Through keystonemiddleware and the policy defaults: a member's token (acme's member),
    an operator's (system-scoped admin); and ``openstack fairness`` as the member runs it."""
    d, info = keystone_daemon
    acme = info["projects"]["acme"]
    member_token = member_of(info, "acme")
    member = answers(d.url, acme, headers={"X-Auth-Token": member_token})
    page = get(f"{d.url}/ui/customers/{acme}", cookies={"gmd_token": member_token})
    admin = keystone_token(info, "admin", system_scope="all")
    operator = answers(d.url, acme, headers={"X-Auth-Token": admin})
    check_a_members_view(member, acme)
    assert page.status_code == 200 and not leaks(page.text), leaks(page.text)
    check_an_operators_view(operator)
    conn = real_cloud.connect()
    service = conn.identity.create_service(name="gmd", type="fairness")
    try:
        conn.identity.create_endpoint(
            service_id=service.id, interface="public", url=d.url, region_id="RegionOne"
        )
        clouds = str(real_cloud.clouds_yaml)
        explained = openstack_cli(clouds, "member", "fairness", "explain")
        by_host = openstack_cli(
            clouds, "member", "fairness", "report", "--from", "now-1d", "--group-by", "host"
        )
        as_operator = openstack_cli(
            clouds,
            "keystone-admin",
            "fairness",
            "report",
            acme,
            "--from",
            "now-1d",
            "--group-by",
            "host",
        )
    finally:
        for endpoint in conn.identity.endpoints(service_id=service.id):
            conn.identity.delete_endpoint(endpoint)
        conn.identity.delete_service(service)
    assert explained["customer"] == acme
    assert not leaks(json.dumps([explained, by_host])), (explained, by_host)
    assert {r["host"] for r in by_host} == {host_id(acme, h.name) for h in (HOST_A, HOST_B)}
    assert {r["host"] for r in as_operator} == {HOST_A.name, HOST_B.name}


def test_a_members_page_in_chromium_shows_no_host(keystone_daemon: Any) -> None:
    """The page as a member's browser lays it out, at a phone's width, signed in with the
    cookie: no host's name, domain or path in what it shows or in its markup; the hosts'
    hostIds wrap rather than widen the page. The operator's page names the hosts."""
    from tests.support.browser import Browser

    d, info = keystone_daemon
    acme = info["projects"]["acme"]
    script = """({
        html: document.documentElement.outerHTML,
        text: document.body.innerText,
        kinds: [...document.querySelectorAll("#actions [data-key=kind]")].map(
            td => td.textContent),
        why: [...document.querySelectorAll("#actions [data-key=reason]")].map(
            td => td.textContent),
        plotLoaded: document.querySelector("figure.plot img").naturalWidth,
        wide: document.documentElement.scrollWidth,
        screen: window.innerWidth,
    })"""
    seen = {}
    for who, token in (
        ("member", member_of(info, "acme")),
        ("operator", keystone_token(info, "admin", system_scope="all")),
    ):
        with Browser() as browser:
            browser.set_cookie(d.url, "gmd_token", token)
            browser.open(f"{d.url}/ui/customers/{acme}", **PHONE)
            seen[who] = browser.evaluate(script)
    member, operator = seen["member"], seen["operator"]
    assert not leaks(member["html"]), leaks(member["html"])
    assert member["plotLoaded"] > 0
    label = host_id(acme, HOST_A.name)
    assert f"Limits set on a VM on {label}" in member["kinds"], member["kinds"]
    assert any(w.startswith("the host could not apply") for w in member["why"]), member["why"]
    assert member["wide"] <= member["screen"], (member["wide"], member["screen"])
    assert f"Limits set on a VM on {HOST_A.name}" in operator["kinds"], operator["kinds"]
    assert any(DOMAIN in w and "libvirt error" in w for w in operator["why"]), operator["why"]
    assert not re.search(r"[0-9a-f]{56}", operator["text"]), "an operator sees names, not ids"
