"""The generated CRDs on a real kube-apiserver: installed with `kubectl apply -f crds/`, valid
objects accepted and defaulted, invalid ones rejected with the message a user needs, status and
printer columns as `kubectl` shows them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from apportion.api import parse_resource, set_condition
from apportion.api.conditions import condition_time, dump_conditions
from apportion.api.unitset import MemberUnits, UnitSetStatus

REPO = Path(__file__).resolve().parents[2]
SELECTOR = {"matchLabels": {"app": "workers"}}


def manifest(kind: str, name: str, spec: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "apportion.dev/v1alpha1",
            "kind": kind,
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def apply(dev_cluster, namespace: str, kind: str, name: str, spec: dict, *, check=True):
    return dev_cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=manifest(kind, name, spec), check=check
    )


def get(dev_cluster, namespace: str, resource: str) -> dict[str, Any]:
    return json.loads(dev_cluster.kubectl("get", "-n", namespace, resource, "-o", "json").stdout)


def test_crds_are_established_with_names_and_categories(dev_cluster, crds) -> None:
    resources = dev_cluster.kubectl("api-resources", "--api-group=apportion.dev", "-o", "wide")
    lines = {line.split()[0]: line for line in resources.stdout.splitlines()[1:]}
    assert set(lines) == {"graintypes", "partitionsets", "shardsets"}
    assert "pset" in lines["partitionsets"]
    assert "apportion" in lines["partitionsets"]
    assert "sset" in lines["shardsets"]
    assert "gtype" in lines["graintypes"]


def test_the_crds_take_a_server_side_apply_as_gitops_engines_make(dev_cluster, crds) -> None:
    """Flux's kustomize-controller and Argo CD's server-side sync apply server-side, where a
    list the schema keys (x-kubernetes-validations, by `rule`) must not repeat a key: it did
    once (servingLease), and Flux could not install the operator."""
    applied = dev_cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=gitops",
        "--dry-run=server", "-f", str(REPO / "crds"), check=False,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.count("serverside-applied") == 3, applied.stdout


def test_valid_objects_are_accepted_and_defaulted(dev_cluster, crds, namespace) -> None:
    apply(
        dev_cluster, namespace, "PartitionSet", "orders", {"partitions": 12, "selector": SELECTOR}
    )
    apply(
        dev_cluster,
        namespace,
        "ShardSet",
        "carts",
        {
            "shards": 1000,
            "workloadRef": {"kind": "StatefulSet", "name": "cart-workers"},
            "strategy": {
                "name": "External",
                "external": {
                    "pins": [{"unit": 7, "member": "cart-workers-0"}],
                    "fallback": "LeastShards",
                },
                "leastShards": {"absoluteLimit": 5},
            },
            "rebalance": {
                "maxMovesPerRound": 50,
                "imbalanceTolerance": "5%",
                "handoffTimeout": "60s",
                "servingLease": "30s",  # half: the most the CEL rule allows
                "whenCutOff": "KeepServing",
            },
            "metrics": {"scrape": {"port": 9100, "path": "/load"}},
            "topologySpread": {"topologyKey": "topology.kubernetes.io/zone"},
        },
    )
    apply(
        dev_cluster,
        namespace,
        "GrainType",
        "users",
        {
            "grainTypes": ["MyApp.UserGrain"],
            "selector": {"matchExpressions": [{"key": "role", "operator": "Exists"}]},
            "strategy": {"name": "SiloRoleBased", "siloRoleBased": {"role": "frontend"}},
            "filters": [{"type": "RequiredMatch", "keys": ["zone"]}],
        },
    )

    orders = get(dev_cluster, namespace, "partitionset/orders")
    spec = orders["spec"]
    assert spec["keyScheme"] == "netherite"
    assert spec["strategy"] == {"name": "Balanced"}
    assert spec["rebalance"] == {
        "interval": "10s",
        "maxMovesPerRound": "25%",
        "imbalanceTolerance": "Default",
        "pauseDuringRollout": True,
        "scaleUpWait": "30s",
        "handoffTimeout": "60s",
        "restartGrace": "0s",
        "whenCutOff": "StopServing",
    }
    assert spec["metrics"] == {"podMetrics": True, "smoothing": {"halfLife": "30s"}}

    carts = get(dev_cluster, namespace, "shardset/carts")["spec"]
    assert carts["keyScheme"] == "akka"
    assert carts["strategy"]["leastShards"] == {"absoluteLimit": 5, "relativeLimitPercent": 10}
    assert carts["metrics"]["scrape"] == {
        "port": 9100,
        "path": "/load",
        "interval": "10s",
        "timeout": "2s",
    }
    assert carts["topologySpread"]["maxSkew"] == 1
    assert carts["rebalance"]["servingLease"] == "30s"

    users = get(dev_cluster, namespace, "graintype/users")["spec"]
    assert users["strategy"]["siloRoleBased"] == {
        "roleLabel": "apportion.dev/role",
        "role": "frontend",
    }
    assert users["filters"] == [{"type": "RequiredMatch", "keys": ["zone"], "minCandidates": 2}]
    assert users["loadShedding"] == {"enabled": True, "cpuThreshold": 95, "memoryThreshold": 90}

    # What the server stored parses into the models with the same values.
    for resource in ("partitionset/orders", "shardset/carts", "graintype/users"):
        obj = parse_resource(get(dev_cluster, namespace, resource))
        assert obj.to_json_dict()["spec"] == get(dev_cluster, namespace, resource)["spec"]


INVALID = [
    pytest.param(
        "PartitionSet",
        {"partitions": 4},
        "spec.selector or spec.workloadRef is required",
        id="no-selector",
    ),
    pytest.param(
        "PartitionSet",
        {"partitions": 0, "selector": SELECTOR},
        "should be greater than or equal to 1",
        id="zero-partitions",
    ),
    pytest.param(
        "PartitionSet",
        {"partitions": 5000, "selector": SELECTOR},
        "should be less than or equal to 1024",
        id="too-many-partitions",
    ),
    pytest.param(
        "ShardSet",
        {"shards": 100001, "selector": SELECTOR},
        "should be less than or equal to 100000",
        id="too-many-shards",
    ),
    pytest.param(
        "PartitionSet",
        {"partitions": 4, "selector": {}},
        "selector must not be empty",
        id="empty-selector",
    ),
    pytest.param(
        "PartitionSet",
        {"partitions": 4, "selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
        "values must be non-empty for operators In and NotIn",
        id="in-without-values",
    ),
    pytest.param(
        "PartitionSet",
        {"partitions": 4, "selector": {"matchLabels": {"bad key": "x"}}},
        "matchLabels keys must be valid label keys",
        id="bad-label-key",
    ),
    pytest.param(
        "ShardSet",
        {"shards": 10, "selector": SELECTOR, "strategy": {"name": "External"}},
        "strategy External needs strategy.external.pins",
        id="external-without-pins",
    ),
    pytest.param(
        "ShardSet",
        {
            "shards": 10,
            "selector": SELECTOR,
            "strategy": {"name": "External", "external": {"pins": [{"unit": 10, "member": "w-0"}]}},
        },
        "every pinned unit must be below spec.shards",
        id="pin-out-of-range",
    ),
    pytest.param(
        "ShardSet",
        {
            "shards": 10,
            "selector": SELECTOR,
            "strategy": {"name": "Balanced", "leastShards": {"absoluteLimit": 3}},
        },
        "strategy.leastShards applies only when strategy.name is LeastShards",
        id="options-of-another-strategy",
    ),
    pytest.param(
        "PartitionSet",
        {"partitions": 4, "selector": SELECTOR, "rebalance": {"handoffTimeout": "soon"}},
        "must be a duration like '10s', '1m30s' or '500ms'",
        id="bad-duration",
    ),
    pytest.param(
        "PartitionSet",
        {
            "partitions": 4,
            "selector": SELECTOR,
            "rebalance": {"handoffTimeout": "1m", "servingLease": "45s"},
        },
        "servingLease must be at most half of handoffTimeout",
        id="lease-too-long",
    ),
    pytest.param(
        "ShardSet",
        {"shards": 4, "selector": SELECTOR, "rebalance": {"whenCutOff": "Sometimes"}},
        'supported values: "StopServing", "KeepServing"',
        id="bad-when-cut-off",
    ),
    pytest.param(
        "PartitionSet",
        {"partitions": 4, "selector": SELECTOR, "rebalance": {"interval": "100ms"}},
        "rebalance.interval must be at least 1s",
        id="short-interval",
    ),
    pytest.param(
        "PartitionSet",
        {"partitions": 4, "selector": SELECTOR, "rebalance": {"maxMovesPerRound": "150%"}},
        "must be a non-negative integer or a percentage from '0%' to '100%'",
        id="bad-percentage",
    ),
    pytest.param(
        "PartitionSet",
        {"partitions": 4, "selector": SELECTOR, "rebalance": {"imbalanceTolerance": "Medium"}},
        "must be Tight, Default, Loose or a percentage",
        id="bad-tolerance",
    ),
    pytest.param(
        "PartitionSet",
        {
            "partitions": 4,
            "selector": SELECTOR,
            "topologySpread": {"topologyKey": "zone", "maxSkew": 0},
        },
        "maxSkew in body should be greater than or equal to 1",
        id="zero-skew",
    ),
    pytest.param(
        "PartitionSet",
        {"partitions": 4, "selector": SELECTOR, "metrics": {"scrape": {"port": 70000}}},
        "must be a port number from 1 to 65535",
        id="bad-port",
    ),
    pytest.param(
        "GrainType",
        {
            "selector": SELECTOR,
            "strategy": {
                "name": "ResourceOptimized",
                "resourceOptimized": {
                    "cpuUsage": 0,
                    "memoryUsage": 0,
                    "availableMemory": 0,
                    "maxAvailableMemory": 0,
                    "activationCount": 0,
                },
            },
        },
        "at least one ResourceOptimized weight must be above 0",
        id="zero-weights",
    ),
    pytest.param(
        "GrainType",
        {
            "selector": SELECTOR,
            "strategy": {
                "name": "ActivationCountBased",
                "activationCountBased": {"chooseOutOf": 1},
            },
        },
        "chooseOutOf in body should be greater than or equal to 2",
        id="choose-one",
    ),
    pytest.param(
        "GrainType",
        {"selector": SELECTOR, "strategy": {"name": "Custom"}},
        "strategy Custom needs strategy.custom.entryPoint",
        id="custom-without-entry",
    ),
    pytest.param(
        "GrainType",
        {"selector": SELECTOR, "strategy": {"name": "Nearest"}},
        'Unsupported value: "Nearest"',
        id="unknown-strategy",
    ),
    pytest.param(
        "GrainType",
        {"selector": SELECTOR, "filters": [{"type": "RequiredMatch", "keys": []}]},
        "keys in body should have at least 1 items",
        id="filter-without-keys",
    ),
]


@pytest.mark.parametrize(("kind", "spec", "message"), INVALID)
def test_invalid_specs_are_rejected_with_a_clear_message(
    dev_cluster, crds, namespace, kind: str, spec: dict, message: str
) -> None:
    result = apply(dev_cluster, namespace, kind, "bad", spec, check=False)
    assert result.returncode != 0, f"accepted: {spec}"
    assert message in result.stderr
    missing = dev_cluster.kubectl("get", "-n", namespace, kind.lower(), "bad", check=False)
    assert missing.returncode != 0, "nothing was stored"


@pytest.mark.parametrize(
    ("scheme", "field", "value", "message"),
    [
        ("netherite", "partitions", 64, "partitions can only change with keyScheme apportion"),
        ("akka", "partitions", 16, "partitions can only change with keyScheme apportion"),
        ("apportion", "partitions", 48, "may only be multiplied (split) or divided (merge)"),
        ("netherite", "keyScheme", "akka", "keyScheme is immutable"),
    ],
)
def test_key_mapping_fields_are_immutable(
    dev_cluster, crds, namespace, scheme: str, field: str, value: Any, message: str
) -> None:
    apply(
        dev_cluster,
        namespace,
        "PartitionSet",
        "fixed",
        {"partitions": 32, "keyScheme": scheme, "selector": SELECTOR},
    )
    result = dev_cluster.kubectl(
        "patch",
        "-n",
        namespace,
        "partitionset",
        "fixed",
        "--type=merge",
        "-p",
        json.dumps({"spec": {field: value}}),
        check=False,
    )
    assert result.returncode != 0
    assert message in result.stderr
    assert get(dev_cluster, namespace, "partitionset/fixed")["spec"]["partitions"] == 32


def test_apportion_sets_split_and_merge_by_integer_factors(dev_cluster, crds, namespace) -> None:
    spec = {"partitions": 32, "keyScheme": "apportion", "selector": SELECTOR}
    apply(dev_cluster, namespace, "PartitionSet", "elastic", spec)
    for count in (128, 64, 16, 32):
        dev_cluster.kubectl(
            "patch",
            "-n",
            namespace,
            "partitionset",
            "elastic",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"partitions": count}}),
        )
        assert get(dev_cluster, namespace, "partitionset/elastic")["spec"]["partitions"] == count
    # A count of 0 is refused by the schema's minimum alone: the merge rule guards its modulus.
    refused = dev_cluster.kubectl(
        "patch",
        "-n",
        namespace,
        "partitionset",
        "elastic",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"partitions": 0}}),
        check=False,
    )
    assert refused.returncode != 0
    assert "should be greater than or equal to 1" in refused.stderr
    assert "modulus by zero" not in refused.stderr, refused.stderr


def test_status_from_the_models_is_accepted_and_shown_in_columns(
    dev_cluster, crds, namespace
) -> None:
    apply(dev_cluster, namespace, "PartitionSet", "shown", {"partitions": 32, "selector": SELECTOR})
    now = condition_time(time.time())
    conditions = set_condition(
        None, type_="Ready", status=True, reason="Placed", observed_generation=1, now=now
    )
    conditions = set_condition(
        conditions, type_="Balanced", status=False, reason="Moving", observed_generation=1, now=now
    )
    status = UnitSetStatus(
        observed_generation=1,
        epoch=7,
        members=4,
        ready_members=4,
        assigned_units=32,
        assignment_config_map="shown-assignment",
        imbalance=1.0625,
        moves_in_progress=2,
        member_units=[MemberUnits(member=f"w-{i}", units=8, load=1.5) for i in range(4)],
        metrics_source="Counts",
        conditions=conditions,
    )
    dev_cluster.kubectl(
        "patch",
        "-n",
        namespace,
        "partitionset",
        "shown",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status.to_json_dict()}),
    )
    stored = get(dev_cluster, namespace, "partitionset/shown")["status"]
    assert stored["imbalance"] == "1.06"
    assert stored["memberUnits"][0] == {
        "member": "w-0",
        "units": 8,
        "load": "1.50",
    }
    assert stored["conditions"] == dump_conditions(conditions)

    table = dev_cluster.kubectl("get", "-n", namespace, "partitionset", "shown", "-o", "wide")
    header, row = table.stdout.splitlines()
    assert header.split() == [
        "NAME",
        "READY",
        "BALANCED",
        "MEMBERS",
        "UNITS",
        "IMBALANCE",
        "MOVES",
        "EPOCH",
        "AGE",
        "STRATEGY",
        "CONFIGMAP",
        "REASON",
    ]
    cells = row.split()
    assert cells[:8] == ["shown", "True", "False", "4", "32", "1.06", "2", "7"]
    assert cells[-3:] == ["Balanced", "shown-assignment", "Placed"]

    waited = dev_cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "partitionset/shown", "--timeout=10s"
    )
    assert "condition met" in waited.stdout


def test_status_cannot_be_written_through_the_main_resource(dev_cluster, crds, namespace) -> None:
    apply(dev_cluster, namespace, "ShardSet", "s", {"shards": 10, "selector": SELECTOR})
    dev_cluster.kubectl(
        "patch",
        "-n",
        namespace,
        "shardset",
        "s",
        "--type=merge",
        "-p",
        json.dumps({"status": {"epoch": 5}}),
    )
    # Only the CRD's default status (read back on every get), not the patched epoch.
    assert get(dev_cluster, namespace, "shardset/s")["status"] == {"observedGeneration": 0}


def test_kubectl_get_apportion_lists_every_kind(dev_cluster, crds, namespace) -> None:
    apply(dev_cluster, namespace, "PartitionSet", "p", {"partitions": 2, "selector": SELECTOR})
    apply(dev_cluster, namespace, "ShardSet", "s", {"shards": 2, "selector": SELECTOR})
    apply(dev_cluster, namespace, "GrainType", "g", {"selector": SELECTOR})
    names = dev_cluster.kubectl("get", "apportion", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(names) == [
        "graintype.apportion.dev/g",
        "partitionset.apportion.dev/p",
        "shardset.apportion.dev/s",
    ]
    short = dev_cluster.kubectl("get", "pset,sset,gtype", "-n", namespace, "-o", "name")
    assert sorted(short.stdout.split()) == sorted(names)


def test_kubectl_explain_shows_field_descriptions(dev_cluster, crds) -> None:
    explained = dev_cluster.kubectl("explain", "partitionset.spec.rebalance.handoffTimeout").stdout
    assert "acknowledge a hand-off" in explained
    explained = dev_cluster.kubectl("explain", "graintype.spec.strategy").stdout
    assert "resourceOptimized" in explained
    assert "ResourceOptimized (default)" in explained
