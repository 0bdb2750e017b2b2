"""Tests of gmd/daemon/reports: standings, usage, explain, plot, what-if."""
