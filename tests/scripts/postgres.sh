#!/usr/bin/env bash
# Starts (or finds running) a private PostgreSQL cluster for the tests, on 127.0.0.1:$PGPORT,
# owned by the postgres user (the server refuses to run as root). Safe to run again.
#
#   bash tests/scripts/postgres.sh               the primary (var/pgtest); prints its URL
#   bash tests/scripts/postgres.sh replica       a streaming replica of it in hot standby
#                                                (var/pgtest-replica, the next free port); prints its
#                                                URL
#   bash tests/scripts/postgres.sh stop-replica  stops that replica; the primary keeps running
#   bash tests/scripts/postgres.sh stop          stops the replica and the primary (make test's
#                                                end); the data stays for the next start
set -uo pipefail
cd "$(dirname "$0")/../.."

PGPORT=${GMD_TEST_PGPORT:-54329}
DATA="$(pwd)/var/pgtest"
REPLICA="$(pwd)/var/pgtest-replica"
die() {
    echo "gmd test postgres: $*" >&2
    exit 1
}
case "${1:-}" in
"" | replica | stop-replica | stop) ;;
*) die "unknown command '$1': give none (the primary), replica, stop-replica or stop" ;;
esac

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bindir" ] && [ -x "$bindir/initdb" ] ||
    die "no PostgreSQL server found under /usr/lib/postgresql (apt-get install postgresql)"

as_pg() {
    if [ "$(id -u)" -eq 0 ]; then
        su postgres -s /bin/sh -c "$*"
    else
        sh -c "$*"
    fi
}

# stop_cluster DIR NAME: a fast shutdown of the cluster in DIR, if it runs.
stop_cluster() {
    if as_pg "'$bindir/pg_ctl' -D '$1' status" >/dev/null 2>&1; then
        as_pg "'$bindir/pg_ctl' -D '$1' -m fast -w -t 60 stop" >/dev/null ||
            die "$2 did not stop; see $1/server.log"
    fi
}
case "${1:-}" in
stop-replica)
    stop_cluster "$REPLICA" "the replica"
    exit 0
    ;;
stop)
    stop_cluster "$REPLICA" "the replica"
    stop_cluster "$DATA" "the primary"
    exit 0
    ;;
esac

mkdir -p "$DATA"
[ "$(id -u)" -eq 0 ] && chown postgres: "$DATA"
if [ ! -f "$DATA/PG_VERSION" ]; then
    as_pg "'$bindir/initdb' -D '$DATA' -A trust -U postgres" >"$DATA.initdb.log" 2>&1 ||
        die "initdb failed; see $DATA.initdb.log"
fi
# A running cluster is found again through its postmaster.pid (line 4: the port); a new one
# takes a port nobody listens on, since another checkout's test cluster may hold the first.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# The first of the 20 ports from $1 that nobody listens on (else the last one tried).
next_free() {
    local port=$1
    for _ in $(seq 20); do
        port_free "$port" && break
        port=$((port + 1))
    done
    echo "$port"
}
if as_pg "'$bindir/pg_ctl' -D '$DATA' status" >/dev/null 2>&1; then
    PGPORT=$(sed -n 4p "$DATA/postmaster.pid")
else
    PGPORT=$(next_free "$PGPORT")
    port_free "$PGPORT" || die "no free port for the test server near ${GMD_TEST_PGPORT:-54329}"
    opts="-c listen_addresses=127.0.0.1 -p $PGPORT -k $DATA -c fsync=off"
    as_pg "'$bindir/pg_ctl' -D '$DATA' -w -t 30 -l '$DATA/server.log' -o '$opts' start" \
        >/dev/null || die "the server did not start; see $DATA/server.log"
    port_free "$PGPORT" && die "the server is not listening on $PGPORT; see $DATA/server.log"
fi
if [ "${1:-}" != replica ]; then
    echo "postgresql+psycopg://postgres@127.0.0.1:$PGPORT/postgres"
    exit 0
fi

# The replica. The primary is shared with tests running now: it is never restarted, at most
# reloaded. One caller at a time builds the replica (pytest workers may all ask at once).
exec 9>"$REPLICA.lock"
flock -w 600 9 || die "another tests/scripts/postgres.sh replica has held $REPLICA.lock for 10 minutes"
sql() { # PORT QUERY: the answer, unaligned (columns joined by |)
    "$bindir/psql" -X -Atq -h 127.0.0.1 -p "$1" -U postgres -d postgres -c "$2" 2>/dev/null
}
primary_id=$(sql "$PGPORT" "SELECT system_identifier FROM pg_control_system()") ||
    die "the primary on 127.0.0.1:$PGPORT does not answer; see $DATA/server.log"
