"""Checks the Spin model of the hand-off protocol (models/handoff/handoff.pml) exhaustively,
and refutes each mutant of it (docs/handoff.md, "How we know").

`python scripts/model_check.py` (`make model`) prints a table: check, states, memory, time,
result. tests/unit/test_handoff_spin.py runs the same checks. Needs spin and a C compiler.
Every search is exhaustive: states are stored compressed (-DCOLLAPSE, lossless), never hashed
into bits (bitstate) or compacted (-DHC), which could skip states.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MODEL = Path(__file__).resolve().parent.parent / "models" / "handoff" / "handoff.pml"
BOUNDS = ("-DNU=1", "-DMAXE=3", "-DTMIN=1")
"""Two pod names, one unit, table epochs up to 3 (repairs above), handoffTimeout one tick."""
MEMLIM_MB = 3072
"""pan stops at this much memory; a search that stops there is not a full one."""


@dataclass(frozen=True)
class Check:
    """One run of the model: `defines` on top of BOUNDS; a mutant must be refuted.

    `live`: the liveness property (`ltl served`, -DLIVE) under weak fairness (pan -a -f)
    instead of the safety properties."""

    name: str
    defines: tuple[str, ...]
    mutant: bool = False
    rule: str = ""
    violates: str = ""
    """For a mutant: the property its counterexample breaks."""
    live: bool = False


_ALL_FAULTS = ("-DCRASHES=2", "-DATTACKS=2", "-DRESTARTS", "-DPODS")
_LIVE_EPOCHS = "-DMAXE=2"
"""Liveness from every state goes quiet in each: tables up to epoch 2 before, to fit in CI."""

# The fault groups one at a time, each as deep as its own bound allows, then all of them at
# once under a budget of faults in all.
SAFETY = (
    Check("StopServing+KeepServing+Grow: hand-offs, timeouts, leases", ()),
    Check("... with two units", ("-DNU=2",)),
    Check("... with an operator crash", ("-DCRASHES=1",)),
    Check("... with the table deleted or rolled back", ("-DATTACKS=1",)),
    Check("... with container restarts in place", ("-DRESTARTS",)),
    Check("... with pods terminated, deleted, recreated", ("-DPODS", "-DMAXINC=2")),
    Check("... with any two faults of all kinds", (*_ALL_FAULTS, "-DFAULTS=2")),
    Check("KeepServing+Grow without leases (KeepServing mode)", ("-DKEEP",)),
)
_NO_FAULTS = ("-DCRASHES=0", "-DATTACKS=0")

LIVENESS = (
    Check("Liveness: every unit served once faults stop", (), live=True),
    Check(
        "... after any one fault of any kind (epochs up to 2)",
        (*_ALL_FAULTS, "-DFAULTS=1", _LIVE_EPOCHS),
        live=True,
    ),
    Check(
        "... after a crash and a table attack (epochs up to 2)",
        ("-DCRASHES=1", "-DATTACKS=1", _LIVE_EPOCHS),
        live=True,
    ),
    Check(
        "... after restarts and pod deletions (epochs up to 2)",
        ("-DRESTARTS", "-DPODS", _LIVE_EPOCHS),
        live=True,
    ),
    Check("... in KeepServing mode", ("-DKEEP",), live=True),
)

BY_HAND = (
    Check(
        "... with any three faults, one crash and one attack at most",
        ("-DCRASHES=1", "-DATTACKS=1", "-DRESTARTS", "-DPODS", "-DFAULTS=3"),
    ),
    Check("... with any two faults, pods recreated", (*_ALL_FAULTS, "-DMAXINC=2", "-DFAULTS=2")),
    Check(
        "Liveness after any two faults (epochs up to 2)",
        (*_ALL_FAULTS, "-DFAULTS=2", _LIVE_EPOCHS),
        live=True,
    ),
    Check("Liveness after a crash and a table attack", ("-DCRASHES=1", "-DATTACKS=1"), live=True),
)
"""Beyond a CI budget (docs/handoff.md, "How we know"): `model_check.py --by-hand`."""

MUTANTS = (
    Check(
        "M_NO_ACK_WAIT",
        ("-DM_NO_ACK_WAIT",),
        True,
        "a release is granted only after the owner's ack (or the timeout)",
        "StopServing",
    ),
    Check(
        "M_ACK_EPOCH_IGNORED",
        ("-DM_ACK_EPOCH_IGNORED",),
        True,
        "an ack counts only if written after the release (release.epoch <= ack.epoch)",
        "StopServing",
    ),
    Check(
        "M_TOKEN_KEPT",
        ("-DM_TOKEN_KEPT",),
        True,
        "the new owner's token is the write's epoch, above every earlier one",
        "KeepServing",
    ),
    Check(
        "M_LEASE_OUTLIVES_TIMEOUT",
        ("-DM_LEASE_OUTLIVES_TIMEOUT",),
        True,
        "a worker's lease ends before the operator's timeout (L(1+rho)+S <= T(1-rho))",
        "StopServing",
    ),
    Check(
        "M_NOBODY_WITHOUT_RELEASE",
        ("-DM_NOBODY_WITHOUT_RELEASE", "-DPODS"),
        True,
        "a leaving owner releases to nobody and waits for the ack before the unit is unowned",
        "StopServing",
    ),
    Check(
        "M_REPAIR_IGNORES_RESERVATION",
        ("-DM_REPAIR_IGNORES_RESERVATION", "-DCRASHES=1", "-DATTACKS=1"),
        True,
        "a repaired table's epoch is above the reserved epochs",
        "Grow",
    ),
    Check(
        "M_FENCE_NOT_WAITED",
        ("-DM_FENCE_NOT_WAITED", "-DCRASHES=1", "-DATTACKS=1"),
        True,
        "after a fence nothing is assigned until handoffTimeout has passed",
        "StopServing",
    ),
    Check(
        "M_NO_TIMEOUT",
        ("-DM_NO_TIMEOUT", "-DPODS", "-DRESTARTS", _LIVE_EPOCHS),
        True,
        "a release is completed handoffTimeout after it was known, acknowledged or not",
        "Liveness",
        live=True,
    ),
    Check(
        "M_FENCE_KEPT",
        ("-DM_FENCE_KEPT", "-DCRASHES=1", "-DATTACKS=1", _LIVE_EPOCHS),
        True,
        "a fence is lifted handoffTimeout after it was written",
        "Liveness",
        live=True,
    ),
)

KEEP_SAFETY = tuple(
    Check(f"{m.name} keeps safety", m.defines) for m in MUTANTS if m.violates == "Liveness"
)
"""A liveness mutant breaks no safety property: waiting longer is always safe."""

CHECKS = SAFETY + KEEP_SAFETY + LIVENESS
"""Every check that must hold, in the order of the table."""


@dataclass(frozen=True)
class Outcome:
    check: Check
    errors: int
    states: int
    memory_mb: float
    seconds: float
    full: bool
    output: str

    @property
    def violated(self) -> str | None:
        """The property the first error breaks (None: none)."""
        if "acceptance cycle" in self.output:
            return "Liveness"
        found = re.search(r"assertion violated (.*) \(at depth", self.output)
        if found is None:
            return None
        text = found.group(1)
        if text == "0":
            return "StopServing"  # the monitor's assert(false)
        return "Grow" if "lastEp" in text or "lastTok" in text else "KeepServing"

    @property
    def passed(self) -> bool:
        if self.check.mutant:
            return self.errors >= 1 and self.violated == self.check.violates
        return self.errors == 0 and self.full


def defines_of(check: Check) -> list[str]:
    """BOUNDS, with faults off, unless the check says otherwise."""
    given = {d.split("=")[0] for d in check.defines}
    base = [d for d in (*BOUNDS, *_NO_FAULTS) if d.split("=")[0] not in given]
    return [*base, *(["-DLIVE"] if check.live else []), *check.defines]


def run(check: Check, workdir: Path, model: Path = MODEL) -> Outcome:
    """spin -a, cc, pan: exhaustive, stopping at the first error. Safety: assertions and the
    StopServing monitor; liveness: acceptance cycles of `ltl served` under weak fairness."""
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["spin", *defines_of(check), "-a", str(model)], cwd=workdir, check=True, capture_output=True
    )
    # NFAIR: room for the fairness bookkeeping of the liveness model's nine processes
    mode = ["-DNFAIR=3"] if check.live else ["-DSAFETY"]
    subprocess.run(
        ["cc", "-O2", "-w", *mode, "-DCOLLAPSE", f"-DMEMLIM={MEMLIM_MB}", "-o", "pan", "pan.c"],
        cwd=workdir,
        check=True,
        capture_output=True,
    )
    search = ["-a", "-f"] if check.live else []
    done = subprocess.run(
        ["nice", "-n", "10", "./pan", *search, "-m200000"],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    out = done.stdout
    errors = int(_find(r"errors: (\d+)", out))
    states = int(_find(r"(\d+) states, stored", out))
    memory = float(_find(r"([\d.]+)\s+total actual memory usage", out, "0"))
    seconds = float(_find(r"pan: elapsed time ([\d.e+]+) seconds", out, "0"))
    full = (
        "Full statespace search" in out
        and "reached -DMEMLIM bound" not in out
        and "max search depth too small" not in out
    )
    return Outcome(check, errors, states, memory, seconds, full, out)


def _find(pattern: str, text: str, default: str | None = None) -> str:
    found = re.search(pattern, text)
    if found is None:
        if default is not None:
            return default
        raise ValueError(f"pan printed no {pattern!r}:\n{text}")
    return found.group(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--by-hand", action="store_true", help="also the checks beyond a CI budget (BY_HAND)"
    )
    args = parser.parse_args(argv)
    for tool in ("spin", "cc"):
        if shutil.which(tool) is None:
            print(f"model_check: {tool} is missing (apt-get install spin gcc)", file=sys.stderr)
            return 2
    failed = 0
    print(f"{'check':<58} {'states':>10} {'MB':>6} {'s':>5}  result")
    with tempfile.TemporaryDirectory(prefix="apportion-model-") as tmp:
        for index, check in enumerate(CHECKS + (BY_HAND if args.by_hand else ()) + MUTANTS):
            outcome = run(check, Path(tmp) / str(index))
            if check.mutant:
                verdict = f"refuted: {outcome.violated}" if outcome.passed else "NOT REFUTED"
            else:
                verdict = "holds, full search" if outcome.passed else "VIOLATED OR INCOMPLETE"
            failed += not outcome.passed
            print(
                f"{check.name:<58} {outcome.states:>10} {outcome.memory_mb:>6.0f} "
                f"{outcome.seconds:>5.0f}  {verdict}"
            )
    print(f"bounds: {' '.join(BOUNDS)}, 2 pod names; {failed} check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
