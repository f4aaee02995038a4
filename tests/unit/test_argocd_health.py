"""apportion's Argo CD health checks (manifests/argocd/, docs/gitops.md), each case run twice:
- by Argo CD itself (argocd-lua, devtools/go/argocd/argocd-lua, built from Argo CD's Go
  module): the shipped argocd-cm patch read by Argo CD's settings manager as a user's argocd-cm,
  each object's script found by its group and kind and run in Argo CD's Lua VM (gopher-lua, its
  restricted libraries), as the application-controller does;
- by a real Lua 5.1 interpreter: Debian's lua5.1 with lua-dkjson (scripts/native-deps.sh installs
  both), through argocd_run_health.lua, which gives the script only the libraries Argo CD gives
  it. Missing, those tests skip with what to install; under CI they fail.

Fixtures: tests/fixtures/statuses/<kind>-<phase>.json, whole objects as `kubectl get -o json`
returns them. Those committed with this test are written by hand from the status the operator
writes today (engine/set_status.py `unit_set_status`, engine/kstatus.py `blocked_conditions`,
engine/grains/status.py `build_status`) plus the two kstatus conditions of the status
contract the operator is being extended to: Reconciling (True while placing, moving units,
resharding, retrying a failed pass) and Stalled (True when only a user's change helps:
InvalidSpec, NoMembers, WorkloadNotFound, HandoffTimedOut, strategy failure, GrainType
conflicts). Statuses recorded from the dev-cluster replace them; the health each phase must map
to (PHASES) stays, the messages (MESSAGES) follow the recorded reasons."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("argocd_run_health.lua")
FIXTURES = REPO / "tests" / "fixtures" / "statuses"
HEALTH = REPO / "manifests" / "argocd" / "health"
PATCH = REPO / "manifests" / "argocd" / "argocd-cm-patch.yaml"
KINDS = ("GrainType", "PartitionSet", "ShardSet")


def generator() -> Any:
    """scripts/argocd_health.py, which writes the checked-in files."""
    from scripts import argocd_health

    return argocd_health


@pytest.fixture(scope="module")
def lua() -> str:
    found = shutil.which("lua5.1")
    dkjson = found and subprocess.run(
        [found, "-e", 'require("dkjson")'], capture_output=True, check=False
    )
    if found and dkjson and dkjson.returncode == 0:
        return found
    missing = "lua5.1" if not found else "lua-dkjson"
    why = f"{missing} is missing: apt-get install lua5.1 lua-dkjson (scripts/native-deps.sh)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI runs the Argo CD health checks, but {why}")
    pytest.skip(why)


Health = Callable[[str, dict[str, Any]], dict[str, str]]
"""What the checked-in check of a kind says about an object: {"status", "message"}."""


def lua51_health(lua: str) -> Health:
    def run(kind: str, obj: dict[str, Any]) -> dict[str, str]:
        done = subprocess.run(
            [lua, str(HARNESS), str(HEALTH / f"apportion.dev_{kind}.lua")],
            input=json.dumps(obj),
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, str] = json.loads(done.stdout)
        return result

    return run


def argocd_health(argocd_lua: Path) -> Health:
    def run(kind: str, obj: dict[str, Any]) -> dict[str, str]:
        # Argo CD picks the script by the object's group and kind: `kind` only says which we meant
        assert obj["kind"] == kind
        done = subprocess.run(
            [str(argocd_lua), "-cm", str(PATCH)],
            input=json.dumps(obj),
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        result = json.loads(done.stdout)
        assert result["kind"] == kind
        return {"status": result["status"], "message": result["message"]}

    return run


@pytest.fixture(params=["argocd", "lua5.1"])
def health(request: pytest.FixtureRequest) -> Health:
    if request.param == "argocd":
        return argocd_health(request.getfixturevalue("argocd_lua"))
    return lua51_health(request.getfixturevalue("lua"))


def fixture(kind: str, phase: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads((FIXTURES / f"{kind.lower()}-{phase}.json").read_text())
    assert obj["kind"] == kind
    return obj


# Statuses the operator wrote on the dev-cluster (tests/e2e/test_kstatus.py records them), and
# the health Argo CD should show for each, worked out by hand from the rules in docs/gitops.md.
WAITING = "waiting for the operator to observe generation 1"
STALLED_NO_MEMBERS = (
    "NoMembers: no worker pod matches the selector; the last published assignment is kept"
)
EXPECTED = {
    "partitionset-created": ("Progressing", WAITING),
    "partitionset-generation-behind": (
        "Progressing",
        "waiting for the operator to observe generation 2",
    ),
    "partitionset-placing": (
        "Progressing",
        "WaitingForMembers: the first placement waits for 2 ready member(s) "
        "(startup.minMembers); 1 ready so far",
    ),
    "partitionset-rebalancing": ("Progressing", "HandoffInProgress: 3 unit(s) being handed off"),
    "partitionset-settled": ("Healthy", "Assigned: every unit has a live owner (epoch 1)"),
    "partitionset-observed": ("Healthy", "Assigned: every unit has a live owner (epoch 2)"),
    "partitionset-stalled": ("Degraded", STALLED_NO_MEMBERS),
    "partitionset-workload-not-found": (
        "Degraded",
        "WorkloadNotFound: StatefulSet nowhere does not exist; the last published assignment is "
        "kept",
    ),
    "partitionset-handoff-timed-out": (
        "Degraded",
        "HandoffTimedOut: kw-1 did not acknowledge the release of 1 unit(s) (11) within "
        "handoffTimeout; reassigned to kw-2 anyway",
    ),
    "shardset-created": ("Progressing", WAITING),
    "shardset-rebalancing": ("Progressing", "HandoffInProgress: 15 unit(s) being handed off"),
    "shardset-settled": ("Healthy", "Assigned: every unit has a live owner (epoch 1)"),
    "shardset-stalled": ("Degraded", STALLED_NO_MEMBERS),
    "graintype-created": ("Progressing", WAITING),
    "graintype-settled": (
        "Healthy",
        "Published: placement table version 3 with 2 compatible members",
    ),
    "graintype-stalled": ("Degraded", "NoMembers: no pod matches the selector 'app=silo'"),
    "graintype-conflict": (
        "Degraded",
        "GrainTypeConflict: 'carts' also claimed by b-carts: workers use the GrainType whose "
        "name sorts first",
    ),
}


def test_every_recorded_status_has_an_expectation() -> None:
    assert {p.stem for p in FIXTURES.glob("*.json")} == EXPECTED.keys()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_recorded_status_has_its_health(health: Health, name: str) -> None:
    obj = json.loads((FIXTURES / f"{name}.json").read_text())
    status, message = EXPECTED[name]
    assert health(obj["kind"], obj) == {"status": status, "message": message}


def condition(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-11-26T09:00:00Z",
        "observedGeneration": 1,
    }


def with_conditions(kind: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    """The kind's settled object with exactly these conditions."""
    obj = copy.deepcopy(fixture(kind, "settled"))
    obj["status"]["conditions"] = list(conditions)
    return obj


