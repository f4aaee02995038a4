"""The assignment table of a PartitionSet or ShardSet and its ConfigMap wire format, in three
layers: `model` (the table, its units, releases and acks), `codec` (the JSON document) and
`storage` (that document in one or several ConfigMaps).

The operator is the only writer; worker pods in any language read it, so the format is specified
in docs/assignment-format.md (with a JSON Schema) and this package is its reference
implementation. Pure: ConfigMaps go in and out as plain dicts, the publishing layer does the API
calls.
"""

from apportion.api.assignment.codec import Layout, from_document, to_document
from apportion.api.assignment.model import (
    API_VERSION,
    UNOWNED,
    Ack,
    AssignmentFormatError,
    AssignmentTable,
    Incarnation,
    IncompleteAssignment,
    Lineage,
    Release,
    ResourceRef,
    Suspensions,
    UnitState,
    ack_annotation_key,
    assignment_config_map,
    unit_order,
)
from apportion.api.assignment.storage import (
    CHUNK_KEY,
    CHUNK_LIMIT,
    DATA_KEY,
    GZIP_KEY,
    INDEX_KEY,
    ConfigMapPayload,
    chunk_suffixes,
    decode_assignment,
    encode_assignment,
)

__all__ = [
    "API_VERSION",
    "CHUNK_KEY",
    "CHUNK_LIMIT",
    "DATA_KEY",
    "GZIP_KEY",
    "INDEX_KEY",
    "UNOWNED",
    "Ack",
    "AssignmentFormatError",
    "AssignmentTable",
    "ConfigMapPayload",
    "Incarnation",
    "IncompleteAssignment",
    "Layout",
    "Lineage",
    "Release",
    "ResourceRef",
    "Suspensions",
    "UnitState",
    "ack_annotation_key",
    "assignment_config_map",
    "chunk_suffixes",
    "decode_assignment",
    "encode_assignment",
    "from_document",
    "to_document",
    "unit_order",
]
