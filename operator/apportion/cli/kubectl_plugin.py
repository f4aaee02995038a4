"""`kubectl apportion`: the kubectl plugin (the `kubectl-apportion` executable the package
installs). It reads the cluster of the current kubeconfig (KUBECONFIG, as kubectl does) and
never writes, except `drain` / `uncordon`, which set or remove one annotation on a Pod.

    kubectl apportion locate SET KEY...   unit of each key and the pod serving it now
    kubectl apportion top SET             units, load and share per pod
    kubectl apportion plan SET            what the operator's next pass would move, and why
    kubectl apportion explain grain TYPE ID   the member a new activation would go to now, and why
    kubectl apportion history SET         the set's epochs and hand-offs, from its Events
    kubectl apportion drain POD           move every unit off POD through hand-offs
    kubectl apportion uncordon POD        let POD take units again

SET is NAME, pset/NAME or sset/NAME (NAME alone: the PartitionSet or ShardSet of that name).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ConfigError
from lightkube.resources.apps_v1 import Deployment, StatefulSet
from lightkube.resources.core_v1 import Pod
from lightkube.resources.events_v1 import Event
from lightkube.types import PatchType

from apportion import API_VERSION
from apportion.api import PartitionSet, ShardSet
from apportion.api.assignment import AssignmentTable, ResourceRef, assignment_config_map
from apportion.api.common import LabelSelector
from apportion.api.pods import DRAIN_ANNOTATION, WorkerPod
from apportion.cli.explain import add_grain_arguments, explain_grain_command
from apportion.publishing.configmaps import AssignmentStore
from apportion.publishing.status import SET_RESOURCES

KINDS = {
    "pset": "PartitionSet",
    "psets": "PartitionSet",
    "partitionset": "PartitionSet",
    "partitionsets": "PartitionSet",
    "sset": "ShardSet",
    "ssets": "ShardSet",
    "shardset": "ShardSet",
    "shardsets": "ShardSet",
}
SET_KINDS: dict[str, type[PartitionSet] | type[ShardSet]] = {
    "PartitionSet": PartitionSet,
    "ShardSet": ShardSet,
}


class PluginError(Exception):
    """Something the user must fix (no such set, no table yet); printed without a traceback."""


@dataclass(frozen=True)
class LiveSet:
    """A set as it is in the cluster now: the object, its typed spec and its published table."""

    kind: str
    body: Mapping[str, Any]
    model: PartitionSet | ShardSet
    table: AssignmentTable

    @property
    def status(self) -> Mapping[str, Any]:
        return self.body.get("status") or {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = asyncio.run(args.func(args))
        return status
    except (PluginError, ConfigError, httpx2.HTTPError) as error:
        # No kubeconfig, no API server, no CRDs: a sentence, not a traceback.
        print(f"kubectl apportion: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl apportion",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--namespace", "-n", help="namespace (default: the kubeconfig's)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    locate = commands.add_parser("locate", help="unit and pod of each key")
    locate.add_argument("set", metavar="SET")
    locate.add_argument("keys", nargs="+", metavar="KEY")
    locate.set_defaults(func=run_locate)
    for name, func, text in (
        ("top", run_top, "units, load and share per pod"),
        ("plan", run_plan, "what the next pass would move (nothing is written)"),
        ("history", run_history, "epochs and hand-offs from the set's Events"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("set", metavar="SET")
        command.set_defaults(func=func)
    explain = commands.add_parser("explain", help="explain a placement decision")
    what = explain.add_subparsers(dest="what", required=True, metavar="WHAT")
    grain = what.add_parser(
        "grain",
        help="the member a new activation of grain ID of TYPE would go to now, and why",
    )
    add_grain_arguments(grain)
    grain.set_defaults(func=explain_grain_command)
    for name, func, text in (
        ("drain", run_drain, "move every unit off POD through normal hand-offs"),
        ("uncordon", run_uncordon, "let POD take units again"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("pod", metavar="POD")
        command.set_defaults(func=func)
    return parser


# ------------------------------------------------------------------------------ reading


def client_for(args: argparse.Namespace) -> AsyncClient:
    config = KubeConfig.from_env()
    context = config.get()
    namespace = args.namespace or (context.namespace if context else None) or "default"
    args.namespace = namespace
    return AsyncClient(config, namespace=namespace)


async def load_set(client: AsyncClient, namespace: str, spec: str) -> LiveSet:
    """The set named by `spec` (NAME, pset/NAME, sset/NAME) with its published table."""
    kind_word, _, name = spec.rpartition("/")
    resource = kind_word.lower().split(".")[0]  # pset, partitionsets.apportion.dev, ...
    if kind_word and resource not in KINDS:
        raise PluginError(f"{spec}: SET is NAME, pset/NAME or sset/NAME")
    kinds = [KINDS[resource]] if kind_word else list(SET_KINDS)
    found = []
    for kind in kinds:
        try:
            obj = await client.get(SET_RESOURCES[kind], name, namespace=namespace)
        except ApiError as error:
            if error.status.code == 404:
                continue
            raise
        except httpx2.HTTPStatusError as error:
            if error.response.status_code == 404:  # a bare 404: the kind is not served at all
                raise PluginError(
                    f"the cluster does not serve {API_VERSION} {kind}: "
                    "are apportion's CRDs installed?"
                ) from error
            raise
        # lightkube's generic resources leave to_dict unannotated
        found.append((kind, obj.to_dict()))  # type: ignore[no-untyped-call]
    if not found:
        raise PluginError(f"no PartitionSet or ShardSet {name!r} in namespace {namespace}")
    if len(found) > 1:
        raise PluginError(
            f"both a PartitionSet and a ShardSet are named {name!r}: say pset/ or sset/"
        )
    kind, body = found[0]
    model = SET_KINDS[kind].from_raw(body)
    meta = body["metadata"]
    ref = ResourceRef(kind, namespace, name, meta["uid"])
    loaded = await AssignmentStore(client, ref, assignment_config_map(kind, name)).load()
    if loaded.table is None:
        raise PluginError(
            f"{kind} {name} has no published table yet"
            + (f": {loaded.unreadable}" if loaded.unreadable else "")
        )
    return LiveSet(kind, body, model, loaded.table)


# ----------------------------------------------------------------------------- commands


async def run_locate(args: argparse.Namespace) -> int:
    from apportion.cli.locate import located_lines
    from apportion.engine.locate import locate

    client = client_for(args)
    try:
        live = await load_set(client, args.namespace, args.set)
    finally:
        await client.close()
    sys.stdout.writelines(located_lines(locate(args.keys, table=live.table), live.table))
    return 0


async def run_top(args: argparse.Namespace) -> int:
    client = client_for(args)
    try:
        live = await load_set(client, args.namespace, args.set)
    finally:
        await client.close()
    loads = {
        row["member"]: float(row["load"])
        for row in live.status.get("memberUnits") or ()
        if row.get("load") is not None
    }
    held = {m: len(units) for m, units in live.table.by_member().items()}
    total_units = sum(held.values()) or 1
    total_load = sum(loads.values())
    rows = [("POD", "UNITS", "LOAD", "SHARE")]
    for member in sorted(held, key=lambda m: (-held[m], m)):
        load = loads.get(member)
        share = (
            load / total_load if load is not None and total_load > 0 else held[member] / total_units
        )
        rows.append(
            (member, str(held[member]), "-" if load is None else f"{load:.2f}", f"{share:.0%}")
        )
    print_rows(rows)
    return 0


async def run_plan(args: argparse.Namespace) -> int:
    from apportion.engine.set_pass import PassInput, plan_pass

    client = client_for(args)
    try:
        live = await load_set(client, args.namespace, args.set)
        spec = live.model.spec
        selectors: list[LabelSelector] = [spec.selector] if spec.selector is not None else []
        if (ref := spec.workload_ref) is not None:
            workload: StatefulSet | Deployment
            if ref.kind == "StatefulSet":
                workload = await client.get(StatefulSet, ref.name, namespace=args.namespace)
            else:
                workload = await client.get(Deployment, ref.name, namespace=args.namespace)
            selectors.append(LabelSelector.model_validate(workload.to_dict()["spec"]["selector"]))
        pods = [p.to_dict() async for p in client.list(Pod, namespace=args.namespace)]
    finally:
        await client.close()
    ack_key = ResourceRef(
        live.kind, args.namespace, live.body["metadata"]["name"], ""
    ).ack_annotation
    members = (WorkerPod.from_body(pod) for pod in pods)
    views = [
        pod.for_set(ack_key)
        for pod in members
        if not pod.terminal and all(s.matches(pod.labels) for s in selectors)
    ]
    views.sort(key=lambda v: v.name)
    result = plan_pass(
        PassInput(
            spec=spec,
            published=live.table,
            generation=int(live.body["metadata"].get("generation") or 0),
            pods=views,
            now=time.time(),
            last_round=_seconds(live.status.get("lastRebalanceTime")),
        )
    )
    name = live.body["metadata"]["name"]
    print(f"{live.kind} {name}: epoch {live.table.epoch}, {len(views)} member(s)")
    if spec.metrics.scrape is not None:
        # Workers' /metrics are often not reachable from here (the API server's pod proxy
        # refuses loopback pod IPs, as on the dev-cluster), and the operator's smoothed
        # per-unit loads live only in its memory.
        print(
            "note: this set balances by load; plan does not scrape workers and plans on unit "
            "counts, so the operator's next pass may differ"
        )
    for problem in result.problems:
        print(f"problem: {problem.reason}: {problem.message}")
    if result.decision is None:
        print("nothing would be decided: the published table stands")
        return 0
    rows = [("UNIT", "FROM", "TO")]
    rows += [(m.unit, m.source or "-", m.target) for m in result.kept]
    if len(rows) > 1:
        print(f"{len(result.kept)} move(s) next pass:")
        print_rows(rows)
    else:
        print("no move next pass")
    if result.held:
        print(f"{result.held} optional move(s) held: {result.hold_reason}")
    for event in result.decision.events:
        print(f"{event.reason.value}: {event.message()}")
    return 0


async def run_history(args: argparse.Namespace) -> int:
    client = client_for(args)
    try:
        live = await load_set(client, args.namespace, args.set)
        name = live.body["metadata"]["name"]
        selector = {"regarding.name": name, "regarding.kind": live.kind}
        events = [
            e.to_dict() async for e in client.list(Event, namespace=args.namespace, fields=selector)
        ]
    finally:
        await client.close()
    events.sort(key=lambda e: e.get("eventTime") or e["metadata"].get("creationTimestamp") or "")
    rows = [("TIME", "TYPE", "REASON", "NOTE")]
    rows += [
        (
            e.get("eventTime") or e["metadata"].get("creationTimestamp") or "",
            e.get("type") or "",
            e.get("reason") or "",
            e.get("note") or "",
        )
        for e in events
    ]
    print_rows(rows)
    return 0


async def run_drain(args: argparse.Namespace) -> int:
    return await annotate(args, "true", "draining: its units move off through hand-offs")


async def run_uncordon(args: argparse.Namespace) -> int:
    return await annotate(args, None, "uncordoned: it may take units again")


async def annotate(args: argparse.Namespace, value: str | None, what: str) -> int:
    client = client_for(args)
    try:
        await client.patch(
            Pod,
            args.pod,
            {"metadata": {"annotations": {DRAIN_ANNOTATION: value}}},
            namespace=args.namespace,
            patch_type=PatchType.MERGE,
        )
    except ApiError as error:
        raise PluginError(f"pod {args.pod}: {error.status.message}") from error
    finally:
        await client.close()
    print(f"pod/{args.pod} {what}")
    return 0


# ------------------------------------------------------------------------------ output


def print_rows(rows: Sequence[Sequence[str]]) -> None:
    """Columns as kubectl prints them: left-aligned, three spaces apart, the last unpadded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("   ".join([*cells, row[-1]]))


def _seconds(timestamp: str | None) -> float | None:
    from datetime import datetime

    if not timestamp:
        return None
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
