"""Trace reading and the papers' preprocessing, on small cuts made at run time."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from gmd.sim.swf import read_swf
from gmd.sim.workload import (
    assign_users,
    build_workload,
    processor_counts,
    read_assignment,
)
from tests.conftest import DATA

LPC = DATA / "pwa" / "LPC-EGEE-2004-1.2-cln.weeks-24-27.swf.gz"  # tests/data/pwa/README.md

LINES = """; MaxProcs: 8
1 0 5 10 2 -1 -1 2 -1 -1 1 7 1 -1 -1 -1 -1 -1
2 3 0 7 -1 -1 -1 1 -1 -1 1 9 1 -1 -1 -1 -1 -1
3 4 0 0 1 -1 -1 1 -1 -1 0 9 1 -1 -1 -1 -1 -1
4 20 0 4000 1 -1 -1 1 -1 -1 1 7 1 -1 -1 -1 -1 -1
"""


def write(tmp_path: Path, text: str, name: str = "t.swf") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_reads_fields_header_and_drops_jobs_that_never_ran(tmp_path: Path) -> None:
    t = read_swf(write(tmp_path, LINES))
    assert t.max_procs == 8
    assert t.job_id.tolist() == [1, 2, 4]  # job 3 ran 0 s
    assert t.processors.tolist() == [2, 1, 1]  # job 2: allocated unknown → requested
    assert t.user.tolist() == [7, 9, 7] and t.skipped == 1


def test_bad_line_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"t\.swf:3: expected 18 fields, found 3"):
        read_swf(write(tmp_path, LINES.replace("2 3 0 7 -1 -1 -1 1 -1 -1 1 9 1 -1 -1 -1 -1 -1",
                                               "2 3 0")))  # fmt: skip


def test_window_split_and_unit_cut(tmp_path: Path) -> None:
    t = read_swf(write(tmp_path, LINES))
    w = build_workload(t, 0, 21, {7: 0, 9: 1}, (1, 1))
    # job 1 (2 processors) → two sequential copies; job 4 at 20 is inside [0, 21)
    assert w.release.tolist() == [0, 0, 3, 20]
    assert w.duration.tolist() == [10, 10, 7, 4000]
    assert w.org.tolist() == [0, 0, 1, 0]
    cut = build_workload(t, 3, 18, {7: 0, 9: 1}, (1, 1), unit_s=3600)
    assert cut.release.tolist() == [0, 17, 17] and cut.duration.tolist() == [3600] * 3
    with pytest.raises(ValueError, match=r"user 9 \(job 2\) has no organization"):
        build_workload(t, 0, 21, {7: 0}, (1, 1))


def test_processor_splits() -> None:
    assert processor_counts(70, 5, "equal") == (14, 14, 14, 14, 14)
    assert processor_counts(12, 5, "equal") == (3, 3, 2, 2, 2)
    # Zipf over 5: one each, then the 65 spare ∝ 1, 1/2, 1/3, 1/4, 1/5 (sum 137/60):
    # 28.47, 14.23, 9.49, 7.12, 5.69 → floors 28, 14, 9, 7, 5 and the 2 left go to the largest
    # remainders (.69, .49) → 28, 14, 10, 7, 6; plus the one each.
    assert processor_counts(70, 5, "zipf") == (29, 15, 11, 8, 7)
    with pytest.raises(ValueError, match="cannot give each of 5"):
        processor_counts(4, 5)


def test_user_assignment_random_and_from_file(tmp_path: Path) -> None:
    users = np.array([5, 6, 7, 8, 9, 5])
    a = assign_users(users, 2, seed=1)
    assert sorted(a) == [5, 6, 7, 8, 9] and sorted(np.bincount(list(a.values()))) == [2, 3]
    assert a == assign_users(users, 2, seed=1)
    mapping, names = read_assignment(write(tmp_path, "# u org\n5 alpha\n6 beta\n7 alpha\n", "a"))
    assert mapping == {5: 0, 6: 1, 7: 0} and names == ["alpha", "beta"]
    with pytest.raises(ValueError, match=r"a:2: user 5 is assigned twice"):
        read_assignment(write(tmp_path, "5 alpha\n5 beta\n", "a"))


def test_real_trace_prefix(tmp_path: Path) -> None:
    with gzip.open(LPC, "rt") as src:
        head = [next(src) for _ in range(400)]
    cut = tmp_path / "lpc.swf.gz"
    with gzip.open(cut, "wt") as dst:
        dst.writelines(head)
    t = read_swf(cut)
    assert t.max_procs == 140
    assert t.n_jobs > 0 and np.all(np.diff(t.submit_s) >= 0) and t.run_s.min() >= 1
