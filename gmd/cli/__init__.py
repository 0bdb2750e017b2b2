"""The entry points: argument parsing and wiring only. Nothing imports this package."""
