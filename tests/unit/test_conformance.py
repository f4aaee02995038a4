"""The Python library against the language-neutral conformance cases of conformance/ (the Java
client's JUnit suite reads the same files): stored tables, key -> unit vectors, and the worker
rule step by step."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from apportion.api.assignment import (
    Ack,
    AssignmentFormatError,
    AssignmentTable,
    ConfigMapPayload,
    Incarnation,
    IncompleteAssignment,
    ack_annotation_key,
    assignment_config_map,
    decode_assignment,
    from_document,
)
from apportion.engine.keys import PURE_SCHEMES, SCHEMES
from apportion.worker._worker_state import WorkerState

CONFORMANCE = Path(__file__).resolve().parents[2] / "conformance"
STORED = sorted((CONFORMANCE / "tables" / "stored").glob("*.json"))
KEY_FILES = sorted((CONFORMANCE / "keys").glob("*.json"))
WORKER_CASES = sorted((CONFORMANCE / "worker").glob("*.json"))


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def normalized(table: AssignmentTable) -> dict[str, Any]:
    """The table in the form the cases' `expect` uses (conformance/README.md)."""
    units: dict[str, Any] = {}
    for unit in table.unit_names:
        state = table.units[unit]
        entry: dict[str, Any] = {"owner": state.owner, "epoch": state.epoch}
        if state.releasing is not None:
            release = state.releasing
            entry["releasing"] = {"to": release.to, "since": release.since, "epoch": release.epoch}
        units[unit] = entry
    lineage = table.lineage
    return {
        "set": {
            "kind": table.set_ref.kind,
            "namespace": table.set_ref.namespace,
            "name": table.set_ref.name,
            "uid": table.set_ref.uid,
        },
        "generation": table.generation,
        "keyScheme": table.key_scheme,
        "count": table.count,
        "epoch": table.epoch,
        "ackAnnotation": table.set_ref.ack_annotation,
        "members": [{"name": m.name, "uid": m.uid} for m in table.members],
        "units": units,
        "lineage": None
        if lineage is None
        else {
            "fromCount": lineage.from_count,
            "toCount": lineage.to_count,
            "epoch": lineage.epoch,
            "parentEpochs": list(lineage.parent_epochs),
        },
        "servingLease": table.serving_lease,
    }


def test_every_case_is_stored_every_way() -> None:
    cases = {p.stem for p in (CONFORMANCE / "tables").glob("*.json")}
    stored = {(s["case"], s["storage"]) for s in map(load, STORED)}
    assert len(cases) > 20
    assert {(c, way) for c in cases for way in ("plain", "gzip", "chunked")} <= stored
    assert {c for c, _ in stored} == cases


def stored_bytes(stored: dict[str, Any]) -> bytes:
    """The document bytes a stored case holds, by the format's own rules (no checks)."""
    by_name = {cm["metadata"]["name"]: cm for cm in stored["configmaps"]}
    root = by_name[stored["name"]]
    data, binary = root.get("data", {}), root.get("binaryData", {})
    if "assignments.json" in data:
        return data["assignments.json"].encode()
    if "assignments.json.gz" in binary:
        return gzip.decompress(base64.b64decode(binary["assignments.json.gz"]))
    index = json.loads(data["assignments.index.json"])
    parts = [
        by_name[stored["name"] + c["suffix"]]["binaryData"]["assignments.part"]
        for c in index["chunks"]
    ]
    return gzip.decompress(b"".join(map(base64.b64decode, parts)))


@pytest.mark.parametrize(
    "path",
    [p for p in STORED if p.stem.rsplit(".", 1)[1] in ("plain", "gzip", "chunked")],
    ids=lambda p: p.stem,
)
def test_stored_tables_hold_the_current_cases(path: Path) -> None:
    """A hand-written case edited without running conformance/generate.py fails here."""
    stored = load(path)
    case = load(CONFORMANCE / "tables" / f"{stored['case']}.json")
    raw = stored_bytes(stored)
    if "raw" in case:
        assert raw.decode() == case["raw"]
    else:
        assert json.loads(raw) == case["document"]


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_stored_table(path: Path) -> None:
    stored = load(path)
    case = load(CONFORMANCE / "tables" / f"{stored['case']}.json")
    error = stored.get("error", case.get("error"))
    payloads = [ConfigMapPayload.from_configmap(cm, stored["name"]) for cm in stored["configmaps"]]
    if error is None:
        assert normalized(decode_assignment(payloads)) == case["expect"]
    else:
        expected = IncompleteAssignment if error == "incomplete" else AssignmentFormatError
        with pytest.raises(expected) as caught:
            decode_assignment(payloads)
        if error == "format":
            assert not isinstance(caught.value, IncompleteAssignment)


