"""How one sample gets from an agent's ``POST /v1/samples`` into the ledger.

In the order it goes: :mod:`.transport` (the route, the body cap) → :mod:`.accept` (the one
place a batch is let in) → :mod:`.parse` (with :mod:`.fast_parse` for the common case) making a
:mod:`.record` → :mod:`.checks` (the daemon's settings, plausibility) and :mod:`.limits` (each
host's bounds) → :mod:`.store`, which writes it by :mod:`.one_statement` or
:mod:`.batch_writer`, naming what it holds by the ids of :mod:`.ids`.
"""
