"""gmd-agent: everything that runs on a compute host.

It reads the VMs (``collect/``), keeps closed intervals in a spool and sends them to the daemon
(``spool``, ``sender``, ``client``), and applies the daemon's throttling plan (``apply/``).
Nothing here imports the daemon's libraries (SQLAlchemy, FastAPI, ...): a compute host installs
``gmd[agent]`` only. ``tests/repository/test_layout.py`` keeps it so.
"""
