"""The boot files of the real-VM tests' guests: Debian's cloud kernel and a busybox initramfs.

The kernel comes from Debian's current `linux-image-<version>-cloud-amd64` package (the one the
`linux-image-cloud-amd64` metapackage depends on), fetched with `apt-get download` and unpacked
with `dpkg-deb -x`, never installed. The initramfs is a gzipped newc cpio written here: the host's
statically linked `/bin/busybox` (Debian's busybox-static), the virtio modules the kernel builds
as modules (with the modules they depend on, read from each module's `.modinfo`), and an `/init`
whose behaviour the kernel command line chooses:

- `gmd.role=spin` burns the vCPU in a shell loop, reads its whole virtio disk (`/dev/vda`, with
  O_DIRECT so every pass reaches QEMU) and writes 256 KiB of it about once a second, and sends
  ICMP echo requests to the link-local all-hosts group 224.0.0.1 from a link-local address
  (169.254.77.7) on its NIC, five a second: the tap is isolated, nothing answers and nothing
  leaves the host.
- `gmd.role=job` runs work of a known size in bursts, as a moderate customer's batch jobs do:
  job k (k = 1, 2, ...) counts to `gmd.job_loops=N` in the shell (default 100000: ~1.6 s on an
  idle 2-core host under TCG), a pure CPU loop, then sleeps `gmd.job_pause=S` seconds (default
  2), and so on. It prints
  `gmd-job: start K UPTIME` and `gmd-job: end K UPTIME` on the serial console around each job
  (UPTIME: the guest's /proc/uptime, 10 ms steps), so that the guest's work itself is measured,
  not only its QEMU's CPU time (tests/support/protection.py reads them).
- `gmd.role=idle` (the default) only sleeps.
- `gmd.poweroff_after=S` (with either role) powers the guest off from inside S seconds after its
  devices are up, as a guest's own `poweroff` does: the kernel's ACPI power-off, a SHUTDOWN
  event from QEMU, libvirt ending the domain.

Either prints `gmd-guest: ready role=ROLE` on the serial console once its devices are up, or
`gmd-guest: error ...` when one is missing.

Everything is cached under `var/guest/<kernel version>/` (the kernel and the modules) and
`var/guest/initramfs-<hash>.img` (keyed by what went into it), so a warm build costs a few tens
of milliseconds. `python -m tests.support.guest_image` builds it and prints the two paths.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import io
import lzma
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = REPO / "var" / "guest"
KERNEL_METAPACKAGE = "linux-image-cloud-amd64"
BUSYBOX = Path("/bin/busybox")
# What the guests need: the PCI transport, disk, NIC and balloon (for the balloon stats).
WANTED_MODULES = ("virtio_pci", "virtio_blk", "virtio_net", "virtio_balloon")

INIT_SCRIPT = r"""#!/bin/sh
# gmd test guest: see tests/support/guest_image.py.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
for m in $(cat /lib/modules/load-order); do
    insmod "/lib/modules/$m.ko" || echo "gmd-guest: error: insmod $m failed"
done
role=idle
poweroff_after=
job_loops=100000
job_pause=2
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    gmd.role=*) role=${arg#gmd.role=} ;;
    gmd.poweroff_after=*) poweroff_after=${arg#gmd.poweroff_after=} ;;
    gmd.job_loops=*) job_loops=${arg#gmd.job_loops=} ;;
    gmd.job_pause=*) job_pause=${arg#gmd.job_pause=} ;;
    esac
done
ip link set lo up
for _ in $(seq 100); do
    [ -b /dev/vda ] && [ -e /sys/class/net/eth0 ] && break
    sleep 0.1
done
[ -b /dev/vda ] || echo "gmd-guest: error: no /dev/vda"
[ -e /sys/class/net/eth0 ] || echo "gmd-guest: error: no eth0"
ip link set eth0 up
if [ -n "$poweroff_after" ]; then
    (sleep "$poweroff_after"; echo "gmd-guest: powering off"; poweroff -f) &
fi
case "$role" in
spin)
    ip addr add 169.254.77.7/16 dev eth0
    (
        while :; do
            dd if=/dev/vda of=/dev/null bs=256k iflag=direct 2>/dev/null
            dd if=/dev/zero of=/dev/vda bs=64k count=4 oflag=direct conv=notrunc 2>/dev/null
            sleep 1
        done
    ) &
    (
        while :; do
            ping -q -I eth0 -s 1000 -i 0.2 224.0.0.1 >/dev/null 2>&1
            sleep 1
        done
    ) &
    echo "gmd-guest: ready role=spin"
    # every vCPU of the guest spins, not only the first
    cpus=$(grep -c ^processor /proc/cpuinfo)
    for _ in $(seq 2 "$cpus"); do (while :; do :; done) & done
    while :; do :; done
    ;;
job)
    echo "gmd-guest: ready role=job"
    k=0
    while :; do
        k=$((k + 1))
        read -r up _ </proc/uptime
        echo "gmd-job: start $k $up"
        i=0
        while [ "$i" -lt "$job_loops" ]; do i=$((i + 1)); done
        read -r up _ </proc/uptime
        echo "gmd-job: end $k $up"
        sleep "$job_pause"
    done
    ;;
