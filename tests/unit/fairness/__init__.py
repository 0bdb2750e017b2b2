"""Tests of gmd/fairness: the GM, its baselines, DRF, DirectContr, the policy."""
