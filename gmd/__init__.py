"""gmd, the Greediness Metric daemon: fairness accounting and enforcement for clouds.

The data path is the package layout: ``collect`` → ``ingest`` → ``ledger`` (account) →
``enforce`` → ``report``, all calling the pure math in ``gmd.fairness``.
"""

__version__ = "0.1.0"
