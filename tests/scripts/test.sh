#!/usr/bin/env bash
# `make test` after its set-up (.venv): installs what the tests use where it is missing, starts
# their servers, runs the lint and the suite, and stops what it started.
#
# The servers (each script's header says what it starts and where): a private PostgreSQL
# (postgres.sh; the streaming replica tests/unit/admin/test_read_replica.py reads is started by
# its fixture and stopped after it: a standby replays every write of the whole suite for as long
# as it runs, 84 s of CPU measured), libvirtd with QEMU (libvirt.sh), Prometheus's
# promtool (prometheus.sh), real Keystone, Nova and Placement from PyPI (openstack.sh), a
# three-node ZooKeeper ensemble (zookeeper.sh) and the whole small cloud whose Nova boots real
# guests (nova_cloud.sh). The two clouds take minutes on a first run and a minute after: they
# start in the background, beside the lint and PostgreSQL, once every Debian package they or the
# others install is in (apt allows one install at a time). The suite waits for OpenStack's; the
# Nova cloud's start goes on beside the suite's first tests (its own services take about a
# minute to answer, the critical path of the set-up), and its tests, on one worker, wait for it.
# A cloud that cannot start leaves its tests failing saying why (the Nova cloud's fixture tries
# once more itself).
#
# The suite runs in two tiers. First, on every core and one worker more (the tests of the one Nova
# cloud, on one worker, wait on it more than they compute), every test but those on real VMs, at
# nice 10; and beside them, at the machine's own priority in a pytest of their own, the soaks
# (marker soak: gmd's processes under faults drawn from fixed seeds, each on its own world) and
# the tests marked deadline (the federation's soak and the broker fault tests, whose brokers hold
# 2 s ZooKeeper sessions). Those wait on wall-clock intervals and use little CPU (a soak's
# processes took 13 s of CPU over its 267 s, measured), but a process of theirs starved for a
# second or two misses a deadline: beside the tier at the same priority, requests ran twice that
# no drawn fault explains (one run in four). The tier at nice 10 yields the CPU to them whenever
# they want it (CFS weighs nice 0 over nice 10 about 9 to 1) and takes every cycle they leave.
# Where the kernel groups each session (sched_autogroup_enabled, on here), nice weighs within a
# session: the two pytests share this script's, and what a test starts in a session of its own
# (ZooKeeper nodes, the soaks' daemons) weighs as much as the whole tier.
# The servers keep the machine's priority too. Then, alone, the tests on real VMs (marker realvm:
# they measure what a guest gets of the machine's CPU).
#
# Exit status: 0 when every tier passed; otherwise the first failure's (a set-up step's, the
# lint's, or pytest's: 1 tests failed, 2 interrupted, ... as pytest documents).
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${VENV:-.venv}/bin
LOGS=var/test-logs
mkdir -p "$LOGS"

say() {
    echo "gmd test: $*" >&2
}

background=()
stop_all() {
    local pid
    for pid in "${background[@]}"; do
        kill "$pid" 2>/dev/null
    done
    bash tests/scripts/openstack.sh stop
    bash tests/scripts/nova_cloud.sh stop
    bash tests/scripts/zookeeper.sh stop
    bash tests/scripts/postgres.sh stop
}
trap stop_all EXIT

# Every Debian package first, one install at a time.
GMD_WITH_POSTGRES=1 bash tests/scripts/bootstrap.sh || exit
bash tests/scripts/reachable.sh
bash tests/scripts/libvirt.sh >/dev/null || exit
bash tests/scripts/prometheus.sh >/dev/null || exit
bash tests/scripts/zookeeper.sh install || exit

# The clouds in the background (nova_cloud.sh installs RabbitMQ and qemu-utils: the only apt now).
bash tests/scripts/openstack.sh >"$LOGS/openstack.out" 2>"$LOGS/openstack.err" &
openstack_pid=$!
rm -f "$LOGS/nova.rc"
{
    bash tests/scripts/nova_cloud.sh >"$LOGS/nova.out" 2>"$LOGS/nova.err"
    echo $? >"$LOGS/nova.rc"
} &
nova_pid=$!
background=("$openstack_pid" "$nova_pid")

bash tests/scripts/lint.sh || exit
url=$(bash tests/scripts/postgres.sh) || exit
zookeeper=$(bash tests/scripts/zookeeper.sh) || zookeeper=

# cloud_file RC OUT ERR NAME: the cloud's description file, or nothing (its error said).
cloud_file() {
    if [ "$1" -eq 0 ]; then
        tail -n 1 "$2"
    else
        say "$4 did not start (its tests will fail saying so):"
        tail -n 20 "$3" >&2
    fi
}
wait "$openstack_pid"
openstack_rc=$?
cloud=$(cloud_file "$openstack_rc" "$LOGS/openstack.out" "$LOGS/openstack.err" OpenStack)
background=("$nova_pid")
say "set up, linted and serving after ${SECONDS} s (the Nova cloud still starting)"
# The Nova cloud's tests wait for it (GMD_TEST_NOVA_STARTING: tests/support/nova_support.py).
export GMD_TEST_OPENSTACK=$cloud GMD_TEST_NOVA_STARTING=$PWD/$LOGS GMD_TEST_POSTGRES_URL=$url \
    GMD_TEST_ZOOKEEPER=$zookeeper

# Only the files that mark soaks or deadlines are collected there (a collection of the whole
# suite costs each of its processes 10 s of CPU); the tier leaves out the markers, wherever they
# are. Two soaks can still run one after the other on one worker (xdist hands a worker its next
# test before it ends the one it runs, and work stealing takes only the rest): 417-425 s where
# the longest takes 271 s, measured, which ends minutes before the tier beside it does.
mapfile -t soak_files < <(grep -rlE --include='test_*.py' 'mark\.(soak|deadline)\b' tests)
soak_tmp=$(mktemp -d /tmp/gmd-soak-tests.XXXXXX)
if [ ${#soak_files[@]} -gt 0 ]; then
    "$BIN/pytest" -p no:cacheprovider -n 3 --dist worksteal \
        -m "(soak or deadline) and not realvm" --basetemp "$soak_tmp" --durations=8 \
        "${soak_files[@]}" >"$LOGS/soak.log" 2>&1 &
else
    echo "no test file marks a soak" >"$LOGS/soak.log" &
fi
soak_pid=$!
background=("$nova_pid" "$soak_pid")
workers=$(($(nproc) + 1))
nice -n 10 "$BIN/pytest" -n "$workers" --dist loadgroup \
    -m "not realvm and not soak and not deadline" --durations=15
status=$?
wait "$soak_pid"
soaked=$?
wait "$nova_pid"
background=()
[ "$(cat "$LOGS/nova.rc" 2>/dev/null)" = 0 ] ||
    say "the Nova cloud did not start ($LOGS/nova.err): its tests started it themselves or failed"
say "the soaks and deadlines, run beside the tier ($LOGS/soak.log; ${SECONDS} s in all so far):"
cat "$LOGS/soak.log"
# A failed soak's files (its processes' logs) are kept: the only trace of what went wrong.
if [ "$soaked" -eq 0 ]; then
    rm -rf "$soak_tmp"
else
    say "the soaks' files are kept in $soak_tmp"
fi
[ "$status" -eq 0 ] && status=$soaked
[ "$status" -eq 0 ] || exit "$status"
"$BIN/pytest" -m realvm --durations=10
status=$?
say "${SECONDS} s in all"
exit "$status"
