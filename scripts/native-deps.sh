#!/bin/sh
# Debian packages some builds and tests use; each is installed when missing and we can (root
# with apt-get), else a note says what is left out. Never fails the setup; a no-op when present.
# - libxxhash-dev for the optional native key kernel (apportion.engine._keys), which links the
#   system libxxhash; without it (or a C compiler) apportion uses its Python key path
#   (apportion.engine.keys.NATIVE is False).
# - lua5.1 and lua-dkjson, the Lua 5.1 interpreter and JSON module tests/unit/test_argocd_health.py
#   runs the Argo CD health checks with (manifests/argocd/); without them those tests skip,
#   and fail under CI.
set -u

# apt_install WHAT PACKAGE...: quietly, refreshing the package lists only when the first try
# fails; nothing without root or apt-get.
apt_install() {
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 0
    what=$1
    shift
    echo "native-deps: installing $* for $what"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq "$@" >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq "$@" >/dev/null; }
}

header=/usr/include/xxhash.h
skipped="the native key kernel will be skipped (apportion uses its Python key path)"
if [ ! -f "$header" ]; then
    apt_install "the native key kernel" libxxhash-dev
    if [ ! -f "$header" ]; then
        echo "native-deps: note: $header is missing (apt-get install libxxhash-dev as root);" \
            "$skipped" >&2
    fi
fi
if ! command -v cc >/dev/null 2>&1; then
    echo "native-deps: note: no C compiler (cc); $skipped" >&2
fi

have_lua() {
    command -v lua5.1 >/dev/null 2>&1 && lua5.1 -e 'require("dkjson")' >/dev/null 2>&1
}
if ! have_lua; then
    apt_install "the Argo CD health check tests" lua5.1 lua-dkjson
    if ! have_lua; then
        echo "native-deps: note: lua5.1 or lua-dkjson is missing (apt-get install lua5.1" \
            "lua-dkjson as root); tests/unit/test_argocd_health.py will skip (fail under CI)" >&2
    fi
fi
exit 0