*)
    echo "gmd-guest: ready role=$role"
    while :; do sleep 3600; done
    ;;
esac
"""


class GuestImageError(RuntimeError):
    """The guest's kernel or initramfs could not be had; the message says which step failed."""


@dataclass(frozen=True)
class GuestImage:
    kernel: Path
    initrd: Path
    kernel_version: str  # e.g. "6.1.0-56-cloud-amd64"


def build_guest_image(cache: Path = DEFAULT_CACHE) -> GuestImage:
    """The kernel and initramfs for the test guests, built once and then found in `cache`."""
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / ".lock"):
        kdir = _kernel_dir(cache)
        initrd = _initramfs(cache, kdir)
    return GuestImage(kdir / "vmlinuz", initrd, kdir.name)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _log(msg: str) -> None:
    print(f"gmd guest image: {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    except FileNotFoundError as e:
        raise GuestImageError(f"{what}: {cmd[0]} is not installed") from e
    except subprocess.TimeoutExpired as e:
        raise GuestImageError(f"{what}: {' '.join(cmd)} took over 600 s") from e
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise GuestImageError(f"{what}: {' '.join(cmd)} failed: {' / '.join(tail)}")
    return out.stdout


# --- the kernel ------------------------------------------------------------------------------


def _kernel_package(cache: Path) -> str | None:
    """The cloud kernel package the metapackage depends on today, or None if apt cannot tell."""

    def ask() -> str | None:
        try:
            out = subprocess.run(
                ["apt-cache", "depends", KERNEL_METAPACKAGE],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return None
        m = re.search(r"Depends: (linux-image-\S+-cloud-amd64)\s*$", out, re.M)
        return m.group(1) if m else None

    # apt-cache takes over a second here (no binary package cache): ask it again only when
    # apt's package lists have changed since the last answer.
    memo = cache / "kernel-package"
    stamp = _apt_lists_stamp()
    if stamp and memo.exists():
        old_stamp, _, old_pkg = memo.read_text().strip().partition(" ")
        if old_stamp == stamp and old_pkg:
            return old_pkg
    pkg = ask()
    if pkg is None and os.geteuid() == 0 and shutil.which("apt-get"):
        _log(f"apt-cache does not know {KERNEL_METAPACKAGE}: apt-get update")
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=600)
        pkg = ask()
        stamp = _apt_lists_stamp()
    if pkg and stamp:
        memo.write_text(f"{stamp} {pkg}\n")
    return pkg


def _apt_lists_stamp() -> str:
    """Changes whenever apt-get update brings new package lists."""
    lists = Path("/var/lib/apt/lists")
    try:
        mtimes = [e.stat().st_mtime_ns for e in os.scandir(lists) if "Packages" in e.name]
    except OSError:
        return ""
    return f"{len(mtimes)}:{max(mtimes)}" if mtimes else ""


def _kernel_dir(cache: Path) -> Path:
    """var/guest/<version>/ with vmlinuz, the modules and their load order; fetched if missing."""
    pkg = _kernel_package(cache)
    if pkg is None:
        done = sorted(
            (d for d in cache.iterdir() if (d / "complete").exists()),
            key=lambda d: d.stat().st_mtime,
        )
        if not done:
            raise GuestImageError(
                f"cannot tell which kernel {KERNEL_METAPACKAGE} means (apt-cache depends "
                f"{KERNEL_METAPACKAGE} names none) and none is cached under {cache}"
            )
        _log(f"apt cannot name the current cloud kernel; using the cached {done[-1].name}")
        return done[-1]
    kdir = cache / pkg.removeprefix("linux-image-")
    if (kdir / "complete").exists():
        return kdir
    _log(f"fetching {pkg}")
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp_name:
        tmp = Path(tmp_name)
        # As root, apt's download sandbox user cannot write here: download as root instead.
        _run(
            ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", pkg],
            f"downloading the kernel package {pkg}",
            cwd=tmp,
        )
        debs = list(tmp.glob("*.deb"))
        if len(debs) != 1:
            raise GuestImageError(f"apt-get download {pkg} left {len(debs)} .deb files in {tmp}")
        tree = tmp / "tree"
        _run(["dpkg-deb", "-x", str(debs[0]), str(tree)], f"unpacking {debs[0].name}")
        out = tmp / "out"
        (out / "modules").mkdir(parents=True)
        kernels = list((tree / "boot").glob("vmlinuz-*"))
        if len(kernels) != 1:
            raise GuestImageError(f"{debs[0].name} has {len(kernels)} boot/vmlinuz-* files")
        shutil.copyfile(kernels[0], out / "vmlinuz")
        moddirs = list((tree / "lib" / "modules").iterdir())
        if len(moddirs) != 1:
            raise GuestImageError(f"{debs[0].name} has {len(moddirs)} lib/modules/* directories")
        order = []
        for name, data in _modules_to_load(moddirs[0]):
            (out / "modules" / f"{name}.ko").write_bytes(data)
            order.append(name)
        (out / "modules" / "load-order").write_text("\n".join(order) + "\n")
        (out / "package").write_text(debs[0].name + "\n")
        (out / "complete").touch()
        shutil.rmtree(kdir, ignore_errors=True)
        out.rename(kdir)
    return kdir


def _modname(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    return re.sub(r"\.ko(\.\w+)?$", "", base).replace("-", "_")


def _modules_to_load(moddir: Path) -> list[tuple[str, bytes]]:
    """WANTED_MODULES and what they depend on, dependencies first; built-in ones left out."""
    builtin_list = moddir / "modules.builtin"
    builtin = {_modname(line) for line in builtin_list.read_text().split() if line}
    files = {_modname(str(p)): p for p in (moddir / "kernel").rglob("*.ko*")}
    loaded: list[tuple[str, bytes]] = []
    seen: set[str] = set()

    def visit(name: str, wanted_by: str) -> None:
        if name in seen or name in builtin:
            return
        seen.add(name)
        if name not in files:
            raise GuestImageError(
                f"module {name} (needed by {wanted_by}) is neither built into the kernel nor "
                f"under {moddir}/kernel"
            )
        data = _read_module(files[name])
        info = _modinfo(data, files[name])
        for dep in filter(None, info.get("depends", "").split(",")):
            visit(dep.replace("-", "_"), name)
        loaded.append((name, data))

    for name in WANTED_MODULES:
        visit(name, "the test guest")
    return loaded


def _read_module(path: Path) -> bytes:
    if path.name.endswith(".ko"):
        return path.read_bytes()
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(path.read_bytes())
    raise GuestImageError(f"{path}: compressed modules other than .xz are not supported")


def _modinfo(elf: bytes, where: Path) -> dict[str, str]:
    """The key=value strings of a kernel module's .modinfo section."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise GuestImageError(f"{where} is not a little-endian 64-bit ELF module")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)

    def section(i: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", elf, shoff + i * shentsize
        )
        return name, offset, size

    _, stroff, _ = section(shstrndx)
    for i in range(shnum):
        name, offset, size = section(i)
        end = elf.index(b"\0", stroff + name)
        if elf[stroff + name : end] == b".modinfo":
            fields = elf[offset : offset + size].split(b"\0")
            pairs = (f.decode(errors="replace").partition("=") for f in fields if b"=" in f)
            return {k: v for k, _, v in pairs}
    raise GuestImageError(f"{where} has no .modinfo section")


# --- the initramfs ---------------------------------------------------------------------------


def _static_busybox() -> bytes:
    if not BUSYBOX.is_file():
        raise GuestImageError(f"{BUSYBOX} is missing: apt-get install busybox-static")
    data = BUSYBOX.read_bytes()
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        (ptype,) = struct.unpack_from("<I", data, phoff + i * phentsize)
        if ptype == 3:  # PT_INTERP: dynamically linked, useless without its libraries
            raise GuestImageError(
                f"{BUSYBOX} is dynamically linked: apt-get install busybox-static"
            )
    return data


class _Cpio:
    """A newc ("070701") cpio archive, as the kernel unpacks an initramfs."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.ino = 0

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)):
        self.ino += 1
        bname = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, *rdev, len(bname), 0]
        self.buf.write(b"070701" + b"".join(b"%08X" % f for f in fields) + bname)
        self.buf.write(b"\0" * (-(110 + len(bname)) % 4))
        self.buf.write(data)
        self.buf.write(b"\0" * (-len(data) % 4))

    def dir(self, name: str) -> None:
        self._entry(name, 0o040755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, 0o100000 | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, 0o120777, target.encode())

    def chardev(self, name: str, major: int, minor: int) -> None:
        self._entry(name, 0o020600, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return self.buf.getvalue()


def _initramfs(cache: Path, kdir: Path) -> Path:
    cpio = _Cpio()
    for d in ("bin", "dev", "proc", "sys", "tmp", "lib", "lib/modules"):
        cpio.dir(d)
    cpio.chardev("dev/console", 5, 1)
    cpio.file("bin/busybox", _static_busybox(), 0o755)
    cpio.symlink("bin/sh", "busybox")
    order = (kdir / "modules" / "load-order").read_text()
    cpio.file("lib/modules/load-order", order.encode())
    for name in order.split():
        cpio.file(f"lib/modules/{name}.ko", (kdir / "modules" / f"{name}.ko").read_bytes())
    cpio.file("init", INIT_SCRIPT.encode(), 0o755)
    archive = cpio.finish()
    key = hashlib.sha256(kdir.name.encode() + b"\0" + archive).hexdigest()[:16]
    path = cache / f"initramfs-{key}.img"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(gzip.compress(archive, compresslevel=6, mtime=0))
        tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        image = build_guest_image(args.cache)
    except GuestImageError as e:
        print(f"gmd guest image: {e}", file=sys.stderr)
        return 1
    print(f"kernel  {image.kernel}\ninitrd  {image.initrd}")
    print(f"({image.kernel_version}, {time.monotonic() - t0:.2f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
