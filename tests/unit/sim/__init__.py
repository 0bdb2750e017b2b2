"""Tests of gmd/sim: SWF traces, the scheduler, policies, Shapley and Ref."""
