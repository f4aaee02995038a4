"""The worker's assignment watch against the real API server: watches the server ends are
re-opened from the last version seen (no event lost, none replayed), big tables arrive in
chunks, a ConfigMap of another set is never read."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from lightkube import AsyncClient, KubeConfig

from apportion.api.assignment import (
    AssignmentTable,
    Incarnation,
    ResourceRef,
    UnitState,
    assignment_config_map,
    encode_assignment,
)
from apportion.worker._watch import AssignmentWatch

BASE = assignment_config_map("ShardSet", "carts")


def publish(kubectl: Any, namespace: str, table: AssignmentTable, **encoding: int) -> None:
    root, *chunks = encode_assignment(table, **encoding)
    for part in (*chunks, root):
        doc = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": BASE + part.suffix},
            **part.body(),
        }
        kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


async def test_watch_reopens_from_its_version_and_reads_chunked_tables(
    dev_cluster, kubectl, namespace
) -> None:
    ref = ResourceRef("ShardSet", namespace, "carts", "set-uid")
    members = (Incarnation("a", "uid-a"), Incarnation("b", "uid-b"))

    def table(epoch: int, count: int = 8) -> AssignmentTable:
        rng = random.Random(epoch)  # owners and unit epochs that do not compress away
        units = {
            str(u): UnitState(rng.choice(members).name, rng.randint(0, epoch)) for u in range(count)
        }
        return AssignmentTable(ref, 1, "akka", count, epoch, members, units)

    client = AsyncClient(KubeConfig.from_file(dev_cluster.kubeconfig), trust_env=False)
    seen: list[AssignmentTable] = []
    changed = asyncio.Event()

    def on_table(t: AssignmentTable) -> None:
        seen.append(t)
        changed.set()

    async def epochs_reach(epoch: int) -> None:
        while not seen or seen[-1].epoch < epoch:
            changed.clear()
            await changed.wait()

    # The server ends each watch after a second: every write below lands on a re-opened one.
    watch = AssignmentWatch(client, namespace, BASE, on_table, watch_timeout=1)
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(watch.synced.wait(), 30)
        assert seen == []  # nothing published yet
        # Another set's ConfigMap in the same namespace is not ours to read.
        kubectl(
            "create",
            "configmap",
            assignment_config_map("ShardSet", "other"),
            "-n",
            namespace,
            "--from-literal=assignments.json={}",
        )
        for epoch in (1, 2, 3):
            await asyncio.to_thread(publish, kubectl, namespace, table(epoch))
            await asyncio.wait_for(epochs_reach(epoch), 30)
            await asyncio.sleep(1.5)  # past the server's timeout: the next write needs a new watch
        # A big table in gzip chunks (the operator's layout beyond one ConfigMap).
        big = {"inline_limit": 0, "chunk_limit": 1024}
        assert len(encode_assignment(table(4, 5000), **big)) > 2
        await asyncio.to_thread(publish, kubectl, namespace, table(4, 5000), **big)
        await asyncio.wait_for(epochs_reach(4), 30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
    assert [t.epoch for t in seen] == [1, 2, 3, 4]  # each once: re-opened from its version
    assert seen[-1] == table(4, 5000)
    assert watch.relists == 0
