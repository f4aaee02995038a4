"""The pod simulator: the scheduler and kubelet this control plane does not have.

It watches every Pod. An unbound pod (default scheduler) is bound to the least-loaded fitting
simulated node through the `binding` subresource, as kube-scheduler does. A pod on a simulated
node gets a unique loopback IP and a Running/Ready status. A pod annotated
`apportion.dev/simulate: process` has its first container's command run as a local process with
the pod's environment; its exit is reported and handled by the pod's restartPolicy. On deletion
the simulator honours the grace period (SIGTERM, then SIGKILL for processes) and then finishes the
deletion with grace period 0, which is the kubelet's part of graceful deletion.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx2
import msgspec
from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node, Pod, PodBinding, Secret
from lightkube.types import OnErrorAction, OnErrorResult

from apportion_dev.devcluster.podsim import objects
from apportion_dev.devcluster.podsim.ipam import IpPool
from apportion_dev.devcluster.podsim.nodes import SimulatedNodes
from apportion_dev.devcluster.podsim.podenv import (
    EnvError,
    command_line,
    container_env,
    process_env,
    referenced_sources,
    source_data,
)
from apportion_dev.devcluster.podsim.process import LocalProcess, exit_status
from apportion_dev.devcluster.podsim.relay import (
    CUT_ANNOTATION,
    CUT_CONDITION,
    RELAY_ANNOTATION,
    ApiRelay,
)
from apportion_dev.devcluster.podsim.serviceaccount import (
    REFRESH_AT,
    TOKEN_SECONDS,
    Cluster,
    issue_token,
    mounts_token,
    write_credentials,
)

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER = "default-scheduler"
DEFAULT_GRACE_SECONDS = 30
# When the simulator itself stops (the cluster is going away), processes get at most this long.
SHUTDOWN_GRACE_SECONDS = 5.0
RESYNC_SECONDS = 30.0
MAX_BACKOFF_SECONDS = 10.0


def _retry_watch(error: Exception, count: int) -> OnErrorResult:
    log.warning("pod watch interrupted (%s); retrying", error)
    return OnErrorResult(OnErrorAction.RETRY, sleep=min(count, 5))


async def supervised(what: str, loop: Callable[[], Awaitable[None]]) -> None:
    """Runs `loop` until it returns, again after each failure (backing off to
    MAX_BACKOFF_SECONDS): an API server that restarts — connections refused, 503s, a watch cut
    — must not take the simulator down, and every process pod with it."""
    failures = 0
    while True:
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception as error:
            failures += 1
            delay = min(MAX_BACKOFF_SECONDS, 0.25 * 2**failures)
            log.warning(
                "%s failed (%s: %s); again in %.1fs", what, type(error).__name__, error, delay
            )
            await asyncio.sleep(delay)


def pod_log_path(state_dir: Path, namespace: str, name: str) -> Path:
    return state_dir / "pods" / namespace / f"{name}.log"


class PodSimulator:
    def __init__(
        self,
        client: AsyncClient,
        *,
        nodes: SimulatedNodes,
        pool: IpPool,
        state_dir: Path,
        kubeconfig: str,
        path_prefix: str,
    ) -> None:
        self.client = client
        self.nodes = nodes
        self.pool = pool
        self.state_dir = state_dir
        # Process pods reach the API server the simulator reaches, as their own ServiceAccount.
        self.cluster = Cluster.from_kubeconfig(kubeconfig)
        self.path_prefix = path_prefix
        self.workers: dict[str, PodWorker] = {}
        # Pods whose deletion we completed but that linger (finalizers): ignore until DELETED.
        self.finished: set[str] = set()
        self.http = httpx2.AsyncClient(trust_env=False, timeout=1.0)

    async def run(self) -> None:
        await supervised("node registration", self.nodes.register)
        async with asyncio.TaskGroup() as group:
            group.create_task(supervised("node heartbeat", self.nodes.heartbeat))
            group.create_task(supervised("pod watch", self._watch))
            group.create_task(supervised("pod resync", self._resync))

    async def shutdown(self) -> None:
        """Stop every local process (bounded grace); the API objects are left as they are."""
        workers = list(self.workers.values())
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*(w.task for w in workers if w.task), return_exceptions=True)
        await self.http.aclose()

    def node_load(self) -> dict[str, int]:
        load: dict[str, int] = {}
        for worker in self.workers.values():
            if worker.node:
                load[worker.node] = load.get(worker.node, 0) + 1
        return load

    async def _watch(self) -> None:
        async for event, pod in self.client.watch(Pod, namespace=ALL_NS, on_error=_retry_watch):
            self.dispatch(event, pod.to_dict())

    async def _resync(self) -> None:
        """A watch that restarts after a long gap replays what exists but not what was deleted
        meanwhile: a periodic list settles both."""
        while True:
            await asyncio.sleep(RESYNC_SECONDS)
            try:
                pods = [pod.to_dict() async for pod in self.client.list(Pod, namespace=ALL_NS)]
            except httpx2.HTTPError as error:
                log.warning("resync failed: %s", error)
                continue
            seen = set()
            for data in pods:
                seen.add(data["metadata"]["uid"])
                self.dispatch("MODIFIED", data)
            for uid in set(self.workers) - seen:
                self.dispatch("DELETED", self.workers[uid].pod)
            self.finished &= seen

    def dispatch(self, event: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if event == "DELETED":
            self.finished.discard(uid)
            if worker:
                worker.update(pod, gone=True)
            return
        if worker:
            worker.update(pod)
        elif uid not in self.finished and self._wants(pod):
            worker = PodWorker(self, pod)
            self.workers[uid] = worker
            worker.task = asyncio.create_task(worker.run(), name=f"pod {worker.key}")

    def _wants(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec", {})
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return bool(pod["metadata"].get("deletionTimestamp")) and (
                spec.get("nodeName") in self.nodes.names
            )
        if spec.get("nodeName"):
            return spec["nodeName"] in self.nodes.names
        scheduler: str = spec.get("schedulerName", DEFAULT_SCHEDULER)
        return scheduler == DEFAULT_SCHEDULER

    async def sources(
        self, namespace: str, wanted: set[tuple[str, str]]
    ) -> dict[tuple[str, str], dict[str, str]]:
        found = {}
        for kind, name in wanted:
            try:
                obj: ConfigMap | Secret
                if kind == "ConfigMap":
                    obj = await self.client.get(ConfigMap, name, namespace=namespace)
                else:
                    obj = await self.client.get(Secret, name, namespace=namespace)
            except ApiError as error:
                if error.status.code == 404:
                    continue
                raise
            found[(kind, name)] = source_data(kind, obj.to_dict())
        return found


class PodWorker:
    """Drives one pod from binding to deletion. Reacts to the latest object seen by the watch."""

    def __init__(self, sim: PodSimulator, pod: dict[str, Any]) -> None:
        self.sim = sim
        self.pod = pod
        self.uid: str = pod["metadata"]["uid"]
        self.key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self.task: asyncio.Task[None] | None = None
        self.gone = False
        self.node: str | None = None
        self.ip: str | None = None
        self.host_ip = ""
        self.start_time = ""
        self.phase = "Running"
        self.views: list[objects.ContainerView] = []
        self.process: LocalProcess | None = None
        self.process_started = ""
        self.restarts = 0
        self.retry_at: float | None = None
        self.probe_at: float | None = None
        self.token_at: float | None = None
        self.probe_failures = 0
        self.relay: ApiRelay | None = None
        self._cut_reported: asyncio.Future[None] | None = None
        self.relay_server = ""
        self._changed = asyncio.Event()
        self._cancelled = False

    # --- plumbing ---------------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        namespace: str = self.pod["metadata"]["namespace"]
        return namespace

    @property
    def name(self) -> str:
        name: str = self.pod["metadata"]["name"]
        return name

    @property
    def deleting(self) -> bool:
        return bool(self.pod["metadata"].get("deletionTimestamp"))

    @property
    def simulate_process(self) -> bool:
        annotations = self.pod["metadata"].get("annotations") or {}
        return annotations.get(objects.SIMULATE_ANNOTATION) == "process"

    @property
    def grace_seconds(self) -> float:
        meta, spec = self.pod["metadata"], self.pod.get("spec", {})
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
        return float(grace)

    def update(self, pod: dict[str, Any], gone: bool = False) -> None:
        self.pod = pod
        self.gone = self.gone or gone
        if self.relay is not None:
            annotations = pod["metadata"].get("annotations") or {}
            cut = annotations.get(CUT_ANNOTATION) == "true"
            if cut != self.relay.cut:
                self.relay.cut = cut
                self._cut_reported = asyncio.ensure_future(self._report_cut(cut))
        self._changed.set()

    def cancel(self) -> None:
        self._cancelled = True
        if self.task:
            self.task.cancel()

    async def _wait(self, timeout: float | None, *also: asyncio.Future[Any]) -> None:
        """Until the pod changes, one of `also` completes, or `timeout` seconds pass."""
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait(
                [changed, *also],
                timeout=None if timeout is None else max(timeout, 0.0),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            changed.cancel()
        self._changed.clear()

    # --- lifecycle --------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            if await self._schedule():
                if self.deleting:  # seen first while terminating (the simulator restarted)
                    self.phase = self.pod.get("status", {}).get("phase", "Running")
                    self.host_ip = self.sim.nodes.host_ip(self.node)  # type: ignore[arg-type]
                    await self._terminate()
                    return
                await self._start()
                await self._supervise()
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
        except Exception:
            log.exception("%s: simulation failed", self.key)
        finally:
            if self.process is not None:
                grace = min(self.grace_seconds, SHUTDOWN_GRACE_SECONDS)
                await asyncio.shield(self.process.stop(grace))
            if self.relay is not None:
                await asyncio.shield(self.relay.stop())
            if self.ip:
                self.sim.pool.release(self.ip)
            self.sim.workers.pop(self.uid, None)

    async def _schedule(self) -> bool:
        """Bind the pod if it is unbound; True when it runs on one of our nodes."""
        reported = ""
        while not self.pod.get("spec", {}).get("nodeName"):
            if self.gone or self.deleting:
                return False
            nodes = [n.to_dict() for n in await self._list_nodes()]
            node = objects.choose_node(self.pod, nodes, self.sim.node_load())
            if node is None:
                message = f"0/{len(nodes)} simulated nodes fit (nodeSelector, taints, cordon)"
                if message != reported:
                    await self._patch_status(
                        objects.unschedulable_status(self.pod, message, objects.now_iso())
                    )
                    reported = message
                await self._wait(1.0)
                continue
            await self._bind(node)
            self.node = node  # counts towards node load before the watch confirms the binding
            await self._wait(5.0)
        self.node = self.pod["spec"]["nodeName"]
        return self.node in self.sim.nodes.names and not self.gone

    async def _list_nodes(self) -> list[Any]:
        return [
            n async for n in self.sim.client.list(Node, labels={objects.SIM_NODE_LABEL: "true"})
        ]

    async def _bind(self, node: str) -> None:
        binding = PodBinding(
            metadata=ObjectMeta(name=self.name, namespace=self.namespace),
            target=ObjectReference(apiVersion="v1", kind="Node", name=node),
        )
        try:
            await self.sim.client.create(binding, self.name, namespace=self.namespace)
        except msgspec.ValidationError:
            pass  # bound: the server answers with a Status, which lightkube decodes as a Binding
        except ApiError as error:
            if error.status.code not in (404, 409):
                raise
            return
        log.info("%s: bound to %s", self.key, node)

    async def _start(self) -> None:
        status = self.pod.get("status", {})
        self.host_ip = self.sim.nodes.host_ip(self.node)  # type: ignore[arg-type]
        adopted = status.get("podIP")
        if adopted and self.sim.pool.owner(adopted) in (None, self.uid):
            self.ip = adopted
            self.sim.pool.reserve(self.uid, adopted)
        else:
            self.ip = self.sim.pool.allocate(self.uid)
        self.start_time = status.get("startTime") or objects.now_iso()
        if status.get("phase") in ("Succeeded", "Failed"):
            self.phase = status["phase"]
            return
        previous = {c["name"]: c for c in status.get("containerStatuses") or ()}
        self.views = [
            objects.ContainerView(
                name=c["name"],
                image=c.get("image", ""),
                state=objects.running(self.start_time),
                ready=True,
                restart_count=previous.get(c["name"], {}).get("restartCount", 0),
                container_id=f"sim://{self.uid}/{c['name']}",
            )
            for c in self.pod["spec"]["containers"]
        ]
        if self.simulate_process:
            self.restarts = self.views[0].restart_count
            await self._launch()
        await self._post_status()
        log.info("%s: running on %s with IP %s", self.key, self.node, self.ip)

    async def _supervise(self) -> None:
        while True:
            if self.gone:
                return  # force-deleted: the finally clause stops the process
            if self.deleting:
                await self._terminate()
                return
            exited = (
                [asyncio.ensure_future(self.process.wait())]
                if self.process and self.process.returncode is None
                else []
            )
            timers = [t for t in (self.retry_at, self.probe_at, self.token_at) if t is not None]
            timeout = min(timers) - time.monotonic() if timers else None
            try:
                await self._wait(timeout, *exited)
            finally:
                for future in exited:
                    future.cancel()
            now = time.monotonic()
            if self.process and self.process.returncode is not None and not self.deleting:
                await self._on_exit(self.process.returncode)
            if self.retry_at is not None and now >= self.retry_at and not self.deleting:
                self.retry_at = None
                self.restarts += 1
                await self._launch()
                await self._post_status()
            if self.probe_at is not None and now >= self.probe_at and not self.deleting:
                await self._probe()
            if self.token_at is not None and now >= self.token_at and self.process:
                await self._rotate_token()

    # --- processes --------------------------------------------------------------------------

    async def _launch(self) -> None:
        container = self.pod["spec"]["containers"][0]
        view = self.views[0]
        view.restart_count = self.restarts
        log_path = pod_log_path(self.sim.state_dir, self.namespace, self.name)
        try:
            sources = await self.sim.sources(self.namespace, referenced_sources(container))
            declared = container_env(
                self.pod, container, pod_ip=self.ip or "", host_ip=self.host_ip, sources=sources
            )
            argv = command_line(container, declared)
            kubeconfig = await self._credentials() if mounts_token(self.pod) else None
            env = process_env(
                os.environ,
                declared,
                pod=self.pod,
                pod_ip=self.ip or "",
                kubeconfig=kubeconfig,
                path_prefix=self.sim.path_prefix,
            )
        except EnvError as error:
            self._not_started("CreateContainerConfigError", str(error))
            return
        except ApiError as error:
            # The kubelet cannot mount the pod's token volume, so the container is not created.
            self._not_started(
                "ContainerCreating",
                f"MountVolume.SetUp failed for volume kube-api-access: {error.status.message}",
            )
            return
        try:
            self.process = await LocalProcess.start(
                argv, env=env, cwd=container.get("workingDir"), log=log_path
            )
        except OSError as error:
            with log_path.open("a") as handle:
                handle.write(f"apportion pod simulator: cannot run {argv[0]!r}: {error}\n")
            self.process = None
            await self._on_exit(128, started=objects.now_iso())
            return
        self.process_started = objects.now_iso()
        has_probe = bool((container.get("readinessProbe") or {}).get("httpGet"))
        view.state = objects.running(self.process_started)
        view.ready = not has_probe
        view.container_id = f"sim://{self.uid}/{container['name']}/{self.process.pid}"
        self.probe_failures = 0
        self.probe_at = (
            time.monotonic() + container["readinessProbe"].get("initialDelaySeconds", 0)
            if has_probe
            else None
        )
        log.info("%s: started %s (pid %d)", self.key, argv[0], self.process.pid)

    def _not_started(self, reason: str, message: str) -> None:
        view = self.views[0]
        view.state = objects.waiting(reason, message)
        view.ready = False
        self.retry_at = time.monotonic() + MAX_BACKOFF_SECONDS
        self.restarts -= 1  # a container that never started has not restarted
        log.warning("%s: %s", self.key, message)

    async def _credentials(self) -> str:
        """A fresh bound token for the pod's ServiceAccount, written where its kubeconfig
        points; schedules the next rotation."""
        token = await issue_token(self.sim.client, self.pod)
        here = pod_log_path(self.sim.state_dir, self.namespace, self.name).parent
        cluster = self.sim.cluster
        annotations = self.pod["metadata"].get("annotations") or {}
        if annotations.get(RELAY_ANNOTATION) == "true":
            if self.relay is None:
                self.relay = ApiRelay(cluster.server)
                self.relay.cut = annotations.get(CUT_ANNOTATION) == "true"
                self.relay_server = await self.relay.start()
            cluster = dataclasses.replace(cluster, server=self.relay_server)
        kubeconfig = write_credentials(cluster, here, self.name, self.namespace, token)
        self.token_at = time.monotonic() + TOKEN_SECONDS * REFRESH_AT
        return str(kubeconfig)

    async def _rotate_token(self) -> None:
        try:
            await self._credentials()
        except Exception as error:  # an API server away for a moment must not end the pod
            # The old token is still good for a fifth of its life: try again soon.
            self.token_at = time.monotonic() + MAX_BACKOFF_SECONDS
            log.warning("%s: token rotation failed: %s", self.key, error)

    async def _on_exit(self, code: int, started: str | None = None) -> None:
        exit_code = exit_status(code)
        view = self.views[0]
        finished = objects.now_iso()
        last = objects.terminated(exit_code, started or self.process_started, finished)
        self.process = None
        self.probe_at = None
        view.ready = False
        policy = self.pod["spec"].get("restartPolicy", "Always")
        log.info("%s: process exited with %d", self.key, exit_code)
        if policy == "Always" or (policy == "OnFailure" and exit_code != 0):
            delay = min(2.0**self.restarts, MAX_BACKOFF_SECONDS)
            view.last_state = last
            view.state = objects.waiting(
                "CrashLoopBackOff", f"back-off {delay:.0f}s restarting failed container"
            )
            self.retry_at = time.monotonic() + delay
        else:
            view.state = last
            self.phase = "Succeeded" if exit_code == 0 else "Failed"
        await self._post_status()

    async def _probe(self) -> None:
        container = self.pod["spec"]["containers"][0]
        probe = container["readinessProbe"]
        http_get = probe["httpGet"]
        port = http_get["port"]
        if isinstance(port, str) and not port.isdigit():
            named = {p.get("name"): p["containerPort"] for p in container.get("ports") or ()}
            port = named.get(port, 0)
        url = (
            f"{http_get.get('scheme', 'HTTP').lower()}://{http_get.get('host') or self.ip}:"
            f"{port}{http_get.get('path', '/')}"
        )
        try:
            response = await self.sim.http.get(url)
            ok = 200 <= response.status_code < 400
        except httpx2.HTTPError:
            ok = False
        self.probe_failures = 0 if ok else self.probe_failures + 1
        view = self.views[0]
        ready = ok or (view.ready and self.probe_failures < probe.get("failureThreshold", 3))
        self.probe_at = time.monotonic() + probe.get("periodSeconds", 10)
        if ready != view.ready:
            view.ready = ready
            await self._post_status()

    # --- deletion ---------------------------------------------------------------------------

    async def _terminate(self) -> None:
        """Graceful deletion: SIGTERM, wait for the process (or, with no process, the whole grace
        period, as a container that ignores SIGTERM would), SIGKILL, then delete for good.
        A later delete with a shorter grace period shortens the wait."""
        began = time.monotonic()
        process = self.process
        if process is not None and process.returncode is None:
            log.info("%s: deleting; SIGTERM to pid %d", self.key, process.pid)
            process.send_term()
        elif self.phase != "Running" or self.simulate_process:
            began -= self.grace_seconds  # no process left (finished, crash-looping): no wait
        while not self.gone:
            remaining = began + self.grace_seconds - time.monotonic()
            if remaining <= 0 or (process is not None and process.returncode is not None):
                break
            exited = [asyncio.ensure_future(process.wait())] if process else []
            try:
                await self._wait(remaining, *exited)
            finally:
                for future in exited:
                    future.cancel()
        if process is not None:
            code = await process.stop(0)
            self.process = None
            view = self.views[0]
            view.ready = False
            view.state = objects.terminated(
                exit_status(code), self.process_started, objects.now_iso()
            )
            await self._post_status()
        if not self.gone:
            await self._delete_now()
        self.sim.finished.add(self.uid)

    async def _delete_now(self) -> None:
        try:
            current = await self.sim.client.get(Pod, self.name, namespace=self.namespace)
            if current.metadata is not None and current.metadata.uid == self.uid:
                await self.sim.client.delete(
                    Pod, self.name, namespace=self.namespace, grace_period=0
                )
                log.info("%s: deleted after graceful termination", self.key)
        except ApiError as error:
            if error.status.code != 404:
                raise

    # --- status -----------------------------------------------------------------------------

    async def _post_status(self) -> None:
        status = objects.pod_status(
            self.pod,
            phase=self.phase,
            pod_ip=self.ip or "",
            host_ip=self.host_ip,
            start_time=self.start_time,
            containers=self.views,
            now=objects.now_iso(),
        )
        await self._patch_status(status)

    async def _report_cut(self, cut: bool) -> None:
        """The pod condition CUT_CONDITION: from when it is True, nothing the pod sends or is
        sent gets through, so a test can act on the cut knowing it holds."""
        condition = {
            "type": CUT_CONDITION,
            "status": "True" if cut else "False",
            "lastTransitionTime": objects.now_iso(),
        }
        await self._patch_status({"conditions": [condition]})

    async def _patch_status(self, status: dict[str, Any]) -> None:
        try:
            await self.sim.client.patch(
                Pod.Status, self.name, {"status": status}, namespace=self.namespace
            )
        except ApiError as error:
            if error.status.code != 404:
                log.warning("%s: status update rejected: %s", self.key, error)
        except httpx2.TransportError as error:
            log.warning("%s: status update failed: %s", self.key, error)
