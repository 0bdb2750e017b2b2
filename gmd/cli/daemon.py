"""gmd-daemon: ingests samples and keeps the ledger (not built yet)."""

import sys


def main() -> None:
    print(
        "gmd-daemon is not built yet: the ledger and HTTP API arrive with the ledger issue.\n"
        "Meanwhile `gmd-admin gm --help` shows how the Greediness Metric judges a host.",
        file=sys.stderr,
    )
    sys.exit(1)


if __name__ == "__main__":
    main()