STALLED = condition("Stalled", "True", "NoMembers", "the selector matches no pod")
RECONCILING = condition("Reconciling", "True", "Placing", "placing 3 of 32 units")
NOT_STALLED = condition("Stalled", "False", "AsExpected")
NOT_RECONCILING = condition("Reconciling", "False", "Placed")
READY = condition("Ready", "True", "Assigned", "every unit has a live owner")
NOT_READY = condition("Ready", "False", "UnitsUnassigned", "2 of 32 unit(s) have no live owner")
DEGRADED = condition("Degraded", "True", "NoStatistics", "no member reports load")
NOT_DEGRADED = condition("Degraded", "False", "AsExpected")

# (what, conditions, status, message), written by hand from the rules in docs/gitops.md.
RULES = [
    (
        "Stalled=True wins over Ready=True and Reconciling=True",
        [READY, RECONCILING, STALLED],
        "Degraded",
        "NoMembers: the selector matches no pod",
    ),
    (
        "Reconciling=True over Ready=True",
        [READY, NOT_DEGRADED, RECONCILING, NOT_STALLED],
        "Progressing",
        "Placing: placing 3 of 32 units",
    ),
    (
        "Ready=False beside kstatus conditions is in progress, as kstatus says, even Degraded",
        [NOT_READY, DEGRADED, NOT_RECONCILING, NOT_STALLED],
        "Progressing",
        "UnitsUnassigned: 2 of 32 unit(s) have no live owner",
    ),
    (
        "Ready=True with Degraded=True is Healthy, and says what is degraded",
        [READY, DEGRADED, NOT_RECONCILING, NOT_STALLED],
        "Healthy",
        "Assigned: every unit has a live owner (degraded: NoStatistics: no member reports load)",
    ),
    (
        "Ready=Unknown is in progress",
        [condition("Ready", "Unknown", "Starting"), NOT_RECONCILING, NOT_STALLED],
        "Progressing",
        "Starting",
    ),
    (
        "an old operator (no Stalled, no Reconciling): Ready=True",
        [READY, NOT_DEGRADED],
        "Healthy",
        "Assigned: every unit has a live owner",
    ),
    (
        "an old operator: Ready=False with Degraded=True is Degraded",
        [condition("Ready", "False", "NoMembers", "no pod"), DEGRADED],
        "Degraded",
        "NoStatistics: no member reports load",
    ),
    (
        "an old operator: Ready=False without Degraded is in progress",
        [condition("Ready", "False", "WaitingForMembers", "2 of 4 ready"), NOT_DEGRADED],
        "Progressing",
        "WaitingForMembers: 2 of 4 ready",
    ),
    (
        "no conditions at all",
        [],
        "Progressing",
        "waiting for the operator to report Ready",
    ),
]


