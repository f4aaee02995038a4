"""Status writing shared by the handler modules: observedGeneration and the Ready condition go
through `patch.status` (handler return values would land in undeclared status fields, which the
structural schema prunes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from apportion.api.conditions import ConditionType, dump_conditions, set_condition
from apportion.api.resource import Resource


def set_ready(
    body: Mapping[str, Any],
    patch: kopf.Patch,
    *,
    ready: bool,
    reason: str,
    message: str,
) -> None:
    """Patch observedGeneration and the Ready condition for the body's generation."""
    generation = body["metadata"].get("generation")
    conditions = (body.get("status") or {}).get("conditions")
    patch.status["observedGeneration"] = generation
    patch.status["conditions"] = dump_conditions(
        set_condition(
            conditions,
            type_=ConditionType.READY,
            status=ready,
            reason=reason,
            message=message,
            observed_generation=generation,
        )
    )


def parse_or_report(kind: type[Resource], body: kopf.Body, patch: kopf.Patch) -> Resource | None:
    """The typed object, or None after reporting (Ready=False + a warning Event) a spec the API
    server accepted but the models reject, e.g. after a CRD/operator version skew."""
    try:
        return kind.from_raw(body)
    except ValidationError as error:
        message = f"spec rejected by the operator: {error.errors()[0]['msg']}"
        kopf.warn(body, reason="InvalidSpec", message=message)
        set_ready(body, patch, ready=False, reason="InvalidSpec", message=message)
        return None
