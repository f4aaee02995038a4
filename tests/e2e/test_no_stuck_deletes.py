"""No stuck deletes (issue 10): sets carry no finalizer — an old one is removed — so with the
operator stopped or uninstalled a GitOps prune or `kubectl delete namespace` goes through."""

from __future__ import annotations

from typing import Any

from tests.support.unitset import apply, get, unit_set, workers

SELECTOR = {"matchLabels": {"app": "w"}}
SETS: dict[str, dict[str, Any]] = {
    "PartitionSet": {"partitions": 4, "selector": SELECTOR},
    "ShardSet": {"shards": 8, "selector": SELECTOR},
    "GrainType": {"selector": SELECTOR},
}
KINDS = {"PartitionSet": "pset", "ShardSet": "sset", "GrainType": "gtype"}


def test_sets_and_their_namespace_delete_with_the_operator_stopped(
    operator, namespace, kubectl, wait_for
) -> None:
    apply(kubectl, namespace, workers("w", 2, grace=1))
    for kind, spec in SETS.items():
        obj = unit_set(kind, f"old-{kind.lower()}", spec)
        # As an earlier version of the operator left them: with kopf's finalizer.
        obj["metadata"]["finalizers"] = ["apportion.dev/cleanup"]
        apply(kubectl, namespace, obj, unit_set(kind, f"new-{kind.lower()}", spec))

    def handled_without_finalizers() -> bool:
        for kind, short in KINDS.items():
            for name in (f"old-{kind.lower()}", f"new-{kind.lower()}"):
                obj = get(kubectl, namespace, short, name)
                if obj["metadata"].get("finalizers") or "observedGeneration" not in obj.get(
                    "status", {}
                ):
                    return False
        return True

    wait_for(handled_without_finalizers, 60, "every set handled, none with a finalizer")
    assert operator.stop() == 0, operator.text()

    for short in KINDS.values():
        kubectl("delete", "-n", namespace, short, "--all", "--timeout=30s")
    kubectl("delete", "namespace", namespace, "--timeout=120s")
    gone = kubectl("get", "namespace", namespace, check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr
