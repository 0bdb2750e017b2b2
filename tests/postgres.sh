#!/usr/bin/env bash
# Starts (or finds running) a private PostgreSQL cluster for the tests, on 127.0.0.1:$PGPORT,
# owned by the postgres user (the server refuses to run as root). Safe to run again.
set -uo pipefail
cd "$(dirname "$0")/.."

PGPORT=${GMD_TEST_PGPORT:-54329}
DATA="$(pwd)/var/pgtest"
die() {
    echo "gmd test postgres: $*" >&2
    exit 1
}

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

mkdir -p "$DATA"
[ "$(id -u)" -eq 0 ] && chown postgres: "$DATA"
if [ ! -f "$DATA/PG_VERSION" ]; then
    as_pg "'$bindir/initdb' -D '$DATA' -A trust -U postgres" >"$DATA.initdb.log" 2>&1 ||
        die "initdb failed; see $DATA.initdb.log"
fi
# A running cluster is found again through its postmaster.pid (line 4: the port); a new one
# takes a port nobody listens on, since another checkout's test cluster may hold the first.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if as_pg "'$bindir/pg_ctl' -D '$DATA' status" >/dev/null 2>&1; then
    PGPORT=$(sed -n 4p "$DATA/postmaster.pid")
else
    for _ in $(seq 20); do
        port_free "$PGPORT" && break
        PGPORT=$((PGPORT + 1))
    done
    port_free "$PGPORT" || die "no free port for the test server near ${GMD_TEST_PGPORT:-54329}"
    opts="-c listen_addresses=127.0.0.1 -p $PGPORT -k $DATA -c fsync=off"
    as_pg "'$bindir/pg_ctl' -D '$DATA' -w -t 30 -l '$DATA/server.log' -o '$opts' start" \
        >/dev/null || die "the server did not start; see $DATA/server.log"
    port_free "$PGPORT" && die "the server is not listening on $PGPORT; see $DATA/server.log"
fi
echo "postgresql+psycopg://postgres@127.0.0.1:$PGPORT/postgres"
