"""Tests of gmd/agent: gmd-agent's configuration, loop, delivery, metrics and spool."""
