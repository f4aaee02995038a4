#!/bin/sh
# Debian packages for the dev-cluster's real node (docs/dev-cluster.md#a-real-node): runc, the
# CNI plugins, buildah (image builds without a Docker engine), iptables (kube-proxy), debootstrap
# (a local base image where the Dockerfile's default base cannot be pulled), openssl (the
# cluster's certificates). Installed when missing and we can (root with apt-get); otherwise a
# note: the demo then runs on the pod simulator and says why. Never fails the setup.
set -u
packages="runc containernetworking-plugins buildah iptables debootstrap openssl"
missing=""
for package in $packages; do
    dpkg -s "$package" >/dev/null 2>&1 || missing="$missing $package"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "node-deps: installing$missing for the real node"
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086
    apt-get install -y -qq $missing >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq $missing >/dev/null; } \
        || echo "node-deps: note: could not install$missing; no real node" >&2
else
    echo "node-deps: note:$missing missing (apt-get install as root); no real node" >&2
fi
exit 0
