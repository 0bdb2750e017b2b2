"""gmd-admin's commands, one module per family, as an operator groups them (as Slurm's
sreport splits its reports and the openstack client its command groups).

:mod:`gmd.admin.cli` registers them on its ``app``, in the order ``gmd-admin --help`` lists
them: ``accounting`` (standings, report, explain, plot: what the accounted ledger says),
``enforcement`` (actions, enforce, reset: what is done about it), ``database`` (``db``
upgrade, current, usage), ``batches`` (the batches agents sent, and the quarantined ones'
release and drop) and ``simulation`` (gm, whatif, simulate, demo: what would be, computed
rather than read). What they share is :mod:`gmd.admin.common`.
"""