@pytest.mark.parametrize(
    ("conditions", "status", "message"),
    [pytest.param(c, s, m, id=what) for what, c, s, m in RULES],
)
@pytest.mark.parametrize("kind", KINDS)
def test_the_rules(
    health: Health, kind: str, conditions: list[dict[str, Any]], status: str, message: str
) -> None:
    assert health(kind, with_conditions(kind, *conditions)) == {
        "status": status,
        "message": message,
    }


@pytest.mark.parametrize("kind", KINDS)
def test_a_generation_the_operator_has_not_observed_is_in_progress(
    health: Health, kind: str
) -> None:
    obj = with_conditions(kind, READY, NOT_DEGRADED, NOT_RECONCILING, NOT_STALLED)
    obj["metadata"]["generation"] = 3
    obj["status"]["observedGeneration"] = 2
    assert health(kind, obj) == {
        "status": "Progressing",
        "message": "waiting for the operator to observe generation 3",
    }
    obj["status"]["observedGeneration"] = 3
    assert health(kind, obj)["status"] == "Healthy"


@pytest.mark.parametrize("kind", KINDS)
def test_a_null_status_or_one_without_observed_generation_is_in_progress(
    health: Health, kind: str
) -> None:
    """JSON null is nil to the script, as in Argo CD, not a truthy placeholder."""
    obj = fixture(kind, "settled")
    waiting = {"status": "Progressing", "message": WAITING}
    assert health(kind, {**obj, "status": None}) == waiting
    assert health(kind, {**obj, "status": {"conditions": [READY]}}) == waiting


def test_the_checked_in_files_are_generated_from_the_one_body() -> None:
    for path, text in generator().render().items():
        assert path.read_text() == text, (
            f"{path.relative_to(REPO)} is stale: run `make argocd-health`"
        )
    assert sorted(p.name for p in HEALTH.iterdir()) == [
        f"apportion.dev_{kind}.lua" for kind in KINDS
    ]


def test_there_is_a_check_for_every_kind_the_crds_define() -> None:
    crds = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "crds").glob("*.yaml"))]
    assert {(c["spec"]["group"], c["spec"]["names"]["kind"]) for c in crds} == {
        (generator().GROUP, kind) for kind in KINDS
    }
    assert generator().KINDS == KINDS


def test_the_patch_carries_each_script_under_argo_cds_key() -> None:
    patch = yaml.safe_load(PATCH.read_text())
    assert (patch["apiVersion"], patch["kind"], patch["metadata"]["name"]) == (
        "v1",
        "ConfigMap",
        "argocd-cm",
    )
    assert patch["data"] == {
        f"resource.customizations.health.apportion.dev_{kind}": (
            HEALTH / f"apportion.dev_{kind}.lua"
        ).read_text()
        for kind in KINDS
    }


def test_the_helm_chart_ships_the_checks_of_the_manifests() -> None:
    shipped = REPO / "charts" / "apportion" / "files" / "argocd"
    assert shipped.is_symlink()
    assert shipped.resolve() == (REPO / "manifests" / "argocd")
