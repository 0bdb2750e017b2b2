"""The pure core: the Greediness Metric, its baselines, and DirectContr bookkeeping.

numpy only; no I/O, no database, no clock — every input is an argument. Everything else in gmd
calls in here; nothing in here imports the rest of gmd.

The package imports none of its modules: import what you use from the module that holds it
(`gmd.fairness.greediness`, `gmd.fairness.directcontr`, ...). A command line that only names
the GM paper's scenarios (`gmd.fairness.scenarios`) then does not load numpy.
"""
