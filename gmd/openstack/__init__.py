"""Reaching OpenStack, for every part of gmd that does: one client, one Placement reader.

:mod:`.client` builds a cloud's connection from its clouds.yaml entry, bounds every request by
a timeout, retries what may succeed when asked again, and turns every failure into one
:class:`~gmd.openstack.client.OpenStackError`, whose kind
(:class:`~gmd.openstack.client.OpenStackErrorKind`) says how it failed. :mod:`.placement` is
the one Placement client: what gmd-daemon's Placement view and gmd-broker read from
Placement.

It sits below the programs that use it, gmd-daemon (quotas, Placement, project names) and
gmd-broker (federation servers, spare capacity), and imports nothing of them
(tests/repository/test_layout.py): what a failure means to a caller is the caller's to say,
with kinds of its own (a quota not applied, writes disabled:
:class:`gmd.daemon.enforce.quotas.QuotaErrorKind`).
"""