@pytest.mark.parametrize("path", KEY_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("schemes", [PURE_SCHEMES, SCHEMES], ids=["python", "default"])
def test_key_vectors(path: Path, schemes: dict[str, Any]) -> None:
    cases = load(path)
    scheme = schemes[cases["scheme"]]
    assert len(cases["vectors"]) > 20
    for vector in cases["vectors"]:
        for count, unit in vector["units"].items():
            assert scheme.unit(vector["key"], int(count)) == unit, (vector["key"], count)
        keys = [vector["key"]] * 2
        for count, unit in vector["units"].items():
            assert scheme.units(keys, int(count)).tolist() == [unit, unit], (vector["key"], count)


def test_names() -> None:
    cases = load(CONFORMANCE / "names.json")
    assert any(len(c["ackAnnotation"]) == len("apportion.dev/") + 63 for c in cases)
    for case in cases:
        assert assignment_config_map(case["kind"], case["name"]) == case["configMap"]
        assert ack_annotation_key(case["kind"], case["name"]) == case["ackAnnotation"]


def run_worker(case: dict[str, Any]) -> list[dict[str, Any]]:
    """Plays the case's steps against WorkerState; callbacks return at once unless the step
    says `pause`, then they run until a later step completes (or fails) them; a failed release
    runs on (it is retried) until a `retry` finds its unit taken away. What each step did, in
    the form of the cases' `expect` (conformance/README.md)."""
    me = Incarnation(case["me"]["name"], case["me"]["uid"])
    ref = case["set"]
    state = WorkerState(me, ref["kind"], ref["namespace"], ref["name"])
    running: dict[str, list[str]] = {}  # unit -> callbacks started and not returned, in order
    finish = {
        "stop": lambda u: state.stopped({u}),
        "release": lambda u: state.released({u}),
        "acquire": lambda u: state.acquired({u}),
        "fail": lambda u: state.acquired({u}, ok=False),
        "reshard": lambda u: state.resharded({u}),
    }
    results = []
    for step in case["steps"]:
        did: dict[str, Any] = {"stop": [], "release": [], "acquire": {}, "reshape": None}
        handled = _feed(state, step)
        if handled is not None:
            did["handled"] = handled
        _end_callbacks(state, step, running, finish)
        while (transition := state.next_transition()) is not None:
            did["stop"] += sorted(transition.stop)
            did["release"] += sorted(transition.release)
            did["acquire"].update(transition.tokens)
            carried: dict[str, Any] = {}
            if transition.resharding is not None and transition.resharding.carried:
                carried = dict(transition.resharding.carried)
                did["reshape"] = {
                    "carried": {u: list(parents) for u, parents in carried.items()},
                    "load": {u: list(ps) for u, ps in transition.resharding.load.items()},
                }
            started = {
                "stop": transition.stop,
                "reshard": carried,
                "release": transition.release,
                "acquire": transition.acquire,
            }
            for kind, units in started.items():
                for unit in units:
                    if step.get("pause"):
                        running.setdefault(unit, []).append(kind)
                    else:
                        finish[kind](unit)
        ack = state.ack_due()
        if ack is not None:
            state.ack_written(ack)
        did["ack"] = None if ack is None else json.loads(ack.to_annotation())
        did["owns"] = sorted(state.my_units())
        did["tokens"] = dict(sorted(state.held.items()))
        did["drained"] = state.drained()
        results.append(did)
    return results


def _feed(state: WorkerState, step: dict[str, Any]) -> bool | None:
    """Give the step's input (a table, an ack found, a signal) to `state`; what it answered
    to a table, else None."""
    if "table" in step:
        return state.receive(from_document(step["table"]))
    if "found" in step:
        state.ack_written(Ack.from_annotation(json.dumps(step["found"])))
    elif step.get("signal") == "resumed":
        state.resumed(step["suspendedFor"])
    elif "signal" in step:
        assert step["signal"] == "drain"
        state.start_draining()
    return None


def _end_callbacks(
    state: WorkerState,
    step: dict[str, Any],
    running: dict[str, list[str]],
    finish: Mapping[str, Callable[[str], object]],
) -> None:
    """The paused callbacks the step completes, fails or retries."""
    for unit in step.get("complete", []):
        for kind in running.pop(unit):
            finish[kind](unit)
    for unit in step.get("fail", []):
        if running[unit] == ["release"]:  # retried by the worker: still running
            state.release_failed({unit}, "callback failed")
        else:
            assert running.pop(unit) == ["acquire"]
            finish["fail"](unit)
    for unit in step.get("retry", []):
        if not state.retry_wanted({unit}):  # taken away: given up, stopped below
            state.release_abandoned({unit})
            assert running.pop(unit) == ["release"]


@pytest.mark.parametrize("path", WORKER_CASES, ids=lambda p: p.stem)
def test_worker_sequence(path: Path) -> None:
    case = load(path)
    results = run_worker(case)
    for number, (step, did) in enumerate(zip(case["steps"], results, strict=True)):
        expected = {"stop": [], "release": [], "acquire": {}, "reshape": None, **step["expect"]}
        assert {k: did[k] for k in expected} == expected, f"step {number}: {step.get('why')}"


def test_the_worker_cases_cover_the_rule() -> None:
    seen = {key for path in WORKER_CASES for r in run_worker(load(path)) for key in r if r[key]}
    assert len(WORKER_CASES) >= 10
    assert {"stop", "release", "acquire", "reshape", "ack", "drained"} <= seen
    steps = [step for path in WORKER_CASES for step in load(path)["steps"]]
    assert {"table", "signal", "found", "pause", "complete", "fail", "retry"} <= {
        k for s in steps for k in s
    }
