"""Tests of gmd/agent/apply: the appliers, the cgroup backend, the plan's edge."""
