"""A connection libvirt refuses for want of rights says what the agent's user needs.

As root these tests cannot make libvirtd refuse (root may always connect), so the refusals
are libvirt's own error objects with the codes and words libvirtd sends a user without polkit
("authentication unavailable: no polkit agent available …") or without the socket's rights."""

from __future__ import annotations

import libvirt
import pytest

from gmd.agent.libvirt_conn import refused

POLKIT = (
    "authentication unavailable: no polkit agent available to authenticate action"
    " 'org.libvirt.unix.manage'"
)
SOCKET = "Failed to connect socket to '/var/run/libvirt/libvirt-sock': Permission denied"


def error(code: int, message: str) -> libvirt.libvirtError:
    exc = libvirt.libvirtError(message)
    exc.err = (code, libvirt.VIR_FROM_RPC, message, libvirt.VIR_ERR_ERROR, None, None, None, 0, 0)
    return exc


@pytest.mark.parametrize(
    ("code", "message"),
    [(libvirt.VIR_ERR_AUTH_UNAVAILABLE, POLKIT), (libvirt.VIR_ERR_SYSTEM_ERROR, SOCKET)],
    ids=["no-polkit", "socket-rights"],
)
def test_a_refusal_for_want_of_rights_says_what_the_user_needs(code: int, message: str) -> None:
    said = refused("qemu:///system", error(code, message))
    assert said.startswith(f"cannot connect to libvirt at qemu:///system: {message} — ")
    assert "run gmd-agent as root, or as a member of group libvirt" in said
    assert 'auth_unix_rw = "none"' in said and "\n" not in said


def test_another_failure_is_said_as_libvirt_says_it() -> None:
    message = "Failed to connect socket to '/var/run/libvirt/libvirt-sock': No such file"
    said = refused("qemu:///system", error(libvirt.VIR_ERR_SYSTEM_ERROR, message))
    assert said == f"cannot connect to libvirt at qemu:///system: {message}"
