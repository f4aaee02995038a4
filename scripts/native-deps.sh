#!/bin/sh
# Debian packages some builds and tests use; each is installed when missing and we can (apt-get
# as root, or through passwordless sudo), else a note says what is left out. Never fails the
# setup, except under CI (CI=true), which leaves out nothing: there a missing package is an
# error. A no-op when present.
# - libxxhash-dev for the optional native key kernel (apportion.engine._keys), which compiles
#   in its xxhash.h; without it (or a C compiler) apportion uses its Python key path
#   (apportion.engine.keys.NATIVE is False).
# - lua5.1 and lua-dkjson, the Lua 5.1 interpreter and JSON module tests/unit/test_argocd_health.py
#   runs the Argo CD health checks with (manifests/argocd/); without them those tests skip,
#   and fail under CI.
# - redis-server, the cache Argo CD's application-controller and repo-server need
#   (apportion_dev.devcluster.argocd, tests/e2e/test_argocd.py); without it those tests fail.
# - spin, the model checker of the hand-off protocol's model (models/handoff/, `make model`,
#   tests/unit/test_handoff_spin.py); without it those tests skip, and fail under CI.
set -u

as_root=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        as_root="sudo -n"
    else
        as_root="none"
    fi
fi

# apt_install WHAT PACKAGE...: quietly, refreshing the package lists only when the first try
# fails; nothing without root (or passwordless sudo) or apt-get.
apt_install() {
    [ "$as_root" != none ] && command -v apt-get >/dev/null 2>&1 || return 0
    what=$1
    shift
    echo "native-deps: installing $* for $what"
    $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1 \
        || { $as_root apt-get update -qq \
            && $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }
}

missing=""
# left_out WHAT: a note, and under CI an error at the end.
left_out() {
    echo "native-deps: note: $1" >&2
    missing="$missing
  $1"
}

header=/usr/include/xxhash.h
skipped="the native key kernel will be skipped (apportion uses its Python key path)"
if [ ! -f "$header" ]; then
    apt_install "the native key kernel" libxxhash-dev
    if [ ! -f "$header" ]; then
        left_out "$header is missing (apt-get install libxxhash-dev as root); $skipped"
    fi
fi
if ! command -v cc >/dev/null 2>&1; then
    left_out "no C compiler (cc); $skipped"
fi

have_lua() {
    command -v lua5.1 >/dev/null 2>&1 && lua5.1 -e 'require("dkjson")' >/dev/null 2>&1
}
if ! have_lua; then
    apt_install "the Argo CD health check tests" lua5.1 lua-dkjson
    if ! have_lua; then
        left_out "lua5.1 or lua-dkjson is missing (apt-get install lua5.1 lua-dkjson as root);\
 tests/unit/test_argocd_health.py will skip (fail under CI)"
    fi
fi
if ! command -v redis-server >/dev/null 2>&1; then
    apt_install "Argo CD on the dev-cluster" redis-server
    if ! command -v redis-server >/dev/null 2>&1; then
        left_out "redis-server is missing (apt-get install redis-server as root);\
 tests/e2e/test_argocd.py will fail"
    fi
fi
if ! command -v spin >/dev/null 2>&1; then
    apt_install "the hand-off model's checks" spin
    if ! command -v spin >/dev/null 2>&1; then
        left_out "spin is missing (apt-get install spin as root);\
 tests/unit/test_handoff_spin.py will skip (fail under CI)"
    fi
fi
if [ -n "$missing" ] && [ "${CI:-}" = true ]; then
    echo "native-deps: CI=true builds and tests everything, but these are missing:$missing" >&2
    exit 1
fi
exit 0
