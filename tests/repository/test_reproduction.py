"""docs/reproduction.md says only what the protocol's runs show.

Its tables are generated (``make reproduce``) from docs/reproduction-results.json, the values
of every draw of every study of docs/reproduction-protocol.toml. Here the tables are made
again from those values and compared with the document's, the results are checked to be the
protocol's (its digest, every planned seed and log run), and the protocol to hold what a
referee would ask (8 seeds or more, 10,000 resamples or more).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gmd.sim.protocol import MIN_RESAMPLES, MIN_SEEDS, load_protocol
from gmd.sim.report import check_document
from gmd.sim.reproduce import DOCUMENT, PROTOCOL, RESULTS, main


def test_the_document_is_the_protocols_results() -> None:
    protocol = load_protocol(PROTOCOL)
    assert len(protocol.seeds) >= MIN_SEEDS and protocol.resamples >= MIN_RESAMPLES
    problems = check_document(protocol, json.loads(RESULTS.read_text()), DOCUMENT.read_text())
    assert not problems, "\n".join(problems)


def test_a_changed_figure_in_the_document_is_caught() -> None:
    protocol = load_protocol(PROTOCOL)
    results = json.loads(RESULTS.read_text())
    run = results["studies"]["spaa-equal"]["runs"][0]
    row = next(i for i, c in enumerate(run["contended"]) if c)
    run["values"][row][0] = run["values"][row][0] * 3 + 1000
    problems = check_document(protocol, results, DOCUMENT.read_text())
    assert any("spaa-equal" in p for p in problems), problems


def test_the_command_checks_and_refuses_a_missing_log_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check"]) == 0
    results = tmp_path / "results.json"
    code = main(["run", "--pwa", str(tmp_path), "--only", "spaa-equal", "--cache",
                 str(tmp_path / "cache"), "--results", str(results)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not results.exists()
    assert len(err) == 1 and "LPC-EGEE-2004-1.2-cln.swf.gz: no such file" in err[0], err
