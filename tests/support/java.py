"""The Java parts the e2e tests run as processes, built with Maven as `make java` builds them
(seconds when up to date), from the same local repository."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLIENT = "clients/java"


def local_repository() -> Path:
    """The Maven local repository `make java` fills: $MAVEN_REPO, else ~/.m2/repository of $HOME
    (named to Maven explicitly: Maven's own default follows the JVM's user.home, which is the
    account's home from the password database, whatever $HOME says)."""
    return Path(os.environ.get("MAVEN_REPO", str(Path.home() / ".m2" / "repository")))


def maven(module: str, goal: str) -> None:
    subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            f"-Dmaven.repo.local={local_repository()}",
            "-f",
            str(REPO / module / "pom.xml"),
            goal,
            "-DskipTests",
        ],
        check=True,
    )


def classpath(module: str) -> str:
    """`module` packaged (the Java client installed first when it is a dependency) and its
    runtime classpath: its classes, then target/classpath.txt (maven-dependency-plugin).
    One build at a time per checkout (a lock on the client's pom): pytest-xdist workers would
    otherwise write the same target/ directories and installed jars at once."""
    with (REPO / CLIENT / "pom.xml").open() as pom:
        fcntl.flock(pom, fcntl.LOCK_EX)
        if module != CLIENT:
            maven(CLIENT, "install")
        maven(module, "package")
    target = REPO / module / "target"
    return f"{target / 'classes'}:{(target / 'classpath.txt').read_text().strip()}"
