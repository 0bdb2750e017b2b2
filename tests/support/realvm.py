"""Two real QEMU guests under a real libvirtd, for the tests that need real counters.

`real_guests` (a session-scoped pytest fixture) starts libvirtd through `tests/scripts/libvirt.sh`
(installing it on first use), builds or finds the guest kernel and initramfs
(`tests/support/guest_image.py`), and boots two tiny TCG guests:

- `guests.spin`: burns its one vCPU, reads (and a little writes) its virtio disk, and sends
  packets on its NIC, so its cpu.time, block.0.rd/wr.* and net.0.tx.* all move;
- `guests.idle`: sleeps.

Each is type='qemu' (TCG, deterministic on any host), 1 vCPU, 96 MiB, a virtio disk backed by an
8 MiB raw file, an `<interface type='ethernet'>` on its own tap (isolated: no bridge, no host
address), a virtio balloon with stats every 2 s, its serial console in a file, and Nova
metadata (namespace NOVA_NS) naming a project of its own and the flavor m1.tiny, as Nova writes
it, so the agent's ownership code finds a customer for each.

The domains are *defined* (persistent) and then started, as Nova's are, not created transient:
live tuning (`setSchedulerParametersFlags(..., VIR_DOMAIN_AFFECT_LIVE)`, e.g. `vcpu_quota` in
issue 5) then changes only the running guest, and the persistent definition (`AFFECT_CONFIG`,
`XMLDesc(VIR_DOMAIN_XML_INACTIVE)`) stays as written here, so a test can tell the two apart; a
transient domain has no persistent side at all. Teardown destroys and undefines both, removes
their taps and disk files (the console logs stay, for a post-mortem), whatever the tests did. Names
carry the pytest process id (`gmd-test-spin-<pid>`), so two sessions on one host do not collide,
and a session that was killed leaves domains that the next one removes.

Use it from a test module with `pytest_plugins = ("tests.support.realvm",)` and a `real_guests`
argument: the plugin is registered once, so every module naming it shares one pair of guests.
Import other names from tests.support.realvm inside the tests (or under TYPE_CHECKING), not at the
module's top, or pytest warns that the plugin was imported before it could rewrite its asserts.
Outside pytest: `with running_guests(workdir) as guests: ...`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import pytest

from tests.support.guest_image import GuestImageError, build_guest_image

REPO = Path(__file__).resolve().parents[2]
LIBVIRT_SH = REPO / "tests" / "scripts" / "libvirt.sh"
NOVA_NS = "http://openstack.org/xmlns/libvirt/nova/1.1"
NAME_PREFIX = "gmd-test-"
MEMORY_MIB = 96
DISK_MIB = 8
BOOT_TIMEOUT = 90.0  # seconds for both guests to report ready; ~5 s is usual under TCG
FLAVOR = "m1.tiny"
BOOT_WAVE = 10  # guests booted together by many_guests


class RealVMError(RuntimeError):
    """Setting up the real guests failed; the message names the step, domain or file."""


@dataclass(frozen=True)
class Guest:
    role: str  # "spin" or "idle"
    name: str  # libvirt domain name, e.g. gmd-test-spin-1234
    uuid: str  # libvirt domain uuid
    project_uuid: str  # the Nova owner project: the customer this VM belongs to
    user_uuid: str  # the Nova owner user
    tap: str  # host tap device of its NIC (net.0.name in the stats)
    disk: Path  # raw disk image (block.0.path in the stats)
    disk_target: str  # "vda"
    disk_cache: str  # "none" (O_DIRECT, as Nova opens local disks) where the filesystem can
    console_log: Path  # the guest's serial console
    vcpus: int
    memory_mib: int
    flavor: str


@dataclass(frozen=True)
class RealGuests:
    uri: str  # "qemu:///system"
    spin: Guest
    idle: Guest

    @property
    def guests(self) -> tuple[Guest, Guest]:
        return (self.spin, self.idle)

    @property
    def names(self) -> tuple[str, str]:
        return (self.spin.name, self.idle.name)

    @property
    def uuids(self) -> tuple[str, str]:
        return (self.spin.uuid, self.idle.uuid)

    @property
    def project_uuids(self) -> tuple[str, str]:
        return (self.spin.project_uuid, self.idle.project_uuid)

    def by_name(self, name: str) -> Guest:
        for g in self.guests:
            if g.name == name:
                return g
        raise KeyError(name)

    def connect(self):
        """A new libvirt connection to the guests' daemon (the caller closes it)."""
        return _libvirt().open(self.uri)


