"""The kernel collector's counter files, parsed (pure): a cgroup's CPU time and block-device
bytes, a QEMU process's resident set, and the host's interfaces.

The collector parses the bytes it reads (:func:`cpu_stat_ns`, :func:`blkio_devices`,
:func:`io_stat_devices`, :class:`NetDevParser`) without decoding them: every VM's files are
parsed every tick. The ``parse_*`` functions take text, for the tests and the tools, and answer
as they do. Which file holds what, and why those files, is :mod:`gmd.agent.collect.kernel`'s
story; reading them is :mod:`gmd.agent.collect.kernel_files`'.
"""

from __future__ import annotations

import re
from collections.abc import Mapping


def parse_cpuacct_usage(text: str) -> int:
    """v1 ``cpuacct.usage``: one integer, nanoseconds."""
    return int(text.strip())


def cpu_stat_ns(data: bytes) -> int:
    """v2 ``cpu.stat``'s ``usage_usec``, as nanoseconds. The kernel prints it first: the
    first two fields are split off alone when they are that (the file has a dozen lines)."""
    head = data.split(None, 2)
    try:
        if head[0] == b"usage_usec":
            return int(head[1]) * 1000
    except (IndexError, ValueError):
        pass  # the general case says what is wrong
    fields = data.split()
    try:
        return int(fields[fields.index(b"usage_usec") + 1]) * 1000
    except ValueError:
        raise ValueError("no usage_usec") from None


def parse_cpu_stat(text: str) -> int:
    """v2 ``cpu.stat``'s ``usage_usec``, as nanoseconds."""
    return cpu_stat_ns(text.encode())


def parse_statm_resident(text: str, page_size: int) -> int:
    """``/proc/<pid>/statm``'s second field (resident pages), in bytes."""
    return int(text.split(None, 2)[1]) * page_size


# The parsers below run for every VM and tick: one regular expression each, which finds every
# device in one call. The kernel prints a device's lines (v1: Read, Write, Sync, Async,
# Discard, Total) and fields (v2: rbytes= wbytes= rios= …) in a fixed order; a file with a
# device the expression does not match is an error rather than a VM without disk I/O.
# (Possessive quantifiers: they match what greedy ones would, without backtracking.)
_BLKIO_DEVICE = re.compile(rb"^(\S++) Read (\d++)\n\1 Write (\d++)$", re.M)
_IO_STAT_DEVICE = re.compile(rb"^(\S++) rbytes=(\d++) wbytes=(\d++)", re.M)


def blkio_devices(data: bytes) -> dict[str, tuple[int, int]]:
    """:func:`parse_blkio_service_bytes` of the file's bytes, as the collector reads them."""
    out = {f"host:{dev.decode()}": (int(r), int(w)) for dev, r, w in _BLKIO_DEVICE.findall(data)}
    if len(out) != data.count(b" Read "):
        raise ValueError("a device without its Read and Write lines")
    return out


def io_stat_devices(data: bytes) -> dict[str, tuple[int, int]]:
    """:func:`parse_io_stat` of the file's bytes, as the collector reads them."""
    out = {f"host:{dev.decode()}": (int(r), int(w)) for dev, r, w in _IO_STAT_DEVICE.findall(data)}
    if len(out) != data.count(b" rbytes="):
        raise ValueError("a device line without rbytes= and wbytes=")
    return out


def parse_blkio_service_bytes(text: str) -> dict[str, tuple[int, int]]:
    """v1 ``blkio.throttle.io_service_bytes``: ``{"host:MAJ:MIN": (read, written)}``. A device
    appears once it has done I/O; the ``Total`` line is the sum of the others."""
    return blkio_devices(text.encode())


def parse_io_stat(text: str) -> dict[str, tuple[int, int]]:
    """v2 ``io.stat``: ``{"host:MAJ:MIN": (rbytes, wbytes)}``."""
    return io_stat_devices(text.encode())


NetCounters = Mapping[bytes, tuple[int, int]]
"""Every interface's bytes as its guest sees them, ``{name: (received, transmitted)}``
(:func:`net_dev_guest_view`), read once per tick for every VM's taps."""


_UNSEEN: tuple[bytes, tuple[int, int]] = (b"", (0, 0))
"""a line not parsed before (by identity)"""


class NetDevParser:
    """Parses ``/proc/net/dev``'s bytes per interface, as a guest on it as a tap sees them:
    swapped as libvirt swaps them (what the host's tap transmits, the guest received). Two
    header lines, then ``name: rx_bytes rx_packets … (8 fields) tx_bytes …``.

    The file has a line per interface of the host and is parsed every tick: on 100 VMs,
    parsing it all took a tenth of the time the ``pread`` of every VM's files takes. So names
    are left as bytes, and a line the same as at the last parse (an interface that moved no
    packet: idle taps, the host's unused devices) is not parsed again, which is safe because
    a line's parse is a function of its bytes alone. A line that changed costs a lookup more
    than before.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[bytes, tuple[bytes, tuple[int, int]] | None] = {}
        """each line of the last parse → its interface and counters (``None``: not one)"""

    def __call__(self, data: bytes) -> dict[bytes, tuple[int, int]]:
        lines = data.splitlines()
        del lines[:2]
        last: dict[bytes, tuple[bytes, tuple[int, int]] | None] = {}
        out = {}
        known = self._last.get
        for line in lines:
            item = known(line, _UNSEEN)
            if item is _UNSEEN:
                name, sep, rest = line.partition(b":")
                fields = rest.split(None, 9)  # the nine first, not the sixteen
                if sep and len(fields) >= 9:
                    item = (name.strip(), (int(fields[8]), int(fields[0])))
                else:
                    item = None
            last[line] = item
            if item is not None:
                out[item[0]] = item[1]
        self._last = last
        return out


def net_dev_guest_view(data: bytes) -> dict[bytes, tuple[int, int]]:
    """``/proc/net/dev``'s ``{interface: (received, transmitted)}`` bytes as a guest on it as
    a tap sees them (:class:`NetDevParser`)."""
    return NetDevParser()(data)


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """``/proc/net/dev``: ``{interface: (received, transmitted)}`` bytes, as the host sees
    them."""
    return {name.decode(): (rx, tx) for name, (tx, rx) in net_dev_guest_view(text.encode()).items()}
