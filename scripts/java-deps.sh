#!/bin/sh
# Java 17 and Maven for the Java client (clients/java): a no-op when both are present (the
# machines this project runs on have them); else installs Debian's packages when root with
# apt-get, else fails with what to install: the Java suites are part of `make test`.
set -u
have() { command -v mvn >/dev/null 2>&1 && command -v javac >/dev/null 2>&1; }

if ! have && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "java-deps: installing Java 17 and Maven"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null; }
fi
if ! have; then
    echo "java-deps: Java 17 (javac) and Maven (mvn) are needed; install them" >&2
    exit 1
fi
