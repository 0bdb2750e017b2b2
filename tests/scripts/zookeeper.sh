#!/usr/bin/env bash
# Starts (or finds running) the tests' three-node ZooKeeper ensemble on 127.0.0.1 and prints its
# connection string (what kazoo's KazooClient(hosts=…) takes); `zookeeper.sh stop` stops it;
# `zookeeper.sh install` only installs (the soak starts ensembles of its own).
# Installs Debian's zookeeper package (and Java) when missing; apt-get update only if the install
# fails without it. The nodes' data, logs and pids are under var/zookeeper/ (tests/support/
# zookeeper.py holds the recipe: ports 27181-27183, 27281-27283 and 27381-27383).
set -euo pipefail
cd "$(dirname "$0")/../.."

STATE="$(pwd)/var/zookeeper"
JARS=(/usr/share/java/zookeeper.jar /usr/share/java/slf4j-log4j12.jar /usr/share/java/log4j-1.2.jar)

die() {
    echo "gmd zookeeper: $*" >&2
    exit 1
}

if [ "${1:-start}" = stop ]; then
    exec python3 tests/support/zookeeper.py stop --dir "$STATE"
fi

missing=0
for jar in "${JARS[@]}"; do [ -f "$jar" ] || missing=1; done
command -v java >/dev/null || missing=1
if [ "$missing" -eq 1 ]; then
    [ "$(id -u)" -eq 0 ] ||
        die "ZooKeeper is not installed: run as root, or: sudo apt-get install --no-install-recommends zookeeper"
    mkdir -p "$STATE"
    echo "gmd zookeeper: installing Debian's zookeeper package" >&2
    install() {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends zookeeper
    }
    { install || { apt-get update -qq && install; }; } >>"$STATE/apt.log" 2>&1 ||
        die "could not install zookeeper; see $STATE/apt.log"
fi
[ "${1:-start}" = install ] && exit 0
mkdir -p "$STATE"
exec python3 tests/support/zookeeper.py start --dir "$STATE"
