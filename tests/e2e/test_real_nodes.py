"""On several real nodes (`DevCluster.start(real_node=True, nodes=3)`): what node-level events do
to the workers' units, judged from the workers' own serving logs and what they answer.

The operator pair is pinned to the first node, which shares the machine's network with the API
server; the tests drain or lose the others, in this order: each node-loss test loses one more
further node for good. The module's cluster stops before the session's single real node starts
(tests/e2e/conftest.py orders them).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from apportion_dev.devcluster import DevCluster, KubectlError
from apportion_dev.devcluster.realnode import host
from apportion_dev.devcluster.realnode.host import GATEWAY
from apportion_dev.devcluster.realnode.node import NODE_NAME, ZONE_LABEL, NodeSpec
from tests.support.unitset import Ownership, overlaps, ownership_lines

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "apportion-system"
NODES = 4  # each node-loss test (partition, zone spread, loss) uses one further node up
WORKERS = "demo-workers"
UNITS = [str(u) for u in range(32)]
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
# On the node's filesystem, for hard links; deleted with the node.
KEPT_LOGS = host.NODE_ROOT / "kept-logs"


@pytest.fixture(scope="module")
def nodes(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    """Three real nodes in zones zone-a..c and the operator installed from its manifests, its
    pods on the first node."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        began = time.monotonic()
        cluster = DevCluster.start(real_node=True, nodes=NODES)
        print(f"\n{NODES} real nodes ready in {time.monotonic() - began:.1f}s")
    try:
        cluster.kubectl("apply", "-k", str(REPO / "manifests"))
        on_first = {"nodeSelector": {"kubernetes.io/hostname": NODE_NAME}}
        cluster.kubectl(
            "patch", "-n", SYSTEM, "statefulset/apportion-operator", "--type=merge",
            "-p", json.dumps({"spec": {"template": {"spec": on_first}}}),
        )  # fmt: skip
        cluster.kubectl(
            "rollout", "status", "-n", SYSTEM, "statefulset/apportion-operator", "--timeout=180s"
        )
        yield cluster
    finally:
        cluster.stop()


def demo(handoff_timeout: str, kind: str = "PartitionSet") -> str:
    """The PartitionSet sample (32 partitions, 4 workers) with `handoffTimeout`, its workers
    spread over the nodes by the scheduler (at most one more on any node than on another). As
    a ShardSet: the same with 32 shards spread over the zones (`topologySpread`, maxSkew 1)."""
    sample = (REPO / "manifests/samples/partitionset-demo.yaml").read_text()
    documents = [d for d in yaml.safe_load_all(sample) if d]
    for document in documents:
        if document["kind"] == "PartitionSet":
            document["kind"] = kind
            document["spec"]["rebalance"]["handoffTimeout"] = handoff_timeout
            if kind == "ShardSet":
                document["spec"]["shards"] = document["spec"].pop("partitions")
                document["spec"]["topologySpread"] = {"topologyKey": ZONE_LABEL, "maxSkew": 1}
        if document["kind"] == "StatefulSet":
            (container,) = document["spec"]["template"]["spec"]["containers"]
            container["command"][container["command"].index("--kind") + 1] = kind
            document["spec"]["template"]["spec"]["topologySpreadConstraints"] = [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    # A lost node is tainted: without Honor it would count as a place with no
                    # worker, and the replacements of its workers could go nowhere.
                    "nodeTaintsPolicy": "Honor",
                    "labelSelector": {"matchLabels": {"app": WORKERS}},
                }
            ]
    return yaml.safe_dump_all(documents)


def pods(cluster: DevCluster, namespace: str) -> list[dict[str, Any]]:
    listing = cluster.kubectl("get", "pods", "-n", namespace, "-l", f"app={WORKERS}", "-o", "json")
    return list(json.loads(listing.stdout)["items"])


def all_running_off(cluster: DevCluster, namespace: str, node: str) -> bool:
    """Every one of the 4 workers Running on a node other than `node`."""
    running = sorted(
        p["metadata"]["name"]
        for p in pods(cluster, namespace)
        if p["spec"].get("nodeName") not in (None, node) and p["status"].get("phase") == "Running"
    )
    return running == [f"{WORKERS}-{i}" for i in range(4)]


