"""Helpers of the Pekko end-to-end tests and benchmark (tests/e2e/test_pekko.py,
bench/bench_pekko.py): the sample Counter app's StatefulSet, entity ids covering every shard,
senders of numbered messages through the pods' /send, and the entity lines the sample logs
(docs/pekko.md). One copy, so the test's checks and the bench's figures read the same lines."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apportion.engine.locate import locate
from tests.support.unitset import get, workers

SET, SHARDS, STS = "counters", 12, "pk"
ENTITIES_PER_SHARD = 2
_http = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def entities() -> list[str]:
    """ENTITIES_PER_SHARD entity ids for every shard, found with the akka scheme, so traffic
    keeps every shard alive in Pekko's view."""
    by_shard: dict[str, list[str]] = defaultdict(list)
    n = 0
    while min((len(by_shard[str(s)]) for s in range(SHARDS)), default=0) < ENTITIES_PER_SHARD:
        name = f"counter-{n}"
        unit = str(locate([name], scheme="akka", count=SHARDS)[0].unit)
        if len(by_shard[unit]) < ENTITIES_PER_SHARD:
            by_shard[unit].append(name)
        n += 1
    return sorted(e for names in by_shard.values() for e in names)


def fetch(url: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with _http.open(url, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


class Traffic:
    """Threads sending numbered Count messages per entity through the /send of the pods
    `fronts()` names (asked again after a failure: a rolling restart replaces them), one message
    at a time per entity; every reply is kept, every retry noted."""

    def __init__(self, fronts: Callable[[], list[str]], names: list[str], threads: int = 4) -> None:
        self.fronts = fronts
        self.urls = fronts()
        self.sent: dict[str, int] = Counter()
        self.replies: list[dict[str, Any]] = []
        # (entity, seq, why, when) of every attempt that got no answer and was sent again.
        self.retried: list[tuple[str, int, str, float]] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(names[i::threads],), daemon=True)
            for i in range(threads)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def send(self, entity: str, url: str) -> dict[str, Any]:
        """Sends the entity's next message until it is answered: Pekko delivers at most once
        (a region drops messages it buffered for a shard that is handed off meanwhile), so a
        sender that must not lose one retries, as a Pekko application asks with retries."""
        self.sent[entity] += 1
        seq = self.sent[entity]
        first = time.time()
        while True:
            status, body = fetch(f"{url}/send?entity={entity}&seq={seq}")
            if status == 200:
                reply = json.loads(body)
                reply["answered"] = time.time()  # when it was back, after a restart
                reply["first_sent"] = first  # with "answered": how long the message waited
                self.replies.append(reply)
                return reply
            self.retried.append((entity, seq, f"{status} {body[:160]}", time.time()))
            # The front pod may be going (a rolling restart: its region terminated, then no
            # answer at all): ask which pods front now.
            time.sleep(0.2)
            self.urls = self.fronts() or self.urls
            url = self.urls[seq % len(self.urls)]

    def _run(self, names: list[str]) -> None:
        i = 0
        while not self._stop.is_set():
            for entity in names:
                if self._stop.is_set():
                    break
                self.send(entity, self.urls[i % len(self.urls)])
                i += 1
            time.sleep(0.05)

    def stop(self) -> None:
        """Ends the senders once their message in flight is answered."""
        self._stop.set()
        for t in self._threads:
            t.join(120)
        stuck = [t.name for t in self._threads if t.is_alive()]
        assert not stuck, (
            f"a message went unanswered for two minutes on the settled cluster: {stuck}"
        )


_LINE = re.compile(r"\b(\d+\.\d{3}) (start|msg|stop) entity=(\S+) pod=([\w-]+)(?: seq=(\d+))?")


def entity_log(dev_cluster: Any, namespace: str, pods: list[str]) -> list[tuple]:
    """(time, action, entity, pod, seq) of every entity line, in time order."""
    found = []
    for pod in pods:
        path = Path(dev_cluster.pod_log_path(namespace, pod))
        text = path.read_text(errors="replace") if path.exists() else ""
        for t, action, entity, who, seq in _LINE.findall(text):
            found.append((float(t), action, entity, who, int(seq) if seq else None))
    return sorted(found, key=lambda line: line[0])


def twice_alive(log: list[tuple]) -> list[str]:
    """Entities started on a pod while alive on another (its stop logged later)."""
    alive: dict[str, str] = {}
    found = []
    for t, action, entity, pod, _ in log:
        if action == "start":
            if entity in alive and alive[entity] != pod:
                found.append(f"{entity} started on {pod} at {t} while alive on {alive[entity]}")
            alive[entity] = pod
        elif action == "stop" and alive.get(entity) == pod:
            del alive[entity]
    return found


def counter_app(classpath: str, *, java_options: tuple[str, ...] = (), own: bool = False) -> dict:
    """The sample app's nodes: a StatefulSet of 3 process pods, each Ready once it is an Up
    member (apportion places shards only where Pekko can). `own`: placed by Pekko's own
    allocation strategy, not the ShardSet (COUNTER_ALLOCATION=pekko); `java_options` (-D
    settings) override Pekko's defaults there."""
    sts = workers(
        STS,
        3,
        command=[
            "java",
            *java_options,
            "-cp",
            classpath,
            "dev.apportion.pekko.sample.CounterApp",
            SET,
            str(SHARDS),
            STS,
        ],
        grace=30,
    )
    container = sts["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"] = {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 1}
    if own:
        container["env"] = [{"name": "COUNTER_ALLOCATION", "value": "pekko"}]
    return sts


def pod_url(kubectl: Callable[..., Any], namespace: str, pod: str) -> str:
    return f"http://{get(kubectl, namespace, 'pod', pod)['status']['podIP']}:8080"
