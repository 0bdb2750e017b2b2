#!/usr/bin/env bash
# Starts a whole small OpenStack cloud on 127.0.0.1 whose Nova boots real QEMU guests on this
# machine's libvirtd (tests/scripts/nova_cloud.py says what runs), and prints the path of the JSON
# file that describes it (ports, clouds.yaml, projects, images, flavor). Installs on first use: the
# Debian packages rabbitmq-server and qemu-utils, the venv var/nova/venv (pinned below) and the
# guest kernel and initramfs (tests/support/guest_image.py). The first start seeds var/nova/seed
# (about a minute); every start after copies it, so each run begins from the same cloud. Safe to run
# again: a start restarts everything on a fresh copy. `tests/scripts/nova_cloud.sh stop` stops it
# all and removes its guests.
set -euo pipefail
cd "$(dirname "$0")/../.."

STATE="$(pwd)/var/nova"
VENV="$STATE/venv"
# Pinned: what the project's notes on Nova's boot path measured. Nova 34 is the last release that
# runs on Debian 12's libvirt 9.0 / QEMU 7.2. psycopg2, not psycopg 3: psycopg 3 breaks Nova's
# inet columns and Placement's allocation writes. A change rebuilds the venv and the seed.
PACKAGES=(nova==34.0.0 keystone==30.0.0 openstack-placement==16.0.0 glance==33.0.0
    gunicorn==27.0.1 psycopg2-binary libvirt-python openstacksdk)
DEBS=(rabbitmq-server qemu-utils)

die() {
    echo "gmd test nova: $*" >&2
    exit 1
}

mkdir -p "$STATE"
# One start or stop at a time (the first install included). The cloud's processes do not keep
# the descriptor: Python's subprocess closes it in every child.
exec 9>"$STATE/script.lock"
flock -w 900 9 || die "another tests/scripts/nova_cloud.sh holds $STATE/script.lock for over 15 min"
# A test session (tests/support/nova_support.py) holds session.lock while it uses the cloud: a start
# or stop from elsewhere (make test's last stop, a developer's) waits for it to end, unless it comes
# from that session (GMD_NOVA_SESSION=1).
if [ -z "${GMD_NOVA_SESSION:-}" ]; then
    exec 8>"$STATE/session.lock"
    flock -w 900 8 || die "a test session has held $STATE/session.lock for over 15 min"
fi
if [ "${1:-start}" = stop ]; then
    [ -x "$VENV/bin/python" ] || exit 0
    exec "$VENV/bin/python" tests/scripts/nova_cloud.py --state "$STATE" stop
fi

missing=()
for pkg in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
        missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] ||
        die "Debian packages missing (${missing[*]}): run as root, or: sudo apt-get install ${missing[*]}"
    echo "gmd test nova: installing Debian packages: ${missing[*]}" >&2
    install_debs() {
        apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                "${missing[@]}"
    } >>"$STATE/apt.log" 2>&1 8>&- 9>&-
    # The package's maintainer scripts try to start rabbitmq-server; without an init system
    # that fails harmlessly (the cloud runs its own, privately). A mirror hiccup: once more.
    install_debs || install_debs || die "could not install ${missing[*]}; see $STATE/apt.log"
fi

# The venv lives in a cache outside the checkout (tests/scripts/cached_venv.sh); a new one makes
# the seed anew.
. tests/scripts/cached_venv.sh
cached_venv nova "$VENV" "$STATE/seed" "${PACKAGES[@]}" || die "no venv for the cloud (above)"
bash tests/scripts/libvirt.sh >/dev/null 8>&- 9>&- || die "libvirtd is not available (tests/scripts/libvirt.sh)"
exec "$VENV/bin/python" tests/scripts/nova_cloud.py --state "$STATE" "${@:-start}"
