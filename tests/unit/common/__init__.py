"""Tests of gmd/common: the configuration options' declarations."""
