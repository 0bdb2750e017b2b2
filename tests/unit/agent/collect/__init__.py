"""Tests of gmd/agent/collect: the collectors, counters, ownership, the replay."""
