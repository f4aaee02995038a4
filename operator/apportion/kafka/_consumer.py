"""`PartitionConsumer`: a Kafka consumer whose partitions are the units a PartitionSet grants
this pod (docs/kafka.md).

Partition `p` of the topic is unit `str(p)` of the set (the set's `partitions` equals the
topic's partition count). The consumer never joins a consumer group: it `assign()`s exactly the
partitions it owns and commits offsets under `group_id` only to remember where each partition
stands.

- acquire: resume each partition at its committed offset (the beginning when none), then hand
  its records, in order, to `handle(record)`.
- release: stop handing out the partition's records (the one being handled finishes), commit the
  offset after the last record handled, stop fetching it; only then does the worker acknowledge,
  so the next owner resumes exactly where this one stopped.
- revoke (taken without a hand-off, or still held when the process ends): stop at once, commit
  nothing: the partition is not this pod's any more, and whatever it handled since the last
  commit is handled again by the next owner (at least once).
- between hand-offs, offsets are committed every `commit_interval` seconds.
- while the worker's serving lease has run out (cut off from the API server, paused), no record
  is handled and no offset committed; it resumes from the positions it had. `suspend` and
  `resume` lines mark when the consuming loop stopped (after the record in `handle`) and
  started again.

Ownership and commits are logged on the `apportion.kafka` logger, one line per partition, in the
format of the demo worker's ownership lines (docs/worker.md), plus the offsets:

    acquire unit=3 epoch=7 token=7 pod=c-0 set=PartitionSet/orders offset=120
    commit unit=3 epoch=7 token=7 pod=c-0 set=PartitionSet/orders offset=180
    release unit=3 epoch=9 token=7 pod=c-0 set=PartitionSet/orders offset=211
    stop unit=3 epoch=12 token=7 pod=c-0 set=PartitionSet/orders offset=230
    suspend unit=4 epoch=12 token=9 pod=c-0 set=PartitionSet/orders offset=310
    resume unit=4 epoch=12 token=9 pod=c-0 set=PartitionSet/orders offset=310
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from apportion.api.assignment import unit_order
from apportion.worker import Hooks, Worker

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

logger = logging.getLogger("apportion.kafka")

RecordHandler = Callable[["ConsumerRecord[bytes, bytes]"], Awaitable[None]]
"""`async def handle(record)`: process one record; the next record of its partition waits."""

POLL_MS: Final = 200
MAX_RECORDS: Final = 500


@dataclass
class _Change:
    """A change of the partitions consumed, applied by the consuming loop between records."""

    acquire: frozenset[int] = frozenset()
    release: frozenset[int] = frozenset()
    commit: bool = True
    final: dict[int, int] = field(default_factory=dict)
    """Per partition stopped: its committed offset (release), where it stopped (revoke)."""
    uncommitted: set[int] = field(default_factory=set)
    """Released partitions whose commit the lease refused: they end as a revoke does."""
    note: str | None = None
    """Only a line to log (suspend, resume) for `acquire`'s partitions still consumed, where
    they stand: no change of the partitions."""
    epoch: int = 0
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class ConsumerListener:
    """Told of every ownership change and commit of a `PartitionConsumer`, as the Java consumer's
    `Listener` is: override what you need (per-partition state to load on acquire, to drop on
    release). Called on the consuming loop, between records; an exception is logged, never
    stops the consumer."""

    def ownership(
        self, action: str, partition: int, epoch: int, token: int | None, offset: int | None
    ) -> None:
        """`action`: acquire, release, stop (revoked, or a release seen after its own lease ran
        out: nothing committed), suspend or resume (the serving lease ran out, held again);
        `offset`: where it starts (acquire, resume), its committed offset (release), where it
        stopped (stop, suspend); None when unknown."""

    def committed(self, partition: int, epoch: int, token: int | None, offset: int) -> None:
        """An offset committed, between hand-offs or on a release."""


class PartitionConsumer:
    """Consumes the partitions of `topic` that PartitionSet `set_name` grants this pod.

        async with PartitionConsumer("orders", handle, set_name="orders",
                                     bootstrap_servers="kafka:9092", group_id="orders") as c:
            await c.worker.wait_drained()    # SIGTERM: partitions hand over, then this returns

    `handle(record)` is awaited for each record, one at a time. `consumer_options` go to
    `aiokafka.AIOKafkaConsumer` (security, fetch sizes); `worker_options` to
    `apportion.worker.Worker` (namespace, pod_name, options, client; `hooks` with on_suspend and
    on_resume to be told too). `listener` is told of
    every acquire, release, stop, suspend, resume and commit (`ConsumerListener`).
    """

    def __init__(
        self,
        topic: str,
        handle: RecordHandler,
        *,
        set_name: str,
        bootstrap_servers: str,
        group_id: str,
        commit_interval: float = 1.0,
        consumer_options: Mapping[str, Any] | None = None,
        worker_options: Mapping[str, Any] | None = None,
        listener: ConsumerListener | None = None,
    ) -> None:
        self.topic = topic
        self.listener = listener or ConsumerListener()
        self.handle = handle
        self.group_id = group_id
        self.commit_interval = commit_interval
        self._bootstrap = bootstrap_servers
        self._consumer_options = dict(consumer_options or {})
        options = dict(worker_options or {})
        # The application's own hooks: only suspend and resume mean anything beside ours.
        extra: Hooks = options.pop("hooks", None) or Hooks()
        self._also_on_suspend = extra.on_suspend
        self._also_on_resume = extra.on_resume
        hooks = Hooks(
            on_acquire=self._on_acquire,
            on_release=self._on_release,
            on_revoke=self._on_revoke,
            on_suspend=self._on_suspend,
            on_resume=self._on_resume,
        )
        self.worker = Worker("PartitionSet", set_name, hooks, **options)
        self.positions: dict[int, int] = {}
        """Next offset to handle, per partition consumed."""
        self.committed: dict[int, int] = {}
        """Offset last committed by this process, per partition consumed."""
        self._consumer: AIOKafkaConsumer | None = None
        self._changes: asyncio.Queue[_Change] = asyncio.Queue()
        self._loop_task: asyncio.Task[None] | None = None
        self._tokens: dict[int, int | None] = {}

    async def __aenter__(self) -> PartitionConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer

        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=self.group_id,
            enable_auto_commit=False,
            **self._consumer_options,
        )
        await self._consumer.start()
        self._loop_task = asyncio.create_task(self._consume(), name="kafka/consume")
        self._loop_task.add_done_callback(_log_failure)
        try:
            await self.worker.start()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop the worker (partitions still held are revoked), then the Kafka consumer."""
        await self.worker.close()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    # ------------------------------------------------------------------ worker callbacks

    async def _on_acquire(self, units: frozenset[str], epoch: int) -> None:
        for unit in units:
            self._tokens[int(unit)] = self.worker.token(unit)
        await self._apply(_Change(acquire=_partitions(units)), epoch)

    async def _on_release(self, units: frozenset[str], epoch: int) -> None:
        await self._apply(_Change(release=_partitions(units)), epoch)

    async def _on_revoke(self, units: frozenset[str], epoch: int) -> None:
        await self._apply(_Change(release=_partitions(units), commit=False), epoch)

    async def _on_suspend(self, units: frozenset[str], epoch: int) -> None:
        # Logged by the consuming loop, between records: a record in `handle` when the lease ran
        # out finishes before the line, so nothing of these partitions is handled after it.
        # Not awaited: the worker's lease task calls this and must not wait on `handle`.
        self._note("suspend", units, epoch)
        if self._also_on_suspend is not None:
            await self._also_on_suspend(units, epoch)

    async def _on_resume(self, units: frozenset[str], epoch: int) -> None:
        self._note("resume", units, epoch)
        if self._also_on_resume is not None:
            await self._also_on_resume(units, epoch)

    def _note(self, action: str, units: frozenset[str], epoch: int) -> None:
        if self._loop_task is not None and not self._loop_task.done():
            self._changes.put_nowait(_Change(acquire=_partitions(units), note=action, epoch=epoch))

    async def _apply(self, change: _Change, epoch: int) -> None:
        if self._loop_task is None or self._loop_task.done():
            raise RuntimeError("the consuming loop is not running")
        self._changes.put_nowait(change)
        try:
            await change.done
        finally:  # released partitions have stopped even when their commit failed
            for partition in sorted(change.release):
                committed = change.commit and partition not in change.uncommitted
                action = "release" if committed else "stop"
                self._log(action, partition, epoch, change.final.get(partition))
                self._tokens.pop(partition, None)
        for partition in sorted(change.acquire):
            self._log("acquire", partition, epoch, self.positions.get(partition))

    def _log(self, action: str, partition: int, epoch: int, offset: int | None) -> None:
        w = self.worker
        logger.info(
            "%s unit=%d epoch=%d token=%s pod=%s set=PartitionSet/%s offset=%s",
            action,
            partition,
            epoch,
            self._tokens.get(partition, "-"),
            w.pod_name,
            w.set_name,
            "-" if offset is None else offset,
        )
        self._tell(
            self.listener.ownership, action, partition, epoch, self._tokens.get(partition), offset
        )

    @staticmethod
    def _tell(callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            logger.exception("The consumer's listener failed; consuming goes on")

    # -------------------------------------------------------------------- consuming loop

    async def _consume(self) -> None:
        """The only task that touches the Kafka consumer: applies changes between records,
        fetches, hands records to `handle`, commits."""
        assert self._consumer is not None
        loop = asyncio.get_running_loop()
        next_commit = loop.time() + self.commit_interval
        fenced = False
        while True:
            if not self.positions and self._changes.empty():
                await self._run(await self._changes.get())
            while not self._changes.empty():
                await self._run(self._changes.get_nowait())
            if not self.worker.serving:
                # The serving lease ran out (docs/handoff.md): no record handled, no offset
                # committed until the worker confirms the table again.
                fenced = True
                await asyncio.sleep(POLL_MS / 1000)
                continue
            if fenced:
                fenced = False
                self._seek_all()  # what was fetched before the lease ran out is read again
            if self.positions:
                batch = await self._consumer.getmany(timeout_ms=POLL_MS, max_records=MAX_RECORDS)
                if not await self._handle_batch(batch):
                    # A change is waiting: records fetched past the last one handled are
                    # dropped; re-seeking makes the fetcher read them again.
                    self._seek_all()
            if loop.time() >= next_commit:
                try:
                    await self._commit(set(self.positions))
                except Exception as error:  # the next interval, or the release, tries again
                    logger.warning("committing offsets failed: %s", error)
                next_commit = loop.time() + self.commit_interval

    async def _handle_batch(self, batch: Mapping[TopicPartition, list[Any]]) -> bool:
        """Hand the records over in order; False when stopped early for a waiting change."""
        for tp, records in batch.items():
            for record in records:
                if not self._changes.empty() or not self._serving(tp.partition):
                    return False
                if self.positions.get(tp.partition) != record.offset:
                    break  # fetched for a position since replaced by a seek
                await self.handle(record)
                self.positions[tp.partition] = record.offset + 1
        return True

    async def _run(self, change: _Change) -> None:
        if change.note is not None:
            for partition in sorted(change.acquire & set(self.positions)):
                self._log(change.note, partition, change.epoch, self.positions[partition])
            change.done.set_result(None)
            return
        error: Exception | None = None
        refused: set[int] = set()
        if change.release and change.commit:
            try:
                refused = await self._commit(change.release & set(self.positions))
            except Exception as failed:  # stopped all the same: the next owner resumes earlier
                error = failed
        for partition in change.release:
            position = self.positions.pop(partition, None)
            committed = self.committed.pop(partition, None)
            # A release seen after its lease ran out (cut off, paused) commits nothing: its
            # partition is, or is about to be, someone else's, as a revoked one is.
            if change.commit and partition in refused:
                change.uncommitted.add(partition)
            stopped = not change.commit or partition in refused
            final = position if stopped else committed
            if final is not None:
                change.final[partition] = final
        try:
            fresh = change.acquire - set(self.positions)
            await self._assign(set(self.positions) | fresh)
            for partition, offset in (await self._resume_offsets(fresh)).items():
                self.positions[partition] = offset
                self.committed[partition] = offset
            self._seek_all()
        except Exception as failed:
            error = error or failed
        if error is not None:
            change.done.set_exception(error)
        else:
            change.done.set_result(None)

    def _serving(self, partition: int) -> bool:
        """Held and within the serving lease (a releasing partition: within its own deadline),
        and still this pod's under the token held in the newest table."""
        unit = str(partition)
        token = self.worker.token(unit)
        if token is None or not self.worker.lease_holds(unit):
            return False
        # A release's own deadline is forgotten once a newer table gives the partition away
        # (hand-off timed out), and lease_holds then says what the whole lease says: a release
        # seen late, after a fresh confirmation, would commit over the new owner's offsets.
        table = self.worker.table
        state = None if table is None else table.units.get(unit)
        return state is not None and state.owner == self.worker.pod_name and state.epoch == token

    async def _assign(self, partitions: set[int]) -> None:
        from aiokafka import TopicPartition

        assert self._consumer is not None
        # aiokafka's assign() replaces the whole assignment (positions included); the loop
        # seeks every partition back to where it stands right after.
        self._consumer.assign([TopicPartition(self.topic, p) for p in sorted(partitions)])

    def _seek_all(self) -> None:
        from aiokafka import TopicPartition

        assert self._consumer is not None
        for partition, offset in self.positions.items():
            self._consumer.seek(TopicPartition(self.topic, partition), offset)

    async def _resume_offsets(self, partitions: AbstractSet[int]) -> dict[int, int]:
        """The committed offset of each partition, its beginning when it has none."""
        from aiokafka import TopicPartition

        assert self._consumer is not None
        tps = {p: TopicPartition(self.topic, p) for p in partitions}
        offsets = {p: await self._consumer.committed(tp) for p, tp in tps.items()}
        missing = [tps[p] for p, offset in offsets.items() if offset is None]
        if missing:
            beginnings = await self._consumer.beginning_offsets(missing)
            offsets.update({tp.partition: beginnings[tp] for tp in missing})
        return {p: int(o) for p, o in offsets.items() if o is not None}

    async def _commit(self, partitions: AbstractSet[int]) -> set[int]:
        """Commits what was handled of `partitions`; returns those the lease refused."""
        from aiokafka import TopicPartition

        assert self._consumer is not None
        refused = {p for p in partitions if not self._serving(p)}
        due = {
            p: self.positions[p]
            for p in partitions - refused
            if self.positions[p] != self.committed.get(p)
        }
        if not due:
            return refused
        # The unit's fencing token rides along as commit metadata: who wrote an offset, when.
        await self._consumer.commit(
            {
                TopicPartition(self.topic, p): (offset, f"apportion token={self._tokens.get(p)}")
                for p, offset in due.items()
            }
        )
        for partition, offset in due.items():
            self.committed[partition] = offset
            self._log_commit(partition, offset)
        return refused

    def _log_commit(self, partition: int, offset: int) -> None:
        w = self.worker
        logger.info(
            "commit unit=%d epoch=%d token=%s pod=%s set=PartitionSet/%s offset=%d",
            partition,
            w.epoch,
            self._tokens.get(partition, "-"),
            w.pod_name,
            w.set_name,
            offset,
        )
        self._tell(self.listener.committed, partition, w.epoch, self._tokens.get(partition), offset)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        # Acquisitions fail from now on (the worker retries them); say why once.
        logger.error("the consuming loop failed", exc_info=task.exception())


def _partitions(units: frozenset[str]) -> frozenset[int]:
    return frozenset(int(u) for u in unit_order(units))
