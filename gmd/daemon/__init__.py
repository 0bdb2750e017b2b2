"""gmd-daemon: the central service. ``api/`` takes the agents' batches and serves their plans;
``ledger/`` stores samples and accounts intervals; ``enforce/`` turns standings into levels,
host plans and OpenStack quota changes. Never imports libvirt
(``tests/repository/test_layout.py``)."""
