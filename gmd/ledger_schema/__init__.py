"""The ledger's schema and how a database is brought to it: the tables (:mod:`.models`, with
their typed Core views in :mod:`.tables` and their kinds in :mod:`.kinds`), the Alembic runner
that creates and upgrades them from ``migrations/`` and the engine that opens the ledger
(:mod:`.migrate`).

gmd-daemon accounts in the ledger and gmd-broker files the federation's history in the same
database (``federation_events``, ``federation_standings``); both check its schema at start
and create it in an empty database. The schema therefore sits below both programs rather than
in the daemon's :mod:`gmd.daemon.ledger`, so that the broker imports nothing of the daemon
(tests/repository/test_layout.py), and it imports nothing of either: only SQLAlchemy, Alembic,
:mod:`gmd.common` and :mod:`gmd.wire` (whose resource table names the columns).
"""
