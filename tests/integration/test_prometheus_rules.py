"""The Prometheus rules gmd ships (etc/prometheus/gmd-rules.yml): valid, tested, about metrics
that exist, and alerting from a real Prometheus that scrapes a real gmd-daemon.

``promtool`` checks the rules and runs their unit tests (etc/prometheus/gmd-rules.test.yml);
a changed threshold or ``for:`` of any alert must fail those tests, which is checked by running
them against mutated copies. Every metric and label value the rules name must be on a real
daemon's /metrics or in the agent's registry, so a renamed metric fails here, not silently in
an operator's Prometheus. Debian's prometheus package brings both programs:
tests/scripts/prometheus.sh installs it.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gmd.agent.metrics import AgentMetrics
from tests.support import needs
from tests.support.daemon_support import (
    HostSpec,
    aligned_past,
    auth,
    batch,
    cpu_only,
    full_ledger,
    make_config,
    serving,
    token_of,
)

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "etc" / "prometheus" / "gmd-rules.yml"
RULE_TESTS = REPO / "etc" / "prometheus" / "gmd-rules.test.yml"
OPERATIONS = REPO / "docs" / "operations.md"
HOST = HostSpec("cmp-prom", cpu_cores=64, memory_bytes=512e9)
NEW_HOST = HostSpec("cmp-prom-new", cpu_cores=64, memory_bytes=512e9)
"""A host of the test's own batches beside the real agent's HOST: a batch of HOST's could meet
the agent's for the same interval, with another capacity (a 409, not the 503 asked for)."""
ENFORCEMENT = {"mode": "dry-run", "enter": [0.2, 0.4, 0.8], "leave": [0.1, 0.3, 0.6], "dwell_s": 0}
PROMETHEUS_OWN = frozenset({"up"})
"""Series Prometheus makes itself for every target, which the rules may read."""
TARGET_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus adds to every scraped series."""


def program(name: str) -> str:
    """The path of promtool or prometheus; without it the test fails (``make test``: never
    skips) or, under ``make test-fast``, is skipped."""
    return needs.program(
        name,
        "run tests/scripts/prometheus.sh (as root: it installs Debian's prometheus package,"
        " which brings promtool and prometheus)",
    )


def rules() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def alerts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def recordings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in doc["groups"] for r in g["rules"] if "record" in r]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading (as tests/repository/test_docs.py checks links)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_promtool_checks_the_rules_and_their_unit_tests_pass() -> None:
    promtool = program("promtool")
    for command in (["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        done = subprocess.run(
            [promtool, *command], capture_output=True, text=True, timeout=120, cwd=REPO
        )
        assert done.returncode == 0, f"promtool {' '.join(command)}:\n{done.stdout}{done.stderr}"
        assert "SUCCESS" in done.stdout, done.stdout


def test_every_alert_is_documented_labelled_and_tested_firing_and_quiet() -> None:
    """Each alert: a ``for:``, a severity, a summary, a description and a runbook that is a
    heading of docs/operations.md; a unit test where it fires and one where it does not.
    Each recording rule: named level:metric:operations, and its value tested."""
    doc = rules()
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    headings = {anchor(h) for h in re.findall(r"^#+ (.+?)\s*$", OPERATIONS.read_text(), re.M)}
    cases = [case for group in tests for case in group.get("alert_rule_test", [])]
    checked = " ".join(
        case["expr"] for group in tests for case in group.get("promql_expr_test", [])
    )
    names = [a["alert"] for a in alerts(doc)]
    assert len(names) == len(set(names)), names
    assert "alerts" in headings, "docs/operations.md has no ## Alerts section"
    for alert in alerts(doc):
        name = alert["alert"]
        assert "for" in alert, f"{name} has no for:"
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        assert set(alert["annotations"]) == {"summary", "description", "runbook"}, name
        page, _, fragment = alert["annotations"]["runbook"].partition("#")
        assert page == "docs/operations.md" and fragment in headings, (name, fragment)
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c.get("exp_alerts") for c in mine), f"no unit test where {name} fires"
        assert any(not c.get("exp_alerts") for c in mine), f"no unit test where {name} is quiet"
        for case in mine:
            for expected in case.get("exp_alerts") or []:
                assert expected["exp_labels"]["severity"] == alert["labels"]["severity"]
                assert set(expected["exp_annotations"]) == set(alert["annotations"]), name
    for rule in recordings(doc):
        name = rule["record"]
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+(:[a-z0-9_]+)?", name), name
        assert re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", checked), (
            f"no unit test reads the recording rule {name}"
        )


def minutes(duration: str) -> int:
    m = re.fullmatch(r"(\d+)m", duration)
    assert m, f"for: {duration} (the mutations below expect whole minutes)"
    return int(m.group(1))


COMPARISON = re.compile(r"(>|>=|<|<=|==|!=)\s*(-?\d+(?:\.\d+)?)\s*$")


def mutations(alert: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The alert with its ``for:`` a minute longer or shorter, and its threshold (the final
    ``> N`` of its expression) halved and half as large again, or ``> 0`` made ``>= 0``."""
    duration = minutes(alert["for"])
    for changed in (duration + 1, duration - 1):
        if changed >= 0:
            yield f"for: {changed}m", {**alert, "for": f"{changed}m"}
    expr = alert["expr"].strip()
    m = COMPARISON.search(expr)
    assert m, f"{alert['alert']}: its expression ends in no comparison with a number"
    op, number = m.group(1), float(m.group(2))
    if op != ">":
        return  # == 0 / == 1: a state, not a threshold; its for: is mutated above
    head = expr[: m.start()]
    if number == 0:
        yield ">= 0", {**alert, "expr": f"{head}>= 0"}
        return
    for factor in (0.5, 1.5):
        yield f"> {number * factor:g}", {**alert, "expr": f"{head}> {number * factor:g}"}


