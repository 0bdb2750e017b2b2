"""Placement vouches for what hosts claim (``[placement] verify``: on wherever a cloud is
configured).

A host's token lets it post batches; it does not make what they say true. The cloud knows
the truth: Placement holds each compute host's resource provider with its inventory, and every
instance (consumer: the server id, which is the libvirt domain uuid an agent reports) with its
allocations (its flavor's VCPU and MEMORY_MB) on one provider and its owning project.
:mod:`gmd.openstack.placement` reads it (the one Placement client, which gmd-broker reads
through too), :mod:`.view` caches it and checks batches against it, :mod:`.recheck` checks
later the batches accepted while Placement could not be reached.
"""
