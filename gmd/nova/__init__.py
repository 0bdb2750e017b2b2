"""gmd inside nova-scheduler: a weigher that places new servers by FALB's fairness-aware
criteria over the hosts' measured utilisation (:mod:`gmd.nova.weigher`, docs/nova.md).

Installed into Nova's environment (``pip install gmd[nova]``), it imports nothing of gmd's
daemon, agent or admin, nor their libraries: only :mod:`gmd.fairness` (numpy), the stdlib and
what Nova itself brings (tests/repository/test_layout.py).
"""
