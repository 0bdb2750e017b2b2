"""Tests of gmd/daemon/api: ingest, refusals, limits, metrics, the read API."""
