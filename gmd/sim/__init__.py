"""Replaying job traces through fairness policies for organizations that share processors.

``swf`` reads traces, ``workload`` cuts them into samples (with CloudShare's local background
load, if asked), ``scheduler`` is the event loop, ``policies`` the registry, ``coalitions`` Ref
and Rand, ``shapley`` and ``measures`` the judging, ``bootstrap`` which orderings of policies the
samples settle, ``experiment`` the parallel runs, ``command`` the CLI text.
"""
