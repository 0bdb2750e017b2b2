"""Tests of gmd/daemon/ledger: accounting, migrations, retention, rollups."""
