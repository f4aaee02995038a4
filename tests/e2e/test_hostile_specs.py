"""Every input the API server accepts is handled (issue 10): each hostile spec below is either
rejected by the API server with a message a user understands, or accepted and reported in a
condition — never a traceback loop or a silent set."""

from __future__ import annotations

import pytest
import yaml

from tests.support.unitset import apply, condition, get, is_true, unit_set, workers

SELECTOR = {"matchLabels": {"app": "w"}}
LONG = "a-very-long-set-name-" + "x" * 232  # 253 characters, the API server's limit


def pset(name: str = "hostile", **spec):
    return unit_set("PartitionSet", name, {"partitions": 8, "selector": SELECTOR, **spec})


REJECTED = [
    (
        "a duration CEL cannot hold",
        pset(rebalance={"interval": "100000000h"}),
        "must be a duration like '10s', '1m30s' or '500ms': up to 4 parts of at most 5 digits",
    ),
    (
        "a duration of many parts",
        pset(rebalance={"handoffTimeout": "1h1h1h1h1h"}),
        "up to 4 parts of at most 5 digits each",
    ),
    (
        "a name longer than any object's",
        pset(name=LONG + "y"),
        "must be no more than 253 characters",
    ),
    (
        "a pin beyond the units",
        pset(strategy={"name": "External", "external": {"pins": [{"unit": 8, "member": "w-0"}]}}),
        "every pinned unit must be below spec.partitions",
    ),
]


@pytest.mark.parametrize(("case", "obj", "message"), REJECTED, ids=[r[0] for r in REJECTED])
def test_rejected_by_the_api_server_in_words(case, obj, message, dev_cluster, crds, namespace):
    result = dev_cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj), check=False
    )
    assert result.returncode != 0, f"{case}: accepted"
    assert message in result.stderr, result.stderr
    assert "type conversion error" not in result.stderr


ACCEPTED = [
    # (case, the set, condition type, status, reason)
    ("a name of 253 characters", pset(name=LONG), "Ready", "True", "Assigned"),
    (
        "a pin to a pod that does not exist",
        pset(
            strategy={
                "name": "External",
                "external": {"pins": [{"unit": 0, "member": "w-9"}, {"unit": 1, "member": "w-1"}]},
            }
        ),
        "Degraded",
        "True",
        "PinToUnknownPod",
    ),
    (
        "a selector no pod matches",
        unit_set(
            "PartitionSet", "nobody", {"partitions": 8, "selector": {"matchLabels": {"app": "x"}}}
        ),
        "Degraded",
        "True",
        "NoMembers",
    ),
]


def test_accepted_and_reported_in_a_condition(operator, namespace, kubectl, wait_for) -> None:
    apply(kubectl, namespace, workers("w", 2, grace=1))
    for _, obj, *_ in ACCEPTED:
        apply(kubectl, namespace, obj)

    missing: list[str] = []

    def reported() -> bool:
        missing.clear()
        for case, obj, type_, status, reason in ACCEPTED:
            found = get(kubectl, namespace, "pset", obj["metadata"]["name"])
            shown = condition(found, type_) if found.get("status") else None
            if not shown or (shown["status"], shown["reason"]) != (status, reason):
                missing.append(f"{case}: {type_} is {shown}")
        return not missing

    try:
        wait_for(reported, 90, "every hostile set reported in its conditions")
    finally:
        print("\n".join(missing))
    long = get(kubectl, namespace, "pset", LONG)
    assert is_true(long, "Ready")
    assert long["status"]["assignmentConfigMap"]
    assert "Traceback" not in operator.text()
