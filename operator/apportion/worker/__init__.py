"""The worker library: what a worker pod of a PartitionSet or ShardSet runs (docs/worker.md).

    from apportion.worker import Hooks, Worker, WorkerOptions

    async with Worker("PartitionSet", "orders", Hooks(on_acquire=start, on_release=finish),
                      options=WorkerOptions(port=8080)) as worker:
        worker.owner_of("customer-42")    # pod owning that key's unit, or None
        await worker.wait_drained()       # SIGTERM: units move away, then this returns

It watches the set's assignment ConfigMap through the API server, runs the callbacks as units
come and go, acknowledges releases on its own Pod (docs/handoff.md) and serves /metrics. Sits on
`apportion.api` and `apportion.engine` only.
"""

from apportion.worker._worker import (
    KINDS,
    Hooks,
    MergeCallback,
    SplitCallback,
    UnitsCallback,
    Worker,
    WorkerError,
    WorkerOptions,
)
from apportion.worker._worker_state import Resharding, Transition, UnitRange, WorkerState

__all__ = [
    "KINDS",
    "Hooks",
    "MergeCallback",
    "Resharding",
    "SplitCallback",
    "Transition",
    "UnitRange",
    "UnitsCallback",
    "Worker",
    "WorkerError",
    "WorkerOptions",
    "WorkerState",
]
