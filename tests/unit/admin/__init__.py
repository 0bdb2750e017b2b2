"""Tests of gmd/admin: gmd-admin's output, its terminal, its read-only ledger."""
