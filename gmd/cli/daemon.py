"""gmd-daemon: ingests samples and keeps the ledger (not built yet)."""

from gmd.cli.unbuilt import not_built


def main() -> None:
    not_built("gmd-daemon", "the ledger and HTTP API arrive with the ledger issue")


if __name__ == "__main__":
    main()
