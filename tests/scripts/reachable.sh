#!/usr/bin/env bash
# The test servers that refuse to run as root run as their own users — PostgreSQL as postgres
# (tests/scripts/postgres.sh, the whole cloud's cluster in tests/scripts/nova_cloud.py) — and
# keep their data in this checkout's var/. A checkout under a directory only its owner may
# enter (mktemp -d makes them 0700; so is /root) is out of their reach: initdb fails with
# "could not access directory … Permission denied". As root, give each such directory above
# the checkout search permission for others (o+x: enter, not list), and say so; otherwise do
# nothing. Safe to run again.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || exit 0
id postgres >/dev/null 2>&1 || exit 0
dir=$(pwd)
while [ "$dir" != / ]; do
    if ! runuser -u postgres -- test -x "$dir" 2>/dev/null; then
        chmod o+x "$dir" && echo "gmd test: $dir: search permission for others (o+x), so that the test servers' users reach the checkout" >&2
    fi
    dir=$(dirname "$dir")
done
