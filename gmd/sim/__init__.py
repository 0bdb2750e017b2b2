"""Replaying job traces through fairness policies for organizations that share processors.

``swf`` reads traces, ``workload`` cuts them into samples (with CloudShare's local background
load, if asked), ``scheduler`` is the event loop, ``policies`` the registry, ``coalitions`` Ref
and Rand, ``shapley`` and ``measures`` the judging, ``bootstrap`` which orderings of policies the
samples settle, ``experiment`` the parallel runs, ``command`` the CLI text.
"""

from gmd.sim.coalitions import CoalitionRun, simulate_rand, simulate_ref
from gmd.sim.experiment import ExperimentConfig, ExperimentResult, run_experiment
from gmd.sim.policies import parse_policy, policy_names
from gmd.sim.scheduler import Schedule, simulate
from gmd.sim.swf import SwfLog, read_swf
from gmd.sim.workload import Workload, build_workload, processor_counts

__all__ = [
    "CoalitionRun",
    "ExperimentConfig",
    "ExperimentResult",
    "Schedule",
    "SwfLog",
    "Workload",
    "build_workload",
    "parse_policy",
    "policy_names",
    "processor_counts",
    "read_swf",
    "run_experiment",
    "simulate",
    "simulate_rand",
    "simulate_ref",
]
