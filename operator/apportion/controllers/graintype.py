"""GrainType handlers.

For now they acknowledge each generation: the spec parses, observedGeneration and Ready are
set. Placement and publishing replace the body of `reconcile`.
"""

from __future__ import annotations

from typing import Any

import kopf

from apportion.api import GrainType
from apportion.controllers.status import parse_or_report, set_ready

RESOURCE = (GrainType.group, GrainType.version, GrainType.crd.plural)


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE)
async def reconcile(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    if parse_or_report(GrainType, body, patch) is not None:
        set_ready(body, patch, ready=True, reason="Accepted", message="spec accepted")
