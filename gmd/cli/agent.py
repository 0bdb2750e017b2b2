"""gmd-agent: samples VMs through libvirt and pushes usage to the daemon (not built yet)."""

import sys


def main() -> None:
    print(
        "gmd-agent is not built yet: the libvirt collector arrives with the agent issue.\n"
        "Meanwhile `gmd-admin gm --help` shows how the Greediness Metric judges a host.",
        file=sys.stderr,
    )
    sys.exit(1)


if __name__ == "__main__":
    main()
