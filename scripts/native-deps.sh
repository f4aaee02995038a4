#!/bin/sh
# libxxhash-dev for the optional native key kernel (apportion.engine._keys), which links the
# system libxxhash. Installs it when the header is missing and we can (root with apt-get);
# otherwise says that the kernel will be skipped, in which case apportion uses its Python key
# path (apportion.engine.keys.NATIVE is False). Never fails the setup; a no-op when present.
set -u
header=/usr/include/xxhash.h
skipped="the native key kernel will be skipped (apportion uses its Python key path)"

if [ ! -f "$header" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "native-deps: installing libxxhash-dev for the native key kernel"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq libxxhash-dev >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq libxxhash-dev >/dev/null; }
    fi
    if [ ! -f "$header" ]; then
        echo "native-deps: note: $header is missing (apt-get install libxxhash-dev as root);" \
            "$skipped" >&2
    fi
fi
if ! command -v cc >/dev/null 2>&1; then
    echo "native-deps: note: no C compiler (cc); $skipped" >&2
fi
exit 0
