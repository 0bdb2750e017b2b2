#!/usr/bin/env bash
# Starts real Keystone, Placement and two Nova APIs (legacy DB quotas, unified limits) from PyPI
# on 127.0.0.1 for the tests, and prints the path of the JSON file that describes them (ports,
# clouds.yaml, databases). Their venv is var/openstack/venv, a link into a cache outside the
# checkout (tests/scripts/cached_venv.sh: installed on first use on a machine, reused
# after); their seeded state is var/openstack/seed (built once, copied fresh on every start, so
# each run begins from the same cloud). Safe to run again: every run restarts them on a fresh
# copy of the seed. `tests/scripts/openstack.sh stop` stops them.
set -euo pipefail
cd "$(dirname "$0")/../.."

STATE="$(pwd)/var/openstack"
VENV="$STATE/venv"
# Pinned: the versions the project's notes on these services measured (Keystone, Nova and
# Placement of one release). Changing one rebuilds the venv (its cache is keyed by them) and the
# seed.
PACKAGES=(keystone==30.0.0 nova==34.0.0 openstack-placement==16.0.0 gunicorn==27.0.1)

die() {
    echo "gmd test openstack: $*" >&2
    exit 1
}

mkdir -p "$STATE"
# The venv lives in a cache outside the checkout (tests/scripts/cached_venv.sh); a new one makes
# the seed anew.
. tests/scripts/cached_venv.sh
cached_venv openstack "$VENV" "$STATE/seed" "${PACKAGES[@]}" || die "no venv for the cloud (above)"
exec "$VENV/bin/python" tests/scripts/openstack_cloud.py --state "$STATE" "${@:-start}"