def test_a_changed_threshold_or_duration_fails_the_unit_tests(tmp_path: Path) -> None:
    """Each alert's unit tests pin its threshold and its ``for:``: with either changed (a
    mutant of the rules), promtool's tests of that alert fail. Unchanged, they pass: the
    tests of each alert alone are the control."""
    promtool = program("promtool")
    doc = rules()
    tests = yaml.safe_load(RULE_TESTS.read_text())
    runs: dict[Path, tuple[str, str]] = {}
    for alert in alerts(doc):
        name = alert["alert"]
        groups = [
            g
            for g in tests["tests"]
            if any(c["alertname"] == name for c in g.get("alert_rule_test", []))
        ]
        for label, mutant in [("unchanged", alert), *mutations(alert)]:
            where = tmp_path / f"{len(runs):03d}"
            where.mkdir()
            changed = copy.deepcopy(doc)
            for group in changed["groups"]:
                group["rules"] = [mutant if r.get("alert") == name else r for r in group["rules"]]
            (where / "gmd-rules.yml").write_text(yaml.safe_dump(changed, sort_keys=False))
            only = {**tests, "rule_files": ["gmd-rules.yml"], "tests": groups}
            (where / "test.yml").write_text(yaml.safe_dump(only, sort_keys=False))
            runs[where / "test.yml"] = (name, label)
    done = subprocess.run(
        [promtool, "test", "rules", *map(str, runs)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    outcome = {
        Path(part.split()[0]): "SUCCESS" in part.split("\n", 2)[1]
        for part in done.stdout.split("Unit Testing:")[1:]
    }
    assert set(outcome) == set(runs), done.stdout[-3000:] + done.stderr[-3000:]
    wrong = [
        f"{name} {label}: the tests {'pass' if passed else 'fail'}"
        for path, passed in outcome.items()
        for name, label in [runs[path]]
        if passed != (label == "unchanged")
    ]
    assert not wrong, "\n".join(wrong)


def exposed(text: str) -> dict[str, list[dict[str, str]]]:
    """Every series name of a /metrics page (counters as ``…_total``, histograms' ``_bucket``,
    families without samples yet by their name) → its samples' labels."""
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, [])
        for s in family.samples:
            out.setdefault(s.name, []).append(dict(s.labels))
    return out


def used(expr: str) -> tuple[set[str], list[tuple[str, str, str, str]], set[str]]:
    """The metric names an expression reads (not recorded ones, which hold a colon), its label
    matchers (metric, label, operator, value) and the labels it groups or matches by."""
    names = set(re.findall(r"(?<![\w:])(gmd_[a-z0-9_]+|up)(?![\w:(])", expr))
    matchers = [
        (metric, label, op, value)
        for metric, inside in re.findall(r"(?<![\w:])(gmd_[a-z0-9_]+|up)\{([^}]*)\}", expr)
        for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', inside)
    ]
    grouped = {
        label.strip()
        for inside in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr)
        for label in inside.split(",")
        if label.strip()
    }
    return names, matchers, grouped