@pytest.fixture(scope="session")
def real_guests(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealGuests]:
    """Two running guests, one spinning and one idle; destroyed and undefined at session end."""
    try:
        with running_guests(tmp_path_factory.mktemp("realvm")) as guests:
            yield guests
    except (RealVMError, GuestImageError) as e:
        pytest.fail(f"real VMs: {e}", pytrace=False)


def _libvirt():
    """The libvirt binding, imported only when needed: without it only these tests fail."""
    try:
        import libvirt
    except ImportError as e:
        raise RealVMError(
            "libvirt-python is not installed: it is gmd's `agent` extra (pip install -e "
            "'.[agent]', which builds against Debian's libvirt-dev)"
        ) from e
    return libvirt


def start_libvirt() -> str:
    """Runs tests/scripts/libvirt.sh (install if needed, start if needed) and returns the URI."""
    try:
        out = subprocess.run(["bash", str(LIBVIRT_SH)], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:
        raise RealVMError(f"{LIBVIRT_SH} took over 900 s") from e
    if out.returncode != 0:
        msg = out.stderr.strip().splitlines()[-1:] or [f"exit status {out.returncode}"]
        raise RealVMError(f"{LIBVIRT_SH} failed: {msg[0]}")
    return out.stdout.strip().splitlines()[-1]


@contextmanager
def running_guests(workdir: Path) -> Iterator[RealGuests]:
    """Boots the spinning and the idle guest with disks and consoles under `workdir`."""
    libvirt = _libvirt()
    uri = start_libvirt()
    image = build_guest_image()
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as e:
        raise RealVMError(f"cannot connect to {uri}: {e}") from e
    try:
        remove_stale_domains(conn)
        guests: dict[str, Guest] = {}
        # Destroying takes ~2 s a domain: both at once. Runs however the block below ends.
        with ExitStack() as cleanup:
            cleanup.callback(_remove_domains, conn, guests)
            pid = os.getpid()
            for role in ("spin", "idle"):
                guest = _new_guest(role, pid, workdir)
                guests[role] = guest
                xml = domain_xml(guest, image.kernel, image.initrd)
                try:
                    dom = conn.defineXML(xml)
                    dom.create()
                except libvirt.libvirtError as e:
                    raise RealVMError(f"could not define and start {guest.name}: {e}") from e
            _wait_ready(conn, list(guests.values()))
            yield RealGuests(uri, guests["spin"], guests["idle"])
    finally:
        conn.close()


@contextmanager
def many_guests(workdir: Path, count: int) -> Iterator[tuple[str, list[Guest]]]:
    """``count`` idle guests (for benchmarks: as many as the machine holds, 96 MiB each), booted
    together; yields the URI and the guests, and removes them however the block ends."""
    libvirt = _libvirt()
    uri = start_libvirt()
    image = build_guest_image()
    conn = libvirt.open(uri)
    try:
        remove_stale_domains(conn)
        guests: dict[str, Guest] = {}
        with ExitStack() as cleanup:
            cleanup.callback(_remove_domains, conn, guests)
            # In waves: dozens of TCG kernels booting at once on a few cores miss their timer
            # checks and panic.
            for first in range(0, count, BOOT_WAVE):
                wave = []
                for k in range(first, min(first + BOOT_WAVE, count)):
                    guest = _new_guest("idle", os.getpid(), workdir, index=k)
                    guests[guest.name] = guest
                    wave.append(guest)
                    try:
                        conn.defineXML(domain_xml(guest, image.kernel, image.initrd)).create()
                    except libvirt.libvirtError as e:
                        raise RealVMError(f"could not define and start {guest.name}: {e}") from e
                _wait_ready(conn, wave, timeout_s=BOOT_TIMEOUT + 5 * len(wave))
            yield uri, list(guests.values())
    finally:
        conn.close()


def _new_guest(role: str, pid: int, workdir: Path, index: int | None = None) -> Guest:
    suffix = "" if index is None else str(index)
    name = f"{NAME_PREFIX}{role}{suffix}-{pid}"
    disk = workdir / f"{name}.raw"
    # Written, not sparse: reading a hole costs the host no I/O, which the kernel collector's
    # cgroup counters would then (rightly) not show.
    disk.write_bytes(bytes(DISK_MIB << 20))
    console = workdir / f"{name}.console.log"
    return Guest(
        role=role,
        name=name,
        uuid=str(uuid.uuid4()),
        project_uuid=uuid.uuid4().hex,  # as Keystone writes it, and Nova after it
        user_uuid=str(uuid.uuid4()),
        # At most 15 characters, not libvirt's vnet prefix.
        tap=f"gmdt{pid % 10**7}{role[0]}{suffix}",
        disk=disk,
        disk_target="vda",
        disk_cache="none" if _direct_io(disk) else "writeback",
        console_log=console,
        vcpus=1,
        memory_mib=MEMORY_MIB,
        flavor=FLAVOR,
    )


def _direct_io(path: Path) -> bool:
    """Whether ``path``'s filesystem takes ``O_DIRECT`` (tmpfs does not)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        return False
    return True


def domain_xml(
    guest: Guest, kernel: Path, initrd: Path, *, cmdline: str = "", disk_source: str = ""
) -> str:
    """The persistent definition: Nova-style metadata, TCG, kernel boot, virtio devices;
    ``cmdline`` is added to the guest kernel's command line (see tests/support/guest_image.py), and
    ``disk_source`` (a ``<disk type='network'>``'s ``<source>`` element) puts the guest's disk
    on the network instead of in ``guest.disk``.

    QEMU runs as root without relabelling (static DAC label): libvirt would otherwise chown
    the shared kernel and initramfs in var/guest/ to its qemu user while the guest runs.
    """
    q = quoteattr
    mac = "52:54:00:" + ":".join(f"{b:02x}" for b in uuid.UUID(guest.uuid).bytes[:3])
    kind, source = (
        ("network", disk_source)
        if disk_source
        else ("file", f"<source file={q(str(guest.disk))}/>")
    )
    # no_timer_check: a TCG guest on a busy host can miss the kernel's IO-APIC timer check.
    boot_args = f"console=ttyS0 quiet panic=1 no_timer_check gmd.role={guest.role} {cmdline}"
    driver = f"<driver name='qemu' type='raw' cache={q(guest.disk_cache)}/>"
    disk = f"<disk type='{kind}' device='disk'>{driver}{source}"
    return f"""<domain type='qemu'>
  <name>{escape(guest.name)}</name>
  <uuid>{guest.uuid}</uuid>
  <metadata>
    <nova:instance xmlns:nova="{NOVA_NS}">
      <nova:package version="gmd-test"/>
      <nova:name>{escape(guest.name)}</nova:name>
      <nova:flavor name={q(guest.flavor)}>
        <nova:memory>{guest.memory_mib}</nova:memory>
        <nova:disk>0</nova:disk>
        <nova:swap>0</nova:swap>
        <nova:ephemeral>0</nova:ephemeral>
        <nova:vcpus>{guest.vcpus}</nova:vcpus>
      </nova:flavor>
      <nova:owner>
        <nova:user uuid={q(guest.user_uuid)}>gmd-test</nova:user>
        <nova:project uuid={q(guest.project_uuid)}>gmd-test-{guest.role}</nova:project>
      </nova:owner>
    </nova:instance>
  </metadata>
  <memory unit='MiB'>{guest.memory_mib}</memory>
  <vcpu placement='static'>{guest.vcpus}</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{escape(str(kernel))}</kernel>
    <initrd>{escape(str(initrd))}</initrd>
    <cmdline>{escape(boot_args)}</cmdline>
  </os>
  <features><acpi/></features>
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    {disk}
      <target dev={q(guest.disk_target)} bus='virtio'/>
    </disk>
    <interface type='ethernet'>
      <mac address='{mac}'/>
      <target dev={q(guest.tap)}/>
      <model type='virtio'/>
      <rom enabled='no'/>
    </interface>
    <serial type='file'>
      <source path={q(str(guest.console_log))}/>
      <target port='0'/>
    </serial>
    <controller type='usb' model='none'/>
    <memballoon model='virtio'>
      <stats period='2'/>
    </memballoon>
  </devices>
  <seclabel type='static' model='dac' relabel='no'>
    <label>+0:+0</label>
  </seclabel>
</domain>
"""


def _wait_ready(conn, guests: list[Guest], timeout_s: float = BOOT_TIMEOUT) -> None:
    libvirt = _libvirt()

    deadline = time.monotonic() + timeout_s
    waiting = {g.name: g for g in guests}
    while waiting:
        for name, g in list(waiting.items()):
            text = _console(g)
            if f"gmd-guest: ready role={g.role}" in text:
                del waiting[name]
                continue
            errors = re.findall(r"gmd-guest: error: .*", text)
            if errors:
                raise RealVMError(f"guest {name} failed to boot: {errors[0]} ({g.console_log})")
            try:
                state, _ = conn.lookupByName(name).state()
            except libvirt.libvirtError as e:
                raise RealVMError(f"guest {name} vanished while booting: {e}") from e
            if state != libvirt.VIR_DOMAIN_RUNNING:
                raise RealVMError(
                    f"guest {name} stopped while booting (state {state}); its console "
                    f"{g.console_log} ends: {_tail(text)}"
                )
        if waiting and time.monotonic() > deadline:
            g = next(iter(waiting.values()))
            raise RealVMError(
                f"guest {g.name} not ready after {timeout_s:.0f} s; its console "
                f"{g.console_log} ends: {_tail(_console(g))}"
            )
        if waiting:
            time.sleep(0.2)


def _console(g: Guest) -> str:
    try:
        return g.console_log.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _tail(text: str) -> str:
    """The console's last lines, led by the kernel's panic message if there is one."""
    lines = text.strip().splitlines()
    panic = [line for line in lines if "Kernel panic" in line][:1]
    return " / ".join(panic + lines[-5:]) if lines else "(nothing)"


def _remove_domains(conn, guests: dict[str, Guest]) -> None:
    with ThreadPoolExecutor(max_workers=max(1, len(guests))) as pool:
        futures = [pool.submit(_remove_domain, conn, g.name, g.tap) for g in guests.values()]
    for g in guests.values():
        g.disk.unlink(missing_ok=True)  # the consoles stay, for a failed test's post-mortem
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]


def _remove_domain(conn, name: str, tap: str | None = None) -> None:
    """Destroys and undefines `name` if it exists, and deletes its tap if libvirt left it."""
    libvirt = _libvirt()

    try:
        dom = conn.lookupByName(name)
    except libvirt.libvirtError:
        dom = None
    if dom is not None:
        try:
            if dom.isActive():
                dom.destroy()
        except libvirt.libvirtError as e:
            if dom.isActive():
                raise RealVMError(f"could not destroy {name}: {e}") from e
        try:
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)
        except libvirt.libvirtError as e:
            raise RealVMError(f"could not undefine {name}: {e}") from e
    if tap and Path("/sys/class/net", tap).exists() and shutil.which("ip"):
        subprocess.run(["ip", "link", "delete", tap], capture_output=True, timeout=30)


def remove_stale_domains(conn) -> list[str]:
    """Removes gmd-test-* domains whose pytest process is gone (a killed session's)."""
    removed = []
    for dom in conn.listAllDomains():
        m = re.fullmatch(re.escape(NAME_PREFIX) + r"([a-z]+)(\d*)-(\d+)", dom.name())
        if not m or _alive(int(m.group(3))):
            continue
        role, index, pid = m.groups()
        tap = f"gmdt{int(pid) % 10**7}{role[0]}{index}"  # as _new_guest names it
        _remove_domain(conn, dom.name(), tap)
        removed.append(dom.name())
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
