"""What gmd-agent and gmd-daemon both need and nothing else: reading and validating TOML, times
as operators type them, logging set-up, the version, the options both command lines take.
Imports only the standard library and typer (which all three programs install)."""
