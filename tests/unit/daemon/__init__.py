"""Tests of gmd/daemon: its configuration and the customers' project names."""
