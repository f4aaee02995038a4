"""The apportion-worker role grants exactly the API calls the worker libraries make (issue 21):
no verb a client never uses, none missing. The oracle is the clients' source, read here
independently of the role: every lightkube call on a resource in the Python library and every
fabric8 call chain in the Java client and its integrations, mapped to the RBAC verb the API
server checks for it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "apportion"
# The Python worker library: what runs in a worker pod. The demo's traffic generator
# (devtools/apportion_dev/worker/traffic.py) runs under its own Role
# (manifests/samples/traffic-demo.yaml), checked below.
PYTHON_LIBRARY = ["worker", "grains", "kafka", "listwatch.py"]
TRAFFIC = REPO / "devtools" / "apportion_dev" / "worker" / "traffic.py"
JAVA_SOURCES = [
    REPO / "clients" / "java",
    REPO / "integrations" / "pekko",
    REPO / "integrations" / "kafka-java",
]

# What the API server authorizes each client call as.
LIGHTKUBE_VERBS = {
    "get": {"get"},
    "list": {"list"},
    "watch": {"watch"},
    "patch": {"patch"},
    "apply": {"patch", "create"},  # server-side apply: a PATCH, authorized as create when new
    "create": {"create"},
    "replace": {"update"},
    "delete": {"delete"},
    "deletecollection": {"deletecollection"},
}
LISTWATCH_VERBS = {"ListWatch": {"list", "watch"}, "list_objects": {"list"}}
FABRIC8_VERBS = {
    "get": {"get"},
    "list": {"list"},
    "watch": {"watch"},
    "inform": {"list", "watch"},
    "patch": {"patch"},
    "edit": {"get", "patch"},
    "serverSideApply": {"patch", "create"},
    "create": {"create"},
    "update": {"update"},
    "replace": {"update"},
    "createOrReplace": {"create", "update"},
    "delete": {"delete"},
}
LIGHTKUBE_RESOURCES = {
    "Pod": ("", "pods"),
    "ConfigMap": ("", "configmaps"),
    "Lease": ("coordination.k8s.io", "leases"),
    "Secret": ("", "secrets"),
    "Event": ("", "events"),
}
FABRIC8_RESOURCES = {
    "pods": ("", "pods"),
    "configMaps": ("", "configmaps"),
    "leases": ("coordination.k8s.io", "leases"),
    "secrets": ("", "secrets"),
    "events": ("", "events"),
}
# The role's marker rule: it names no API call, it marks the principal as a worker for the
# ValidatingAdmissionPolicy (manifests/worker-policy.yaml).
MARKER = ("apportion.dev", "workers", "act")

Grant = tuple[str, str, str]


def python_calls(path: Path) -> set[Grant]:
    """(group, resource, verb) of every `<client>.<method>(<Resource or object of it>, …)`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    # `lease = Lease(...)` then `client.apply(lease)`: the object's resource from its constructor.
    built = {
        target.id: node.value.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id in LIGHTKUBE_RESOURCES
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    grants: set[Grant] = set()
    for node in ast.walk(tree):
        # `ListWatch(client, ConfigMap, …)`, `list_objects(client, ConfigMap, …)`: the
        # list-then-watch primitive (apportion.listwatch) sends the requests for its caller.
        called = getattr(node, "func", None)
        primitive = LISTWATCH_VERBS.get(
            getattr(called, "attr", None) or getattr(called, "id", None) or ""
        )
        if (
            isinstance(node, ast.Call)
            and primitive
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Name)
            and node.args[1].id in LIGHTKUBE_RESOURCES
        ):
            grants |= {(*LIGHTKUBE_RESOURCES[node.args[1].id], verb) for verb in primitive}
            continue
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LIGHTKUBE_VERBS
            and node.args
            and isinstance(node.args[0], ast.Name)
        ):
            continue
        name = node.args[0].id
        resource = LIGHTKUBE_RESOURCES.get(built.get(name, name))
        if resource is not None:
            grants |= {(*resource, verb) for verb in LIGHTKUBE_VERBS[node.func.attr]}
    return grants


def java_calls(source: str) -> set[Grant]:
    """(group, resource, verb) of every fabric8 chain `client.<resource>()…<operation>(…)`: the
    first operation named in the chain up to the statement's end."""
    grants: set[Grant] = set()
    for match in re.finditer(r"\.(\w+)\(\)", source):
        resource = FABRIC8_RESOURCES.get(match.group(1))
        if resource is None:
            continue
        chain = source[match.end() : source.index(";", match.end())]
        operations = [m for m in re.findall(r"\.(\w+)\(", chain) if m in FABRIC8_VERBS]
        assert operations, f"a {match.group(1)}() chain with no operation: {chain[:80]!r}"
        grants |= {(*resource, verb) for verb in FABRIC8_VERBS[operations[0]]}
    return grants


def library_calls() -> set[Grant]:
    paths = [
        path
        for part in PYTHON_LIBRARY
        for path in ([PACKAGE / part] if part.endswith(".py") else (PACKAGE / part).rglob("*.py"))
        if path != TRAFFIC
    ]
    grants = set().union(*(python_calls(path) for path in paths))
    for root in JAVA_SOURCES:
        for path in (root / "src" / "main").rglob("*.java"):
            grants |= java_calls(path.read_text())
    return grants


def role_grants(document: dict) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in document["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_worker_role_grants_exactly_what_the_libraries_call() -> None:
    role = yaml.safe_load((REPO / "manifests" / "worker-rbac.yaml").read_text())
    assert role_grants(role) - {MARKER} == library_calls()
    assert MARKER in role_grants(role)


def test_the_traffic_generator_role_grants_what_it_calls() -> None:
    docs = yaml.safe_load_all((REPO / "manifests" / "samples" / "traffic-demo.yaml").read_text())
    (role,) = [doc for doc in docs if doc and doc["kind"] == "Role"]
    assert python_calls(TRAFFIC) <= role_grants(role)


def test_the_oracle_sees_each_kind_of_call(tmp_path: Path) -> None:
    """The readers find calls written as the libraries write them (and so can fail)."""
    python = (
        "async def f(client):\n"
        "    lease = Lease(metadata=None)\n"
        "    await client.apply(lease, field_manager='x')\n"
        "    await client.get(Pod, 'p')\n"
        "    async for _ in client.watch(ConfigMap): pass\n"
        "    listwatch.ListWatch(client, Secret, 'ns', decode=dict)\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(python)
    assert python_calls(path) == {
        ("coordination.k8s.io", "leases", "patch"),
        ("coordination.k8s.io", "leases", "create"),
        ("", "pods", "get"),
        ("", "configmaps", "watch"),
        ("", "secrets", "list"),
        ("", "secrets", "watch"),
    }
    java = (
        "client.pods().inNamespace(ns).withName(n).patch(ctx, body);\n"
        "client.configMaps().inNamespace(ns).withName(n)\n    .inform(new Handler() { x(); });\n"
        "client.secrets().inNamespace(ns).withName(n).edit(s -> s);\n"
    )
    assert java_calls(java) == {
        ("", "pods", "patch"),
        ("", "configmaps", "list"),
        ("", "configmaps", "watch"),
        ("", "secrets", "get"),
        ("", "secrets", "patch"),
    }
