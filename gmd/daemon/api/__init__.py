"""The daemon's HTTP API: one router module per resource, assembled by :mod:`.app`."""
