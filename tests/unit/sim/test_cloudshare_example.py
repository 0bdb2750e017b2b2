"""CloudShare's two-organization example (Pacholczyk & Rzadca, Sec. 3.2.3, Figures 2-3).

A and B have one processor each. A submits jobs at 0, 2, 4, 6 and 8; B two jobs at 4. The
figures' job lengths are not in the text; we take A's jobs 2 long and B's 5 long, which gives
the text's account: at 4 DirectContr sees equal priorities (everything so far ran locally),
FairShare favours B (A has used 4 units, B none) and starts *both* B jobs, and A's jobs are
delayed by 5 time units in total.

Hand derivation (ties: earlier-released head job, then A):
- DirectContr: A1 0-2 and A2 2-4 on A's processor. At 4 both priorities are 0 → tie, A3 and
  B1 released together → A3 first (on A's processor), B1 on B's. At 6 A3 ends; A4 (released
  6) and B2 (released 4) wait, priorities still 0 (everything ran on its owner's processor)
  → B2 (older) on A's processor, 6-11. B1 ends at 9 → A4 9-11. A5 (released 8) at 11.
- FairShare: at 4 A used 4 units, B 0 → B1; read at t+1, B has 1 unit → still B → B2. Both
  B jobs 4-9; A3 and A4 start at 9, A5 at 11.
"""

from __future__ import annotations

import numpy as np

from gmd.sim.policies import parse_policy
from gmd.sim.scheduler import simulate
from gmd.sim.workload import Workload

A, B = 0, 1
#               A1 A2 A3 B1 B2 A4 A5
RELEASE = np.array([0, 2, 4, 4, 4, 6, 8])
DURATION = np.array([2, 2, 2, 5, 5, 2, 2])
ORG = np.array([A, A, A, B, B, A, A])
A_JOBS = [0, 1, 2, 5, 6]


def example() -> Workload:
    return Workload(RELEASE, DURATION, ORG, (1, 1), horizon_s=20)


def test_directcontr_schedule_figure_2() -> None:
    s = simulate(example(), parse_policy("DirectContr").factory())  # type: ignore[misc]
    assert s.start.tolist() == [0, 2, 4, 4, 6, 9, 11]
    assert s.owner.tolist() == [A, A, A, B, A, B, A]


def test_fairshare_schedule_figure_3() -> None:
    s = simulate(example(), parse_policy("FairShare").factory())  # type: ignore[misc]
    assert s.start.tolist() == [0, 2, 9, 4, 4, 9, 11]


def test_fairshare_delays_a_by_five_units() -> None:
    dc = simulate(example(), parse_policy("ORIG_DIRECT").factory()).start  # type: ignore[misc]
    fs = simulate(example(), parse_policy("FairShare").factory()).start  # type: ignore[misc]
    assert int((fs[A_JOBS] - dc[A_JOBS]).sum()) == 5
    # at time 4 FairShare starts both of B's jobs, DirectContr only one
    assert int(np.sum((fs == 4) & (ORG == B))) == 2
    assert int(np.sum((dc == 4) & (ORG == B))) == 1
