"""The agent's side of gmd: reading VMs' raw counters and turning them into interval usage.

One module per source behind :class:`gmd.agent.collect.base.Collector` (``libvirt``, ``kernel``,
``replay``); pure decision modules take data and return data (``counters``: cumulative → delta
with reset detection, ``ownership``: domain metadata → customer and flavor, ``aggregate``:
deltas → per-interval usage, ``capacity``: what the host offers).
"""
