#!/bin/sh
# Copies the Kafka broker's runtime jars (pom.xml) into $APPORTION_KAFKA_HOME (default
# ~/.cache/apportion/kafka/<kafka version>/lib) once; a no-op when they are there. broker.py runs
# the broker from that directory with `java -cp`; nothing is downloaded at run time.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
version=$(sed -n 's|.*<kafka.version>\(.*\)</kafka.version>.*|\1|p' "$here/pom.xml")
home=${APPORTION_KAFKA_HOME:-$HOME/.cache/apportion/kafka/$version}
# The stamp carries the pom's checksum: editing the pom fetches again.
stamp="$home/.fetched-$(cksum < "$here/pom.xml" | cut -d' ' -f1)"
[ -f "$stamp" ] && exit 0
mkdir -p "$home"
# Parallel `make` runs (worktrees sharing the cache) wait for one fetch instead of racing it.
exec 9>"$home/.lock"
flock 9
[ -f "$stamp" ] && exit 0
rm -rf "$home/lib.tmp"
mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies -DoutputDirectory="$home/lib.tmp"
rm -rf "$home/lib" "$home"/.fetched-*
mv "$home/lib.tmp" "$home/lib"
touch "$stamp"
echo "Kafka $version jars in $home/lib"
