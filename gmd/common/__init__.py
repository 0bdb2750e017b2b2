"""What gmd-agent and gmd-daemon both need and nothing else: reading and validating TOML, times
as operators type them, logging set-up. Imports only the standard library."""
