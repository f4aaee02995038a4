"""The worker library: what a worker pod of a PartitionSet or ShardSet runs (docs/worker.md).

    from apportion.worker import Worker

    async with Worker("PartitionSet", "orders", on_acquire=start, on_release=finish,
                      port=8080) as worker:
        worker.owner_of("customer-42")    # pod owning that key's unit, or None
        await worker.wait_drained()       # SIGTERM: units move away, then this returns

It watches the set's assignment ConfigMap through the API server, runs the callbacks as units
come and go, acknowledges releases on its own Pod (docs/handoff.md) and serves /metrics. Sits on
`apportion.api` and `apportion.engine` only.
"""

from apportion.worker._worker import (
    KINDS,
    MergeCallback,
    SplitCallback,
    UnitsCallback,
    Worker,
    WorkerError,
)
from apportion.worker._worker_state import Resharding, Transition, UnitRange, WorkerState

__all__ = [
    "KINDS",
    "MergeCallback",
    "Resharding",
    "SplitCallback",
    "Transition",
    "UnitRange",
    "UnitsCallback",
    "Worker",
    "WorkerError",
    "WorkerState",
]
