"""gmd-agent: samples VMs through libvirt and pushes usage to the daemon (not built yet)."""

from gmd.cli.unbuilt import not_built


def main() -> None:
    not_built("gmd-agent", "the libvirt collector arrives with the agent issue")


if __name__ == "__main__":
    main()