def served_once(
    cluster: DevCluster, namespace: str, away_from: str | None = None
) -> dict[str, list[str]] | None:
    """What each worker not on `away_from` serves (GET /units in its container), once together
    they serve every unit exactly once; else None."""
    served = {}
    for pod in pods(cluster, namespace):
        if pod["spec"].get("nodeName") == away_from or "deletionTimestamp" in pod["metadata"]:
            continue
        name = pod["metadata"]["name"]
        try:
            answer = cluster.kubectl(
                "exec", "-n", namespace, name, "--", "python3", "-c",
                "import urllib.request;"
                "print(urllib.request.urlopen('http://127.0.0.1:8080/units').read().decode())",
                timeout=20,
            )  # fmt: skip
        except (KubectlError, subprocess.TimeoutExpired):
            return None
        served[name] = list(json.loads(answer.stdout)["units"])
    held = sorted((u for units in served.values() for u in units), key=int)
    return served if held == UNITS else None


def balanced(cluster: DevCluster, namespace: str, members: int, kind: str = "partitionset") -> bool:
    found = json.loads(cluster.kubectl("get", kind, "demo", "-n", namespace, "-o", "json").stdout)
    status = found.get("status", {})
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    return conditions.get("Balanced") == "True" and status.get("members") == members


def node_ready(cluster: DevCluster, name: str) -> str:
    node = json.loads(cluster.kubectl("get", "node", name, "-o", "json").stdout)
    return str({c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"])


def worker_logs(namespace: str, set_name: str = "PartitionSet/demo") -> list[Ownership]:
    """Every ownership line any worker of `namespace` logged, from the container log files the
    kubelets wrote (also those of pods on a node that is gone) and those `keep_logs` kept."""
    logs = {
        "/".join(log.parts[-3].split("_")[1:]): log
        for log in host.NODE_ROOT.glob(f"**/pod-logs/{namespace}_{WORKERS}-*/worker/*.log")
    }
    logs.update(
        {f"{log.parent.name}/{log.stem}": log for log in (KEPT_LOGS / namespace).glob("*/*.log")}
    )
    lines: list[Ownership] = []
    for incarnation, log in logs.items():
        # CRI log lines: "<time> stdout F <line>"
        text = "\n".join(line.split(" ", 3)[-1] for line in log.read_text().splitlines())
        lines += ownership_lines(text, incarnation, set_name)
    return sorted(lines, key=lambda o: o.time)


def keep_logs(namespace: str) -> None:
    """Hard links to the workers' container log files as they are now: the kubelet deletes a
    pod's logs with the pod, and the link keeps what the container goes on writing to the
    file until it exits."""
    for log in host.NODE_ROOT.glob(f"**/pod-logs/{namespace}_{WORKERS}-*/worker/*.log"):
        _, pod, uid = log.parts[-3].split("_")
        kept = KEPT_LOGS / namespace / pod / f"{uid}.log"
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.hardlink_to(log)


def died(log: list[Ownership], lost: list[str], at: float) -> list[Ownership]:
    """`log` with a stop at `at` for every unit the incarnations in `lost` held then: a killed
    process serves nothing, but logs nothing either."""
    held: dict[str, Ownership] = {}
    for entry in (e for e in log if e.time <= at):
        if entry.action in ("acquire", "resume"):
            held[f"{entry.pod} {entry.unit}"] = entry
        else:
            held.pop(f"{entry.pod} {entry.unit}", None)
    stops = [
        Ownership(at, e.pod, "stop", e.unit, e.epoch, e.token)
        for e in held.values()
        if e.pod.split("/")[0] in lost
    ]
    return sorted([*log, *stops], key=lambda o: o.time)


@pytest.fixture
def spread_demo(nodes: DevCluster, wait_for: Callable[..., Any]) -> Iterator[str]:
    """The demo in a namespace of its own, Balanced over its 4 workers and every unit served."""
    namespace = f"nodes-{secrets.token_hex(3)}"
    nodes.kubectl("create", "namespace", namespace)
    try:
        nodes.kubectl("apply", "-n", namespace, "-f", "-", input=demo("20s"))
        wait_for(lambda: balanced(nodes, namespace, 4), timeout=180, message="never Balanced")
        wait_for(lambda: served_once(nodes, namespace), message="never every unit served once")
        yield namespace
    finally:
        nodes.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def ready_workers(cluster: DevCluster, namespace: str) -> int:
    return sum(
        1
        for p in pods(cluster, namespace)
        if "deletionTimestamp" not in p["metadata"]
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions", [])
        )
    )


def test_kubectl_drain_hands_every_unit_off_with_an_ack_within_the_disruption_budget(
    nodes: DevCluster, spread_demo: str, wait_for: Callable[..., Any]
) -> None:
    """`kubectl drain` of a further node running workers, with a PodDisruptionBudget of one
    unavailable worker: the evictions wait for the budget, each evicted worker hands its units
    off (acknowledged, no HandoffTimedOut), its replacement starts on another node, and no unit
    is ever served by two workers."""
    namespace = spread_demo
    placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods(nodes, namespace)}
    further = [NodeSpec(i).name for i in range(1, NODES)]
    drained = max(further, key=lambda n: list(placed.values()).count(n))
    evicted = sorted(p for p, n in placed.items() if n == drained)
    assert evicted
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": WORKERS},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": WORKERS}}},
    }
    nodes.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(budget))
    wait_for(
        lambda: (
            json.loads(nodes.kubectl("get", "pdb", WORKERS, "-n", namespace, "-o", "json").stdout)
            .get("status", {})
            .get("disruptionsAllowed")
            == 1
        ),
        message="the PodDisruptionBudget never allowed a disruption",
    )

    keep_logs(namespace)
    fewest_ready = [4]
    drain = subprocess.Popen(
        [str(nodes.bin_dir / "kubectl"), "drain", drained, "--ignore-daemonsets",
         "--delete-emptydir-data", "--timeout=240s", f"--pod-selector=app={WORKERS}"],
        env=nodes.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    began = time.time()
    try:
        while drain.poll() is None:
            fewest_ready[0] = min(fewest_ready[0], ready_workers(nodes, namespace))
            time.sleep(0.3)
        output = drain.communicate()[0]
        drain_time = time.time() - began
        assert drain.returncode == 0, output
        assert fewest_ready[0] >= 3  # the budget: never two workers unavailable at once
        wait_for(
            lambda: (
                all(p["spec"].get("nodeName") != drained for p in pods(nodes, namespace))
                and ready_workers(nodes, namespace) == 4
            ),
            timeout=120,
            message="the drained node's workers were never replaced elsewhere",
        )
        wait_for(lambda: balanced(nodes, namespace, 4), timeout=120, message="never Balanced")
        wait_for(lambda: served_once(nodes, namespace), message="never every unit served once")
        settled = time.time() - began
    finally:
        nodes.kubectl("uncordon", drained)

    events = json.loads(nodes.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    assert "HandoffTimedOut" not in {e["reason"] for e in events["items"]}
    log = worker_logs(namespace)
    assert overlaps(log) == []
    released = {o.unit for o in log if o.action == "release" and o.pod.split("/")[0] in evicted}
    assert released  # the evicted workers handed their units off before they went
    print(
        f"\ndrained {drained} ({', '.join(evicted)}): kubectl drain took {drain_time:.1f}s "
        f"(fewest ready workers during it: {fewest_ready[0]} of 4); Balanced and every unit "
        f"served once {settled:.1f}s after the drain began"
    )


def test_a_partitioned_node_s_workers_stop_before_anything_they_held_is_served_elsewhere(
    nodes: DevCluster, spread_demo: str, wait_for: Callable[..., Any]
) -> None:
    """A further node's network namespace cut off from the API server (iptables, both ways, for
    the kubelet and the pods alike) while its pods keep running: its workers stop serving when
    their serving lease runs out, before the operator gives their units to others; then the
    Node is deleted, the pod GC force-deletes its pods while their processes still run, the
    StatefulSet starts them again elsewhere, and still no unit is served by two workers."""
    namespace = spread_demo
    listed = pods(nodes, namespace)
    further = [NodeSpec(i) for i in range(1, NODES)]
    victim = next(n for n in further if any(p["spec"]["nodeName"] == n.name for p in listed))
    cut_off = {
        f"{p['metadata']['name']}/{p['metadata']['uid']}"
        for p in listed
        if p["spec"]["nodeName"] == victim.name
    }
    port = str(urlparse(nodes.server).port)
    assert victim.netns is not None
    for rule in (
        ["FORWARD", "-d", GATEWAY, "-p", "tcp", "--dport", port, "-j", "DROP"],
        ["FORWARD", "-s", GATEWAY, "-p", "tcp", "--sport", port, "-j", "DROP"],
        ["OUTPUT", "-d", GATEWAY, "-p", "tcp", "--dport", port, "-j", "DROP"],
        ["INPUT", "-s", GATEWAY, "-p", "tcp", "--sport", port, "-j", "DROP"],
    ):
        subprocess.run(host.in_netns(victim.netns, ["iptables", "-I", *rule]), check=True)
    cut = time.time()
    wait_for(
        lambda: node_ready(nodes, victim.name) != "True",
        timeout=60,
        message=f"{victim.name} never marked NotReady",
    )
    not_ready = time.time() - cut
    wait_for(
        lambda: served_once(nodes, namespace, away_from=victim.name),
        timeout=120,
        message="the cut-off workers' units were never served elsewhere",
    )
    served_elsewhere = time.time() - cut

    nodes.kubectl("delete", "node", victim.name)
    wait_for(
        lambda: all_running_off(nodes, namespace, victim.name),
        timeout=180,
        message="the deleted node's workers were never started again elsewhere",
    )
    replaced = time.time() - cut
    wait_for(lambda: balanced(nodes, namespace, 4), timeout=120, message="never Balanced again")
    wait_for(lambda: served_once(nodes, namespace), message="never every unit served once again")

    log = worker_logs(namespace)
    assert overlaps(log) == []
    stopped = [o.time for o in log if o.pod in cut_off and o.action == "suspend" and o.time > cut]
    held = {o.unit for o in log if o.pod in cut_off and o.action == "suspend" and o.time > cut}
    taken = [
        o.time for o in log if o.pod not in cut_off and o.action == "acquire" and o.unit in held
    ]
    assert stopped
    assert taken
    assert max(stopped) < min(taken)
    assert not any(o.pod in cut_off and o.action == "resume" and o.time > cut for o in log)
    print(
        f"\ncut {victim.name} off ({', '.join(sorted(cut_off))}): its workers stopped serving "
        f"{min(stopped) - cut:.1f}-{max(stopped) - cut:.1f}s after the cut, NotReady after "
        f"{not_ready:.1f}s, first unit taken over {min(taken) - cut:.1f}s, every unit served "
        f"elsewhere {served_elsewhere:.1f}s; Node deleted → workers running elsewhere "
        f"{replaced - served_elsewhere:.1f}s later"
    )


def units_per_zone(
    cluster: DevCluster, namespace: str, served: dict[str, list[str]]
) -> Counter[str]:
    zone = {
        p["metadata"]["name"]: p["metadata"]["labels"][ZONE_LABEL] for p in pods(cluster, namespace)
    }
    per_zone: Counter[str] = Counter()
    for pod, units in served.items():
        per_zone[zone[pod]] += len(units)
    return per_zone


def test_a_zone_spread_shardset_stays_within_its_skew_before_and_after_a_node_is_lost(
    nodes: DevCluster, wait_for: Callable[..., Any]
) -> None:
    """A Balanced ShardSet with `topologySpread` on `topology.kubernetes.io/zone` (which the API
    server copies from the node to each pod it binds) over workers the scheduler spread over
    three nodes in three zones: the shards each zone's workers serve differ by at most maxSkew,
    and again over the two zones left once a node is lost; nothing is served twice."""
    namespace = f"zones-{secrets.token_hex(3)}"
    nodes.kubectl("create", "namespace", namespace)
    try:
        nodes.kubectl("apply", "-n", namespace, "-f", "-", input=demo("20s", "ShardSet"))
        wait_for(
            lambda: balanced(nodes, namespace, 4, "shardset"), timeout=180, message="never Balanced"
        )
        served = wait_for(lambda: served_once(nodes, namespace), message="never served once")
        before = units_per_zone(nodes, namespace, served)
        assert len(before) >= 3, before
        assert max(before.values()) - min(before.values()) <= 1, before

        placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods(nodes, namespace)}
        victim_node = next(
            NodeSpec(i).name for i in range(1, NODES) if NodeSpec(i).name in placed.values()
        )
        victims = sorted(p for p, n in placed.items() if n == victim_node)
        lost = time.time()
        nodes.lose_node(victim_node)

        def spread_again() -> Counter[str] | None:
            now = served_once(nodes, namespace, away_from=victim_node)
            if now is None:
                return None
            zones = units_per_zone(nodes, namespace, now)
            within = (
                len(zones) == len(before) - 1 and max(zones.values()) - min(zones.values()) <= 1
            )
            return zones if within else None

        after = wait_for(spread_again, timeout=150, message="never spread over the zones left")
        spread = time.time() - lost
        log = died(worker_logs(namespace, "ShardSet/demo"), victims, lost)
        assert overlaps(log) == []
        print(
            f"\nshards per zone {dict(sorted(before.items()))}; lost {victim_node}: "
            f"{dict(sorted(after.items()))} {spread:.1f}s after the loss"
        )
    finally:
        nodes.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_a_lost_node_is_marked_not_ready_and_its_units_are_served_again_elsewhere(
    nodes: DevCluster, spread_demo: str, wait_for: Callable[..., Any]
) -> None:
    """A further node's machine dies (kubelet, containerd and every pod process SIGKILLed): the
    node lifecycle controller marks it NotReady, the operator hands its workers' units to the
    others (no ack can come: after handoffTimeout), nothing is served twice; once an admin
    marks the node out of service, the pod GC deletes its pods and the StatefulSet replaces them
    on the other nodes."""
    namespace = spread_demo
    placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods(nodes, namespace)}
    further = [NodeSpec(i).name for i in range(1, NODES)]
    victim_node = next(n for n in further if n in placed.values())
    victims = sorted(p for p, n in placed.items() if n == victim_node)

    lost = time.time()
    nodes.lose_node(victim_node)
    wait_for(
        lambda: node_ready(nodes, victim_node) != "True",
        timeout=60,
        message=f"{victim_node} never marked NotReady",
    )
    not_ready = time.time() - lost
    wait_for(
        lambda: served_once(nodes, namespace, away_from=victim_node),
        timeout=120,
        message="the units of the lost node's workers were never served again",
    )
    served_again = time.time() - lost
    print(
        f"\nlost {victim_node} ({', '.join(victims)}): NotReady after {not_ready:.1f}s, "
        f"every unit served again {served_again:.1f}s after the loss"
    )

    nodes.kubectl("taint", "node", victim_node, OUT_OF_SERVICE)
    wait_for(
        lambda: all_running_off(nodes, namespace, victim_node),
        timeout=120,
        message="the lost node's workers were never replaced on the other nodes",
    )
    replaced = time.time() - lost
    wait_for(lambda: balanced(nodes, namespace, 4), timeout=120, message="never Balanced again")
    wait_for(lambda: served_once(nodes, namespace), message="never every unit served once again")
    rebalanced = time.time() - lost

    log = died(worker_logs(namespace), victims, lost)
    assert overlaps(log) == []
    taken = [o.time - lost for o in log if o.action == "acquire" and o.time > lost]
    assert taken
    print(
        f"first unit taken over {min(taken):.1f}s after the loss; out-of-service taint → "
        f"replaced {replaced - served_again:.1f}s later; Balanced over 4 again and every unit "
        f"served once {rebalanced:.1f}s after the loss"
    )