# A running replica serves again only if it is of this primary and streams from its port: a
# replica of an earlier cluster, or of one since moved to another port, or cut off because
# the primary recycled WAL it still needed (no slot keeps WAL for it, so that a stopped
# replica never fills the primary's disk), is made anew. Its receiver may be reconnecting
# (after a restart of the primary, say), so that is waited for.
streams() { # PORT [TRIES]: whether the server on PORT is a replica streaming from the primary
    local tries=${2:-1}
    [ "$(sql "$1" "SELECT system_identifier FROM pg_control_system()")" = "$primary_id" ] ||
        return 1
    for _ in $(seq "$tries"); do
        [ "$(sql "$1" "SELECT status, sender_port FROM pg_stat_wal_receiver")" = \
            "streaming|$PGPORT" ] && return 0
        sleep 0.2
    done
    return 1
}
if as_pg "'$bindir/pg_ctl' -D '$REPLICA' status" >/dev/null 2>&1; then
    RPORT=$(sed -n 4p "$REPLICA/postmaster.pid")
    if streams "$RPORT" 50; then
        echo "postgresql+psycopg://postgres@127.0.0.1:$RPORT/postgres"
        exit 0
    fi
    as_pg "'$bindir/pg_ctl' -D '$REPLICA' -m immediate -w -t 60 stop" >/dev/null ||
        die "the replica on $RPORT does not follow the primary and did not stop"
fi

case "$(sql "$PGPORT" "SHOW wal_level")" in
replica | logical) ;;
*) die "the primary runs with wal_level=$(sql "$PGPORT" "SHOW wal_level"): a replica needs replica" ;;
esac
[ "$(sql "$PGPORT" "SHOW max_wal_senders")" -gt 0 ] 2>/dev/null ||
    die "the primary runs with max_wal_senders=0: a replica needs one"
# initdb -A trust lets local replication connections in; a cluster made otherwise is given
# the line and reloaded (a reload does not disturb the tests using the primary).
hba='^[[:space:]]*host[[:space:]]+replication[[:space:]]+(all|postgres)[[:space:]]+127\.0\.0\.1/32[[:space:]]+trust'
if ! grep -Eq "$hba" "$DATA/pg_hba.conf"; then
    echo "host replication all 127.0.0.1/32 trust" >>"$DATA/pg_hba.conf" &&
        as_pg "'$bindir/pg_ctl' -D '$DATA' reload" >/dev/null ||
        die "cannot allow replication connections in $DATA/pg_hba.conf"
fi

rm -rf "$REPLICA"
mkdir -m 0700 "$REPLICA"
[ "$(id -u)" -eq 0 ] && chown postgres: "$REPLICA"
# -R writes standby.signal and primary_conninfo; -c fast checkpoints at once rather than
# spreading the checkpoint over minutes; -X stream brings the WAL written meanwhile.
as_pg "'$bindir/pg_basebackup' -h 127.0.0.1 -p $PGPORT -U postgres -D '$REPLICA' -R -X stream -c fast" \
    >"$REPLICA.basebackup.log" 2>&1 || die "pg_basebackup failed; see $REPLICA.basebackup.log"
# The copy brings the primary's log and its socket's lock file, which are not the replica's.
rm -f "$REPLICA/server.log" "$REPLICA"/.s.PGSQL.*
RPORT=${GMD_TEST_REPLICA_PGPORT:-$((PGPORT + 1))}
# A port found free can be taken before the server binds it: started while tests run, the
# replica met a connection's ephemeral source port on 54330 (that range includes it). Then the
# next free port, a few times.
for attempt in 1 2 3 4 5; do
    RPORT=$(next_free "$RPORT")
    port_free "$RPORT" || die "no free port for the replica near $((PGPORT + 1))"
    opts="-c listen_addresses=127.0.0.1 -p $RPORT -k $REPLICA -c fsync=off -c hot_standby=on"
    opts="$opts -c shared_buffers=32MB"
    # Without 9>&- the server would inherit the lock, and hold it for as long as it runs.
    as_pg "'$bindir/pg_ctl' -D '$REPLICA' -w -t 60 -l '$REPLICA/server.log' -o '$opts' start" \
        >/dev/null 9>&- && break
    grep -q "Address already in use" "$REPLICA/server.log" && [ "$attempt" -lt 5 ] ||
        die "the replica did not start; see $REPLICA/server.log"
    RPORT=$((RPORT + 1))
done
streams "$RPORT" 300 || die "the replica on $RPORT does not stream from the primary; see $REPLICA/server.log"
echo "postgresql+psycopg://postgres@127.0.0.1:$RPORT/postgres"
