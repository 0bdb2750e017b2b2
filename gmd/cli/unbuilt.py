"""What an entry point says while the service behind it does not exist yet."""

import sys


def not_built(program: str, arrives_with: str) -> None:
    """Tell the operator, on stderr, and exit 1 so that a unit or script notices."""
    print(
        f"{program} is not built yet: {arrives_with}.\n"
        "Meanwhile `gmd-admin gm --help` shows how the Greediness Metric judges a host.",
        file=sys.stderr,
    )
    sys.exit(1)
