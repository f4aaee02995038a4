"""Caches of the pods and workloads some set selects, the way controller-runtime bounds its
informers: a watch streams every object of a kind in the operator's scope, but only the facts of
objects a set wants are kept, and an event wakes only the sets that want the object (before or
after the change). The operator's memory grows with the pods it manages, not with the cluster.

A set declares what it wants with `want` (label selectors, and names: the owners of its
published units, which must stay visible after their labels stop matching, so that they hand
their units off instead of losing them unfenced). A new or widened want is filled by a LIST
filtered by the API server (the selector as a `labelSelector`, a `metadata.name` field selector
per owner name), never by a re-list of everything. Each scope is followed by the list-then-watch
primitive (`apportion.listwatch.ListWatch`): a dropped watch resumes from the last version seen,
and a 410 Gone is followed by a full, paged re-list that replaces what is kept — pods deleted
while nobody watched never linger, and the sets that wanted them wake.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.generic_resource import GenericNamespacedResource, create_api_info
from lightkube.operators import Operator, exists, in_, not_exists, not_in

from apportion.api.common import LabelSelector, LabelSelectorRequirement, SelectorOperator
from apportion.controllers import telemetry
from apportion.listwatch import EventType, ListWatch, list_objects

F = TypeVar("F")


def watched_namespaces(scope: Sequence[str]) -> list[str | None]:
    """What to watch for the operator's `scope`: each namespace of an exact list, else every
    namespace (None), filtered by `in_scope`."""
    exact = scope and not any(ch in ns for ns in scope for ch in "*?[!")
    return list(scope) if exact else [None]


def in_scope(namespace: str, scope: Sequence[str]) -> bool:
    """Whether the operator serves `namespace` (no scope: every one; patterns allowed)."""
    return not scope or any(fnmatch.fnmatch(namespace, p) for p in scope)


@dataclass(frozen=True)
class Want:
    """What one set reads of a namespace: objects matching every selector (no selectors:
    none by label), and objects with one of `names` whatever their labels."""

    namespace: str
    selectors: tuple[LabelSelector, ...] = ()
    names: frozenset[str] = frozenset()

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if name in self.names:
            return True
        return bool(self.selectors) and all(s.matches(labels) for s in self.selectors)

    def query(self) -> dict[str, Any] | None:
        """The selectors as one lightkube label query (None: nothing to list by label). A key
        required twice keeps its first requirement: the list is then a superset, filtered
        here."""
        if not self.selectors:
            return None
        query: dict[str, Any] = {}
        for selector in self.selectors:
            for key, value in selector.match_labels.items():
                query.setdefault(key, value)
            for requirement in selector.match_expressions:
                query.setdefault(requirement.key, _operator(requirement))
        return query

    def buckets(self) -> list[tuple[str, str] | None]:
        """Where the want is filed for matching: under one label pair every selected object
        carries, else under None (checked for every object of the namespace)."""
        for selector in self.selectors:
            for pair in selector.match_labels.items():
                return [pair]
        return [None] if self.selectors else []


def _operator(requirement: LabelSelectorRequirement) -> Operator[Any]:
    match requirement.operator:
        case SelectorOperator.IN:
            return in_(requirement.values)
        case SelectorOperator.NOT_IN:
            return not_in(requirement.values)
        case SelectorOperator.EXISTS:
            return exists()
        case SelectorOperator.DOES_NOT_EXIST:
            return not_exists()


@dataclass
class _Kept(Generic[F]):
    fact: F
    name: str
    labels: Mapping[str, str]
    version: int


def _version(meta: Mapping[str, Any]) -> int:
    # etcd revisions: the API server promises only opacity, but every server we target hands
    # out increasing integers, and comparing them is what keeps a late watch event from
    # undoing a newer LIST.
    try:
        return int(meta.get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass(frozen=True)
class _Seen:
    """An object as a list or a watch delivered it; its fact is made only if a set wants it."""

    namespace: str
    uid: str
    name: str
    labels: Mapping[str, str]
    version: int
    body: Mapping[str, Any]

    @classmethod
    def decode(cls, body: dict[str, Any]) -> _Seen:
        meta = body.get("metadata") or {}
        return cls(
            meta.get("namespace", ""),
            meta.get("uid", ""),
            meta.get("name", ""),
            meta.get("labels") or {},
            _version(meta),
            body,
        )


@dataclass
class _NamespaceSelection(Generic[F]):
    kept: dict[str, _Kept[F]] = field(default_factory=dict)  # uid → fact
    wants: dict[str, Want] = field(default_factory=dict)  # loop key → want
    by_label: dict[tuple[str, str] | None, set[str]] = field(default_factory=dict)
    by_name: dict[str, set[str]] = field(default_factory=dict)
    chosen: dict[str, set[str]] = field(default_factory=dict)
    """loop key → uids of the kept objects its want matches: what one set reads costs what it
    selects, never a look at every object of the namespace."""


class SelectedCache(Mapping[str, Collection[F]], Generic[F]):
    """namespace → facts of the wanted objects of one kind (a Mapping, as kopf's indexes were).

    It reads through `client` in `scope` (the operator's namespaces, patterns allowed; none for
    every one) and calls `notify(key)` for each set whose wanted objects changed."""

    def __init__(
        self,
        plural: str,
        kind: str,
        group: str,
        fact: Callable[[Mapping[str, Any]], F],
        client: AsyncClient,
        notify: Callable[[str], None],
        scope: Sequence[str] = (),
    ) -> None:
        version = f"{group}/v1" if group else "v1"
        # A resource of our own, kept out of lightkube's registry (where `Pod` means the typed
        # model): it only names the URLs; `listwatch` decodes the JSON into `_Seen`, not a
        # model tree.
        self.resource = type(
            kind,
            (GenericNamespacedResource,),
            {"_api_info": create_api_info(group, "v1", kind, plural)},
        )
        self.what = f"{plural} ({version})"
        self.plural = plural
        self.fact = fact
        self.notify = notify
        self.client = client
        self.scope = tuple(scope)
        self._namespaces: dict[str, _NamespaceSelection[F]] = {}
        self._synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._watches: list[ListWatch[_Seen]] = []
        self._listing = 0
        self._deleted: set[str] = set()

    # ------------------------------------------------------------------------- Mapping view

    def __getitem__(self, namespace: str) -> Collection[F]:
        return [kept.fact for kept in self._namespaces[namespace].kept.values()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._namespaces)

    def __len__(self) -> int:
        return len(self._namespaces)

    def selected(self, namespace: str, key: str) -> list[F]:
        """The facts set `key` wants in `namespace`: its selection and the objects it names."""
        ns = self._namespaces.get(namespace)
        if ns is None:
            return []
        return [ns.kept[uid].fact for uid in ns.chosen.get(key, ())]

    def kept(self) -> int:
        """How many objects are kept, in every namespace."""
        return sum(len(ns.kept) for ns in self._namespaces.values())

    # ----------------------------------------------------------------------------- wanting

    def wanted_by(self, namespace: str, name: str, labels: Mapping[str, str]) -> set[str]:
        """Keys of the sets that want an object with this name and these labels."""
        ns = self._namespaces.get(namespace)
        if ns is None:
            return set()
        candidates = set(ns.by_name.get(name, ()))
        candidates.update(ns.by_label.get(None, ()))
        for pair in labels.items():
            candidates.update(ns.by_label.get(pair, ()))
        return {key for key in candidates if ns.wants[key].matches(name, labels)}

    async def want(self, key: str, want: Want) -> None:
        """Keep (and fill) what set `key` reads; returns once it is in the cache."""
        await self.start()
        ns = self._namespaces.setdefault(want.namespace, _NamespaceSelection())
        old = ns.wants.get(key)
        if old == want:
            return
        self._file(ns, key, old, want)
        new_query = old is None or old.selectors != want.selectors
        if new_query and want.query() is not None:
            await self._fill(want.namespace, labels=want.query())
        missing = want.names - {kept.name for kept in ns.kept.values()}
        if old is not None:
            missing -= old.names  # asked for already: a name not kept does not exist
        for name in sorted(missing):
            await self._fill(want.namespace, fields={"metadata.name": name})
        if old is not None and old.selectors != want.selectors:
            self._prune(ns, old)
        elif old is not None and old.names - want.names:
            self._prune(ns, Want(old.namespace, names=old.names - want.names))

    def forget(self, key: str, namespace: str) -> None:
        """Set `key` reads nothing any more (it was deleted)."""
        ns = self._namespaces.get(namespace)
        if ns is None or key not in ns.wants:
            return
        old = ns.wants[key]
        self._file(ns, key, old, None)
        self._prune(ns, old)

    def _file(
        self, ns: _NamespaceSelection[F], key: str, old: Want | None, new: Want | None
    ) -> None:
        if old is not None:
            for bucket in old.buckets():
                ns.by_label.get(bucket, set()).discard(key)
            for name in old.names:
                ns.by_name.get(name, set()).discard(key)
            del ns.wants[key]
            ns.chosen.pop(key, None)
        if new is not None:
            for bucket in new.buckets():
                ns.by_label.setdefault(bucket, set()).add(key)
            for name in new.names:
                ns.by_name.setdefault(name, set()).add(key)
            ns.wants[key] = new
            ns.chosen[key] = {
                uid for uid, kept in ns.kept.items() if new.matches(kept.name, kept.labels)
            }

    @staticmethod
    def _choose(ns: _NamespaceSelection[F], uid: str, keys: Collection[str]) -> None:
        """Object `uid` changed (or went): file it again for the sets that may want it."""
        kept = ns.kept.get(uid)
        for key in keys:
            want = ns.wants.get(key)
            if kept is not None and want is not None and want.matches(kept.name, kept.labels):
                ns.chosen.setdefault(key, set()).add(uid)
            else:
                ns.chosen.get(key, set()).discard(uid)

    def _prune(self, ns: _NamespaceSelection[F], old: Want) -> None:
        """Drop what only `old` wanted."""
        for uid, kept in list(ns.kept.items()):
            if old.matches(kept.name, kept.labels) and not self._wanted(ns, kept):
                del ns.kept[uid]

    def _wanted(self, ns: _NamespaceSelection[F], kept: _Kept[F]) -> bool:
        return any(
            ns.wants[key].matches(kept.name, kept.labels)
            for key in (
                ns.by_name.get(kept.name, set())
                | ns.by_label.get(None, set())
                | {k for pair in kept.labels.items() for k in ns.by_label.get(pair, ())}
            )
        )

    async def _fill(self, namespace: str, **selectors: Any) -> None:
        """Add what a filtered LIST finds. Deletions the watch reports meanwhile are kept
        aside, so that the LIST's older view cannot bring a deleted object back."""
        self._listing += 1
        try:
            found = await list_objects(
                self.client, self.resource, namespace, decode=_Seen.decode, **selectors
            )
        except ApiError as error:
            if error.status.code != 404:
                raise
            found = []
        finally:
            self._listing -= 1
        for seen in found:
            if seen.uid not in self._deleted:
                self._apply("ADDED", seen, notify=False)
        if not self._listing:
            self._deleted.clear()

    # ------------------------------------------------------------------------------ events

    def _apply(self, event: EventType, seen: _Seen, *, notify: bool = True) -> None:
        ns = self._namespaces.get(seen.namespace)
        if ns is None:
            return
        old = ns.kept.get(seen.uid)
        if old is not None and seen.version and seen.version < old.version:
            return  # older than what we hold
        if old is not None and seen.version == old.version and event != "DELETED":
            return  # what we hold (a relist lists everything again): nobody to wake
        woken = self.wanted_by(seen.namespace, seen.name, seen.labels)
        if old is not None:
            woken |= self.wanted_by(seen.namespace, old.name, old.labels)
        if event == "DELETED":
            if self._listing:
                self._deleted.add(seen.uid)
            ns.kept.pop(seen.uid, None)
        elif self.wanted_by(seen.namespace, seen.name, seen.labels):
            fact = self.fact(seen.body)
            ns.kept[seen.uid] = _Kept(fact, seen.name, dict(seen.labels), seen.version)
        else:
            ns.kept.pop(seen.uid, None)
        self._choose(ns, seen.uid, woken)
        if notify:
            for key in woken:
                self.notify(key)

    def _forget_versions(self, namespace: str | None) -> None:
        """The API server went back in time (etcd restored): the versions held are from a
        history that is gone, and the relist's older ones must replace them."""
        for name, ns in self._namespaces.items():
            if namespace is None or name == namespace:
                for kept in ns.kept.values():
                    kept.version = 0

    def _drop_unlisted(self, namespace: str | None, listed: set[str]) -> None:
        """After a full list of `namespace` (None: of the scope): what it did not find is gone."""
        for name, ns in self._namespaces.items():
            if namespace is not None and name != namespace:
                continue
            for uid in [uid for uid in ns.kept if uid not in listed]:
                gone = ns.kept.pop(uid)
                woken = self.wanted_by(name, gone.name, gone.labels)
                self._choose(ns, uid, woken)
                for key in woken:
                    self.notify(key)

    # ------------------------------------------------------------------------------ running

    async def start(self) -> None:
        """Start the watches (once) and wait until each has listed its scope once."""
        if not self._tasks:
            scopes = watched_namespaces(self.scope)
            self._watches = [self._follow(scope) for scope in scopes]
            self._tasks = [
                asyncio.create_task(watch.run(), name=f"watch {self.what}")
                for watch in self._watches
            ]
            await asyncio.gather(*(watch.synced.wait() for watch in self._watches))
            self._synced.set()
        await self._synced.wait()

    @property
    def relists(self) -> int:
        """Full lists after the first ones: each followed a 410 Gone."""
        return sum(watch.relists for watch in self._watches)

    def _follow(self, namespace: str | None) -> ListWatch[_Seen]:
        """The watch of one namespace of the scope (None: of every namespace, filtered here)."""

        async def replace(items: AsyncIterator[_Seen]) -> None:
            listed = set()
            async for seen in items:
                if in_scope(seen.namespace, self.scope):
                    listed.add(seen.uid)
                    self._apply("ADDED", seen)
            self._drop_unlisted(namespace, listed)

        async def changed(event: EventType, seen: _Seen) -> None:
            self._apply(event, seen)

        def restarted(reason: str) -> None:
            telemetry.WATCH_RESTARTS.labels(self.plural, reason).inc()
            if reason == "rewound":
                self._forget_versions(namespace)

        return ListWatch(
            self.client,
            self.resource,
            ALL_NS if namespace is None else namespace,  # None would mean "the default one"
            decode=_Seen.decode,
            on_list=replace,
            on_event=changed,
            on_restart=restarted,
        )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._watches = []
        self._synced = asyncio.Event()
