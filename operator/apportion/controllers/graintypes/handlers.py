"""GrainType handlers: one publishing daemon per GrainType (`GrainTypeLoop` in the shared
`runtime.run_loop`), woken by changes of the GrainType and of the pods it selects, and an index
of which grain types each GrainType claims (for the conflict check). No change handlers: the
daemon is level-triggered and writes status itself, so kopf keeps no bookkeeping annotations on
GrainTypes."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from apportion.api import GrainType
from apportion.controllers.graintypes.loop import GrainTypeLoop
from apportion.controllers.runtime import run_loop
from apportion.controllers.wakeups import set_key

RESOURCE = (GrainType.group, GrainType.version, GrainType.crd.plural)


@kopf.index(*RESOURCE)
def apportion_graintypes(
    name: str, namespace: str, spec: kopf.Spec, **_: Any
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """namespace → (GrainType name, grain types it places)."""
    return {namespace: (name, tuple(spec.get("grainTypes") or (name,)))}


@kopf.on.event(*RESOURCE, id="wake")
async def graintype_changed(
    event: kopf.RawEvent, namespace: str, name: str, memo: Any, **_: Any
) -> None:
    key = set_key("GrainType", namespace, name)
    if event.get("type") == "DELETED":
        memo.runtime.wakeups.gone(key)
    else:
        memo.runtime.wakeups.notify(key)


# A pass in flight is cancelled after the backoff, which is safe: the table write is
# conditional and the next daemon continues from what is published.
@kopf.daemon(*RESOURCE, id="publish", cancellation_backoff=1.0, cancellation_timeout=10.0)
async def publish(
    body: kopf.Body,
    logger: logging.Logger,
    stopped: kopf.DaemonStopped,
    apportion_graintypes: kopf.Index[str, Any],
    memo: Any,
    **_: Any,
) -> None:
    indexes = {"apportion_graintypes": apportion_graintypes}
    await run_loop(memo.runtime, GrainTypeLoop(body, indexes, logger, memo.runtime), stopped)
