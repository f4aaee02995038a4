"""What a container would see as its environment and command line, computed the kubelet's way.

Pure functions over the Pod as a dict: `env` entries in order, each able to refer to earlier ones
as `$(NAME)` (`$$` escapes a dollar, unknown references stay as written); `envFrom` first, then
`env`; command and args expanded against the result. ConfigMap and Secret values come from a
`Sources` mapping the caller fetched beforehand (see `referenced_sources`).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

# (kind, name) → key → value, kind being "ConfigMap" or "Secret"; Secret values already decoded.
Sources = Mapping[tuple[str, str], Mapping[str, str]]


class EnvError(ValueError):
    """The container cannot start: the kubelet reports this as CreateContainerConfigError."""


_FIELD_INDEX = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_value(pod: Mapping[str, Any], field_path: str, pod_ip: str, host_ip: str) -> str:
    """A `valueFrom.fieldRef.fieldPath` (the downward API) for this pod."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if field_path in simple:
        return str(simple[field_path])
    indexed = _FIELD_INDEX.match(field_path)
    if indexed:
        return str((meta.get(indexed.group(1)) or {}).get(indexed.group(2), ""))
    raise EnvError(f"unsupported fieldRef fieldPath {field_path!r}")


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: `$$` is a literal `$`, unknown `$(X)` is left as is."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, text)


def referenced_sources(container: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The ConfigMaps and Secrets a container's env and envFrom read."""
    found: set[tuple[str, str]] = set()
    for source in container.get("envFrom") or ():
        for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            if key in source:
                found.add((kind, source[key]["name"]))
    for entry in container.get("env") or ():
        value_from = entry.get("valueFrom") or {}
        for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
            if key in value_from:
                found.add((kind, value_from[key]["name"]))
    return found


def source_data(kind: str, obj: Mapping[str, Any]) -> dict[str, str]:
    """A fetched ConfigMap's or Secret's values as strings."""
    if kind == "Secret":
        return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
    data = dict(obj.get("data") or {})
    data.update({k: base64.b64decode(v).decode() for k, v in (obj.get("binaryData") or {}).items()})
    return data


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    pod_ip: str,
    host_ip: str,
    sources: Sources,
) -> dict[str, str]:
    """The variables the container itself declares (envFrom, then env)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or ():
        prefix = source.get("prefix", "")
        for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            if key not in source:
                continue
            ref = source[key]
            data = sources.get((kind, ref["name"]))
            if data is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f'{kind.lower()} "{ref["name"]}" not found')
            env.update({prefix + k: v for k, v in data.items()})
    for entry in container.get("env") or ():
        env[entry["name"]] = _entry_value(pod, entry, env, pod_ip, host_ip, sources)
    return env


def _entry_value(
    pod: Mapping[str, Any],
    entry: Mapping[str, Any],
    env: Mapping[str, str],
    pod_ip: str,
    host_ip: str,
    sources: Sources,
) -> str:
    if "valueFrom" not in entry:
        return expand(entry.get("value", ""), env)
    value_from = entry["valueFrom"]
    if "fieldRef" in value_from:
        return field_value(pod, value_from["fieldRef"]["fieldPath"], pod_ip, host_ip)
    for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
        if key in value_from:
            ref = value_from[key]
            data = sources.get((kind, ref["name"]))
            if data is not None and ref["key"] in data:
                return data[ref["key"]]
            if ref.get("optional"):
                return ""
            what = f'{kind.lower()} "{ref["name"]}"'
            raise EnvError(
                f"{what} not found" if data is None else f'key "{ref["key"]}" not in {what}'
            )
    raise EnvError(f"env {entry['name']}: unsupported valueFrom {sorted(value_from)}")


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The container's command + args, expanded. Without a command there is no image entrypoint
    to fall back on here, so that is an error."""
    command = container.get("command") or []
    if not command:
        raise EnvError(
            f"container {container.get('name')!r} has no command: a simulated process needs one"
        )
    return [expand(part, env) for part in (*command, *(container.get("args") or ()))]


def process_env(
    base: Mapping[str, str],
    declared: Mapping[str, str],
    *,
    pod: Mapping[str, Any],
    pod_ip: str,
    kubeconfig: str | None,
    path_prefix: str,
) -> dict[str, str]:
    """The environment of the local process: the simulator's own (so the interpreter, locale and
    HOME work), then what a pod would know about itself, then what the container declares.
    In-cluster settings are dropped so clients pick KUBECONFIG (the pod's own credentials; none
    when `kubeconfig` is None, as for a pod that mounts no token), and `path_prefix` goes first
    on PATH so commands such as `apportion demo-worker` resolve to this installation."""
    env = {
        k: v
        for k, v in base.items()
        if not k.startswith("KUBERNETES_SERVICE_") and k != "KUBECONFIG"
    }
    env["PATH"] = f"{path_prefix}:{env['PATH']}" if env.get("PATH") else path_prefix
    meta = pod.get("metadata", {})
    env.update(
        POD_NAME=meta.get("name", ""),
        POD_NAMESPACE=meta.get("namespace", ""),
        POD_IP=pod_ip,
    )
    if kubeconfig is not None:
        env["KUBECONFIG"] = kubeconfig
    env.update(declared)
    return env
