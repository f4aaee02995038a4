#!/bin/sh
# PostgreSQL's server binaries (initdb, pg_ctl) for the fenced-write tests (docs/fencing.md),
# which start a private server on loopback: a no-op when present (Debian's
# /usr/lib/postgresql/<version>/bin, or pg_ctl on PATH); else installs Debian's `postgresql`
# when root with apt-get, else fails with what to install: those tests are part of `make test`.
# The package also creates a system cluster (postgresql-common's default); the tests never use it.
set -u
have() {
    ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null 2>&1
}

if ! have && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "postgres-deps: installing PostgreSQL"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq postgresql >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }
fi
if ! have; then
    echo "postgres-deps: PostgreSQL's server (initdb, pg_ctl) is needed; install it" >&2
    exit 1
fi