def test_every_metric_and_label_the_rules_read_is_exported(tmp_path: Path) -> None:
    """The names, label values and grouping labels of every rule against a real daemon's
    /metrics (on SQLite, accounting and enforcing in dry-run, after one batch) and the agent's
    registry: a metric or label renamed in the code fails here."""
    config = make_config(
        f"sqlite:///{tmp_path / 'ledger.db'}", {HOST.name: "operator"}, enforcement=ENFORCEMENT
    )
    with serving(config, accountant=True) as d:
        body = batch(HOST, aligned_past(2), [cpu_only("vm-1", "proj-a", 30.0)])
        stored = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(HOST.name))
        assert stored.status_code == 200, stored.text
        daemon = exposed(httpx.get(f"{d.url}/metrics").text)
    agent = exposed(generate_latest(AgentMetrics().registry).decode())
    series = {**daemon, **agent}
    problems = []
    for rule in (r for g in rules()["groups"] for r in g["rules"]):
        what = rule.get("alert") or rule["record"]
        names, matchers, grouped = used(rule["expr"])
        assert names, f"{what} reads no metric this test recognises"
        for name in sorted(names - PROMETHEUS_OWN):
            source = agent if name.startswith("gmd_agent_") else daemon
            if name not in source:
                problems.append(f"{what}: {name} is not exported")
        for metric, label, op, value in matchers:
            if metric in PROMETHEUS_OWN or label in TARGET_LABELS:
                continue
            values = {s.get(label) for s in series.get(metric, [])}
            if op == "=" and value not in values:
                problems.append(f"{what}: {metric}{{{label}={value!r}}} is never exported")
            if op == "=~":
                for alternative in value.split("|"):
                    if alternative not in values:
                        problems.append(f"{what}: {metric} has no {label}={alternative!r}")
        labels = {k for n in names for s in series.get(n, []) for k in s} | TARGET_LABELS
        for label in sorted(grouped - labels):
            problems.append(f"{what}: no metric it reads has the label {label}")
    assert not problems, "\n".join(problems)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def prometheus(tmp_path: Path, target: str, agent: str | None = None) -> Iterator[str]:
    """A real Prometheus scraping ``target`` (host:port) as job gmd-daemon, and ``agent`` as
    job gmd-agent, every second and evaluating the shipped rules every second; its API's base
    URL. Terminated on exit."""
    binary = program("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "evaluation_interval": "1s",
                },
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {"job_name": "gmd-daemon", "static_configs": [{"targets": [target]}]},
                    *(
                        [{"job_name": "gmd-agent", "static_configs": [{"targets": [agent]}]}]
                        if agent
                        else []
                    ),
                ],
            }
        )
    )
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def poll(what: str, check: Any, deadline_s: float = 60) -> Any:
    """``check()`` until it returns something other than None (then that), or fail after
    ``deadline_s`` saying ``what`` and the last thing it saw (``check`` may set it)."""
    seen: dict[str, Any] = {}
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            found = check(seen)
        except httpx.HTTPError as exc:
            seen["error"] = repr(exc)
            found = None
        if found is not None:
            return found
        time.sleep(0.2)
    pytest.fail(f"{what} within {deadline_s:g} s; Prometheus said: {seen}", pytrace=False)


def ledger_alert(api: str, seen: dict[str, Any]) -> dict[str, Any] | None:
    answer = httpx.get(f"{api}/api/v1/alerts", timeout=5).json()
    seen["alerts"] = answer
    return next(
        (a for a in answer["data"]["alerts"] if a["labels"]["alertname"] == "GmdLedgerCannotWrite"),
        None,
    )


