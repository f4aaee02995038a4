"""The typed wrapper around a whole apportion object (apiVersion, kind, metadata, spec, status),
the per-kind CRD metadata `apportion.api.crdgen` reads, and parsing from raw API dicts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from apportion import API_VERSION, GROUP, VERSION
from apportion.api.common import ApiModel


@dataclass(frozen=True)
class PrinterColumn:
    """One `additionalPrinterColumns` entry; priority 1 shows only with `-o wide`."""

    name: str
    json_path: str
    type: Literal["string", "integer", "number", "boolean", "date"] = "string"
    description: str = ""
    priority: int = 0

    def to_crd(self) -> dict[str, Any]:
        column: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            column["description"] = self.description
        if self.priority:
            column["priority"] = self.priority
        return column


def condition_column(
    type_: str, field: str = "status", *, name: str | None = None, priority: int = 0
) -> PrinterColumn:
    """A column showing one field of one condition (its status by default)."""
    return PrinterColumn(
        name or type_,
        f'.status.conditions[?(@.type=="{type_}")].{field}',
        description=f"The {field} of the {type_} condition.",
        priority=priority,
    )


AGE_COLUMN = PrinterColumn("Age", ".metadata.creationTimestamp", "date")


@dataclass(frozen=True)
class CrdInfo:
    """What a CRD says about a kind beyond its schema."""

    plural: str
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ("apportion",)
    printer_columns: tuple[PrinterColumn, ...] = ()
    scope: Literal["Namespaced", "Cluster"] = "Namespaced"


class ObjectMeta(ApiModel):
    """The parts of metav1.ObjectMeta the operator reads; the rest is kept as extra fields."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


_KINDS: dict[str, type[Resource]] = {}


class Resource(ApiModel):
    """A whole object of one apportion kind. Subclasses declare `kind`, `spec`, `status`, `crd`."""

    group: ClassVar[str] = GROUP
    version: ClassVar[str] = VERSION
    crd: ClassVar[CrdInfo]

    api_version: str = API_VERSION
    kind: str
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: BaseModel
    status: BaseModel | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _KINDS[cls.__name__] = cls

    @classmethod
    def spec_model(cls) -> type[BaseModel]:
        return cls.model_fields["spec"].annotation  # type: ignore[return-value]

    @classmethod
    def status_model(cls) -> type[BaseModel]:
        annotation = cls.model_fields["status"].annotation
        model: type[BaseModel] = next(
            a
            for a in annotation.__args__  # type: ignore[union-attr]
            if a is not type(None)
        )
        return model

    @classmethod
    def from_raw(cls, obj: Mapping[str, Any]) -> Self:
        """Parse an object as the API server returns it (kopf bodies included)."""
        return cls.model_validate(dict(obj))


def resource_kinds() -> dict[str, type[Resource]]:
    """Every apportion kind by name, once their modules are imported."""
    return dict(_KINDS)


def parse_resource(obj: Mapping[str, Any]) -> Resource:
    """Parse a raw object of any apportion kind; ValueError for anything else."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if api_version != API_VERSION or kind not in _KINDS:
        raise ValueError(f"not an apportion object: apiVersion={api_version!r} kind={kind!r}")
    return _KINDS[kind].from_raw(obj)
