#!/usr/bin/env bash
# Starts real Keystone, Placement and two Nova APIs (legacy DB quotas, unified limits) from PyPI
# on 127.0.0.1 for the tests, and prints the path of the JSON file that describes them (ports,
# clouds.yaml, databases). Their venv is var/openstack/venv (installed on first use, reused
# after); their seeded state is var/openstack/seed (built once, copied fresh on every start, so
# each run begins from the same cloud). Safe to run again: every run restarts them on a fresh
# copy of the seed. `tests/scripts/openstack.sh stop` stops them.
set -euo pipefail
cd "$(dirname "$0")/../.."

STATE="$(pwd)/var/openstack"
VENV="$STATE/venv"
# Pinned: the versions the project's notes on these services measured (Keystone, Nova and
# Placement of one release). Changing one rebuilds the venv and the seed (the stamp below).
PACKAGES=(keystone==30.0.0 nova==34.0.0 openstack-placement==16.0.0 gunicorn==27.0.1)
STAMP="${PACKAGES[*]}"

die() {
    echo "gmd test openstack: $*" >&2
    exit 1
}

mkdir -p "$STATE"
if [ "$(cat "$VENV/.gmd-stamp" 2>/dev/null)" != "$STAMP" ]; then
    echo "gmd test openstack: installing ${PACKAGES[*]} into $VENV (a few minutes, once)" >&2
    rm -rf "$VENV" "$STATE/seed"
    python3 -m venv "$VENV" || die "could not create $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "${PACKAGES[@]}" \
        >"$STATE/pip.log" 2>&1 || die "pip install failed; see $STATE/pip.log"
    echo "$STAMP" >"$VENV/.gmd-stamp"
fi
exec "$VENV/bin/python" tests/scripts/openstack_cloud.py --state "$STATE" "${@:-start}"
