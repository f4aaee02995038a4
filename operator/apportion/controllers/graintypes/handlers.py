"""GrainType handlers: one publishing loop per GrainType (`GrainTypeLoop` in the runtime's
shared `run_loop`) while this replica leads, woken by changes of the GrainType and of the pods it
selects. No change handlers: the loop is level-triggered and writes status itself, so kopf keeps
no bookkeeping annotations on GrainTypes."""

from __future__ import annotations

import logging
from typing import Any

from apportion.api import GrainType
from apportion.controllers.graintypes.loop import GrainTypeLoop
from apportion.controllers.runtime import Runtime, watch


def reconciler(body: dict[str, Any], runtime: Runtime) -> GrainTypeLoop:
    meta = body["metadata"]
    logger = logging.getLogger(f"apportion.GrainType.{meta['namespace']}.{meta['name']}")
    return GrainTypeLoop(body, logger, runtime)


watch(GrainType, reconciler)