@contextmanager
def agent(tmp_path: Path, daemon_url: str) -> Iterator[str]:
    """A real gmd-agent on libvirt's test driver, posting to ``daemon_url``, its /metrics on
    a free port: that address (host:port)."""
    from tests.support.agent_fixtures import NODE, uri

    port = free_port()
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nhost = "{HOST.name}"\ndaemon_url = "{daemon_url}"\n'
        f'token = "{token_of(HOST.name)}"\nlibvirt_uri = "{uri(NODE)}"\n'
        f'collector = "libvirt"\nenforce_backend = "none"\nmetrics_port = {port}\n'
        f'spool_path = "{tmp_path / "spool.db"}"\nnetwork_bytes_per_s = 1250000000\n'
    )
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("gmd-agent")), "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(20)


def test_a_real_prometheus_alerts_when_the_daemons_ledger_cannot_write(tmp_path: Path) -> None:
    """Prometheus (Debian's binary) scrapes a real gmd-daemon on SQLite, and a real gmd-agent,
    and evaluates the
    shipped rules: GmdLedgerCannotWrite is quiet while the ledger writes, becomes active
    (pending, then firing after its 2 minutes) once a batch meets a full ledger, and goes
    away when the agent's retry is stored."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    hosts = {HOST.name: "operator", NEW_HOST.name: "operator"}
    with serving(make_config(url, hosts)) as d, agent(tmp_path, d.url) as at:
        target = d.url.removeprefix("http://")
        with prometheus(tmp_path, target, at) as api:

            def agent_up(seen: dict[str, Any]) -> float | None:
                query = 'up{job="gmd-agent"} * on() group_left gmd_agent_vms{job="gmd-agent"}'
                answer = httpx.get(f"{api}/api/v1/query", params={"query": query}, timeout=5)
                seen["agent"] = answer.json()
                result = answer.json()["data"]["result"]
                return float(result[0]["value"][1]) if result else None

            # The real agent (libvirt's test driver: four VMs) is scraped beside the daemon.
            assert poll("Prometheus scraped no gmd-agent", agent_up) == 4

            def scraped(seen: dict[str, Any]) -> float | None:
                query = f'gmd_ledger_write_failing{{job="gmd-daemon",instance="{target}"}}'
                answer = httpx.get(f"{api}/api/v1/query", params={"query": query}, timeout=5)
                seen["query"] = answer.json()
                result = answer.json()["data"]["result"]
                return float(result[0]["value"][1]) if result else None

            assert poll("Prometheus scraped no gmd_ledger_write_failing", scraped) == 0
            assert ledger_alert(api, {}) is None

            # A new host's 300 new VMs need pages the full ledger does not have: 503.
            vms = [cpu_only(f"vm-{i}", f"customer-{i}", 1.0) for i in range(300)]
            body = batch(NEW_HOST, aligned_past(1), vms)
            with full_ledger(d, url):
                refused = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(NEW_HOST.name))
                assert refused.status_code == 503, refused.text
                alert = poll(
                    "GmdLedgerCannotWrite did not become pending or firing",
                    lambda seen: ledger_alert(api, seen),
                )
            assert alert["state"] in {"pending", "firing"}, alert
            assert alert["labels"] == {
                "alertname": "GmdLedgerCannotWrite",
                "severity": "critical",
                "job": "gmd-daemon",
                "instance": target,
            }
            assert alert["annotations"]["summary"] == (
                f"gmd-daemon {target} cannot write its ledger"
            )
            assert alert["annotations"]["runbook"] == "docs/operations.md#gmdledgercannotwrite"

            # The agent sends the batch again once the ledger has room: stored, and the alert
            # goes away at the next scrape and evaluation.
            stored = httpx.post(f"{d.url}/v1/samples", json=body, headers=auth(NEW_HOST.name))
            assert stored.status_code == 200, stored.text
            poll(
                "GmdLedgerCannotWrite stayed active after the ledger wrote again",
                lambda seen: True if ledger_alert(api, seen) is None else None,
            )
