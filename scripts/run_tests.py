"""`make test`: the gates, the builds and the three test tiers, side by side where they can be.

The suite mostly waits (on API servers, pods, JVMs), so the tiers run at the same time instead
of one after another, in four streams that start once the gates passed:

    go     controlplane (metrics-server with it), the real node's containerd, then, once the
           image is built too, the real-node tier (one real node per machine: its tests and
           `make demo` run one at a time, in a pytest of their own)
    image  the project's image (buildah)
    java   java (Maven build and JUnit suites), kafka-jars, then the unit tier
    e2e    once controlplane, java and kafka-jars are built: the simulator's e2e tier, in
           pytest-xdist workers with a dev-cluster each (a module stays on one worker)

Each tier's output goes to .test-results/<tier>.log and is printed whole when the tier ends
(pytest's closing "N passed" line included); its slowest tests (--durations) also go to
.test-results/<tier>-durations.txt. The run ends with how long every step took, a table to
read (never a check: the machine may be slow), and exits non-zero if a step failed. A tier
with no test on this machine (pytest's exit 5, e.g. the real node without root) is not a
failure; under CI=true the tiers refuse to leave tests out (tests/conftest.py).

Stdlib only: it runs before the virtualenv exists (`make setup` is its first step).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / ".test-results"
PYTEST = (str(REPO / ".venv" / "bin" / "pytest"), "--durations=25", "-p", "no:cacheprovider")
APPORTION = str(REPO / ".venv" / "bin" / "apportion")
# What every real-node test and `make demo` need before they start. The other Go tools (helm,
# krew, kstatus, promtool, Flux) build in the background at the lowest CPU priority while the
# tiers run (tests/support/prebuild.py), as compiling them up front would hold the real-node
# tier back by a quarter of an hour of CPU the waiting tiers leave idle.
NODE_TOOLS = ("containerd",)
NO_TESTS = 5  # pytest's exit status when nothing was collected (or everything left out)
# The simulator's tier: two workers, each with its own dev-cluster (ports, state directory and
# pod addresses are its own); a module's tests stay on one worker, so its fixtures start once.
E2E_WORKERS = os.environ.get("APPORTION_E2E_WORKERS", "2")


@dataclass
class Step:
    name: str
    command: Sequence[str]
    needs: tuple[str, ...] = ()
    tier: bool = False
    status: str = "not run"
    start: float = 0.0
    seconds: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "no tests")


def make(target: str) -> list[str]:
    return ["make", "--no-print-directory", target]


def pytest(*args: str) -> list[str]:
    return [*PYTEST, *args]


GATES = [
    Step("setup", make("setup")),
    Step("lint", make("lint")),
    Step("postgres-deps", make("postgres-deps")),
]
# A stream runs its steps in order (so that two Maven or two Go builds never run at once); a
# step runs when the steps it `needs` succeeded, whichever stream they are in.
STREAMS = {
    "go": [
        Step("controlplane", make("controlplane")),
        Step("node tools", (APPORTION, "dev-cluster", "tools", *NODE_TOOLS)),
        Step(
            "realnode tier",
            pytest("tests/e2e", "-m", "one_per_machine"),
            needs=("controlplane", "node tools", "image"),
            tier=True,
        ),
    ],
    # buildah and Debian's packages, no Go: beside the Go builds rather than after them, where
    # it held the real-node tier back by 5 minutes of a cold run.
    "image": [Step("image", make("image"))],
    "java": [
        Step("java", make("java")),
        Step("kafka-jars", make("kafka-jars")),
        Step("unit tier", pytest("tests/unit"), tier=True),
    ],
    "e2e": [
        Step(
            "e2e tier",
            pytest(
                "tests/e2e",
                "-m",
                "not one_per_machine",
                "-n",
                E2E_WORKERS,
                "--dist",
                "loadfile",
            ),
            needs=("controlplane", "java", "kafka-jars"),
            tier=True,
        ),
    ],
}
STEPS = {s.name: s for s in [*GATES, *(s for stream in STREAMS.values() for s in stream)]}
T0 = time.monotonic()
PRINT = threading.Lock()


def say(text: str) -> None:
    with PRINT:
        print(f"[test {time.monotonic() - T0:6.0f} s] {text}", flush=True)


def log_of(step: Step) -> Path:
    return RESULTS / f"{step.name.replace(' tier', '').replace(' ', '-')}.log"


def durations_of(step: Step) -> Path:
    return log_of(step).with_name(f"{log_of(step).stem}-durations.txt")


def run(step: Step) -> bool:
    """Run one step with its output in its log; print the log when it ends (whole for a tier or
    a failure, its last lines otherwise)."""
    missing = [n for n in step.needs if not STEPS[n].done.wait() or not STEPS[n].ok]
    if missing:
        step.status = f"skipped (no {', '.join(missing)})"
        step.done.set()
        return False
    log = log_of(step)
    say(f"{step.name}: started ({' '.join(step.command)}; output in {log.relative_to(REPO)})")
    step.start = time.monotonic() - T0
    durations_of(step).unlink(missing_ok=True)
    with log.open("w") as out:
        try:
            code = subprocess.run(
                step.command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=False
            ).returncode
        except OSError as error:  # no such command: a failed step, not a hung run
            print(error, file=out)
            code = 127
    step.seconds = time.monotonic() - T0 - step.start
    if code == 0:
        step.status = "ok"
    elif step.tier and code == NO_TESTS:
        step.status = "no tests"
    else:
        step.status = f"FAILED (exit {code})"
    text = log.read_text(errors="replace")
    if step.tier:
        durations = re.search(r"^=+ slowest .*?(?=^=+ )", text, re.M | re.S)
        if durations:
            durations_of(step).write_text(durations.group(0))
    lines = text.splitlines()
    shown = lines if step.tier or not step.ok else lines[-5:]
    with PRINT:
        print(f"\n======== {step.name}: {step.status} after {step.seconds:.0f} s ========")
        print("\n".join(shown), flush=True)
    step.done.set()
    return step.ok


def stream(steps: list[Step]) -> None:
    for step in steps:
        run(step)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def table(steps: list[Step]) -> str:
    rows = [f"{'step':<16} {'from':>6} {'took':>6}  status"]
    for s in steps:
        ran = s.status not in ("not run",) and not s.status.startswith("skipped")
        start, took = (minutes(s.start), minutes(s.seconds)) if ran else ("", "")
        rows.append(f"{s.name:<16} {start:>6} {took:>6}  {s.status}")
    return "\n".join(rows)


def main() -> int:
    RESULTS.mkdir(exist_ok=True)
    for gate in GATES:
        if not run(gate):
            break
    else:
        threads = [threading.Thread(target=stream, args=(s,)) for s in STREAMS.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    total = time.monotonic() - T0
    summary = (
        f"{table(list(STEPS.values()))}\n"
        f"{'total':<16} {'':>6} {minutes(total):>6}  (load average now "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, {os.cpu_count()} cores)"
    )
    (RESULTS / "timings.txt").write_text(summary + "\n")
    print(f"\n======== how long each step took (min:s, from the start) ========\n{summary}")
    for step in STEPS.values():
        if step.tier and durations_of(step).exists():
            print(f"  {step.name}: slowest tests in {durations_of(step).relative_to(REPO)}")
    failed = [s.name for s in STEPS.values() if not s.ok]
    if failed:
        print(f"\nmake test FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
