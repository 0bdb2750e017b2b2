"""The ledger: what gmd remembers. The store, interval accounting, rollups, retention; the
tables themselves and their migrations are :mod:`gmd.ledger_schema`'s (gmd-broker writes the
same database)."""
