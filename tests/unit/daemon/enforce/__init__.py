"""Tests of gmd/daemon/enforce: levels, host plans under contention, quotas."""
