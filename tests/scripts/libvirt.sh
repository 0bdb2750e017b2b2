#!/usr/bin/env bash
# Starts (or finds running) a libvirtd with the QEMU driver for the real-VM tests and prints its
# URI. Installs the Debian packages it needs when they are missing (apt-get update at most once,
# and only then). There is no systemd here: virtlogd and libvirtd are started by hand as daemons,
# with their pidfiles and error logs under var/libvirt/. Safe to run again: when libvirtd already
# answers it only checks and prints the URI.
set -euo pipefail
cd "$(dirname "$0")/../.."

URI=qemu:///system
STATE="$(pwd)/var/libvirt"
PACKAGES=(libvirt-daemon-system qemu-system-x86 busybox-static)

die() {
    echo "gmd libvirt: $*" >&2
    exit 1
}

answers() { timeout 10 virsh -c "$URI" version >/dev/null 2>&1; }

# /dev/kvm exists but is 0600 root:root on these machines: libvirt then re-probes QEMU on every
# call (4 s each). Our domains are type='qemu' (TCG), but the probe happens all the same.
# Returns 0 when it changed the permissions.
fix_kvm() {
    [ -c /dev/kvm ] || return 1
    [ "$(stat -c '%G %a' /dev/kvm)" = "kvm 660" ] && return 1
    [ "$(id -u)" -eq 0 ] || die "/dev/kvm is $(stat -c '%U:%G %a' /dev/kvm): run as root to fix it"
    getent group kvm >/dev/null || groupadd -r kvm || die "could not create the kvm group"
    chgrp kvm /dev/kvm && chmod 0660 /dev/kvm || die "could not chgrp kvm / chmod 0660 /dev/kvm"
    return 0
}

# A daemon another checkout started, whose directory is gone since (a CI clone removed),
# answers but cannot start guests: QEMU inherits its LIBVIRT_LOG_OUTPUTS and exits 125 when
# that file cannot be opened. Such daemons are stopped here; the code below starts ours.
orphaned() { # $1: the daemon's program name
    local pid log
    pid=$(pidof "$1") || return 1
    log=$(tr '\0' '\n' <"/proc/${pid%% *}/environ" 2>/dev/null |
        sed -n 's/^LIBVIRT_LOG_OUTPUTS=[0-9]*:file://p')
    [ -n "$log" ] && [ ! -d "$(dirname "$log")" ]
}
for daemon in libvirtd virtlogd; do
    orphaned "$daemon" || continue
    [ "$(id -u)" -eq 0 ] || die "the running $daemon logs to a directory that is gone: restart it as root"
    pids=$(pidof "$daemon")
    # shellcheck disable=SC2086 # one pid or several
    kill $pids 2>/dev/null || true
    for _ in $(seq 100); do pidof "$daemon" >/dev/null || break; sleep 0.1; done
    echo "gmd libvirt: stopped $daemon ($pids): its log directory is gone (a removed checkout's)" >&2
done

# Fast path: everything installed and the daemon answers.
if command -v virsh >/dev/null && answers; then
    if fix_kvm; then
        # A daemon started while /dev/kvm was unusable keeps re-probing: restart ours.
        pid=$(cat "$STATE/libvirtd.pid" 2>/dev/null || true)
        if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        else
            echo "gmd libvirt: fixed /dev/kvm's permissions, but the running libvirtd is not" \
                "ours ($STATE/libvirtd.pid): restart it, or every call takes seconds" >&2
            echo "$URI"
            exit 0
        fi
    else
        echo "$URI"
        exit 0
    fi
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
        missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null ||
        die "Debian packages missing (${missing[*]}) and no apt-get here: install them by hand"
    [ "$(id -u)" -eq 0 ] ||
        die "Debian packages missing (${missing[*]}): run as root, or: sudo apt-get install ${missing[*]}"
    echo "gmd libvirt: apt-get update" >&2
    apt-get update -qq >/dev/null 2>&1 ||
        die "apt-get update failed: are Debian's package mirrors reachable?"
    echo "gmd libvirt: installing Debian packages: ${missing[*]}" >&2
    mkdir -p "$STATE"
    # The packages' maintainer scripts try to start the services; without an init system that
    # fails harmlessly, and the daemons are started below.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >"$STATE/apt-install.log" 2>&1 ||
        die "could not install Debian packages: ${missing[*]} (see $STATE/apt-install.log)"
fi
for cmd in virsh virtlogd libvirtd; do
    command -v "$cmd" >/dev/null || die "$cmd is not on PATH although ${PACKAGES[*]} are installed"
done

[ "$(id -u)" -eq 0 ] || die "libvirtd ($URI) is not running, and only root can start it here"
fix_kvm || true
mkdir -p "$STATE"

# One starter at a time (two test sessions may start together); the second finds it running.
# The daemons must not inherit the lock's descriptor (9>&- below), or they would hold it forever.
exec 9>"$STATE/start.lock"
flock -w 60 9 || die "another tests/scripts/libvirt.sh holds $STATE/start.lock for over 60 s"

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if ! answers; then
    if ! running "$STATE/virtlogd.pid" && ! pidof virtlogd >/dev/null; then
        LIBVIRT_LOG_OUTPUTS="3:file:$STATE/virtlogd.log" \
            virtlogd -d -p "$STATE/virtlogd.pid" 9>&- ||
            die "virtlogd did not start; see $STATE/virtlogd.log"
    fi
    if ! running "$STATE/libvirtd.pid" && ! pidof libvirtd >/dev/null; then
        LIBVIRT_LOG_OUTPUTS="3:file:$STATE/libvirtd.log" \
            libvirtd -d -p "$STATE/libvirtd.pid" 9>&- ||
            die "libvirtd did not start; see $STATE/libvirtd.log"
    fi
    for _ in $(seq 100); do
        answers && break
        sleep 0.1
    done
    answers || die "libvirtd does not answer on $URI after 10 s; see $STATE/libvirtd.log"
fi
echo "$URI"
