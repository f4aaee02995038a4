"""An assignment document in ConfigMaps: inline, gzipped, or chunked over several ConfigMaps
under an index (docs/assignment-format.md). Pure: ConfigMaps go in and out as plain dicts, the
publishing layer does the API calls."""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from apportion.api.assignment.codec import (
    from_document,
    to_document,
)
from apportion.api.assignment.model import (
    API_VERSION,
    AssignmentFormatError,
    AssignmentTable,
    IncompleteAssignment,
    _array,
    _object,
    _string,
)

INDEX_KIND: Final = "AssignmentIndex"

DATA_KEY: Final = "assignments.json"
GZIP_KEY: Final = "assignments.json.gz"
INDEX_KEY: Final = "assignments.index.json"
CHUNK_KEY: Final = "assignments.part"

# A plain table stays readable (`kubectl get cm -o yaml`) up to this many bytes of JSON.
INLINE_LIMIT: Final = 64 * 1024
# The API server caps data + binaryData (decoded) at 1 MiB per ConfigMap; keep headroom.
CHUNK_LIMIT: Final = 768 * 1024
# A reader never inflates more than this, whatever a ConfigMap claims.
MAX_DOCUMENT_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True)
class ConfigMapPayload:
    """Contents of one ConfigMap: named `<base name><suffix>`; `binary_data` values are base64,
    as in the API. The root has suffix ""; chunks have "-<epoch>-<i>"."""

    suffix: str
    data: Mapping[str, str] = field(default_factory=dict)
    binary_data: Mapping[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Bytes the API server counts against its 1 MiB ConfigMap limit."""
        return sum(len(v.encode()) for v in self.data.values()) + sum(
            len(v) * 3 // 4 - v.count("=") for v in self.binary_data.values()
        )

    @property
    def wire_size(self) -> int:
        """Bytes of data and binaryData values as they travel in JSON (base64 included)."""
        return sum(len(v.encode()) for v in self.data.values()) + sum(
            len(v) for v in self.binary_data.values()
        )

    def body(self) -> dict[str, dict[str, str]]:
        """The `data` and `binaryData` fields of the ConfigMap (replace both on every write)."""
        return {"data": dict(self.data), "binaryData": dict(self.binary_data)}

    @classmethod
    def from_configmap(cls, configmap: Mapping[str, Any], base_name: str) -> ConfigMapPayload:
        name = configmap.get("metadata", {}).get("name", "")
        if not name.startswith(base_name):
            raise AssignmentFormatError(f"ConfigMap {name!r} is not part of {base_name!r}")
        return cls(
            suffix=name[len(base_name) :],
            data=configmap.get("data") or {},
            binary_data=configmap.get("binaryData") or {},
        )


def encode_assignment(
    table: AssignmentTable, *, inline_limit: int = INLINE_LIMIT, chunk_limit: int = CHUNK_LIMIT
) -> list[ConfigMapPayload]:
    """The ConfigMaps holding `table`, root first. Deterministic: same table, same bytes.

    Small tables: readable `map` JSON in `data`. Otherwise the `indexed` layout, gzipped, in
    `binaryData`; past `chunk_limit` the gzip stream is split into chunk ConfigMaps named by
    epoch and the root holds an index with their checksums. Write the chunks first and the root
    last: readers follow the root, so they never see a half-written table.
    """
    # The map layout needs well over 12 bytes per unit; skip building it when it cannot fit.
    if len(table.units) * 12 <= inline_limit:
        plain = _json_bytes(to_document(table, "map"))
        if len(plain) <= inline_limit:
            return [ConfigMapPayload("", data={DATA_KEY: plain.decode()})]
    blob = gzip.compress(_json_bytes(to_document(table, "indexed")), compresslevel=9, mtime=0)
    if len(blob) <= chunk_limit:
        return [ConfigMapPayload("", binary_data={GZIP_KEY: _b64(blob)})]
    parts = [blob[i : i + chunk_limit] for i in range(0, len(blob), chunk_limit)]
    chunks = [
        ConfigMapPayload(f"-{table.epoch}-{i}", binary_data={CHUNK_KEY: _b64(part)})
        for i, part in enumerate(parts)
    ]
    index = {
        "apiVersion": API_VERSION,
        "kind": INDEX_KIND,
        "set": {
            "kind": table.set_ref.kind,
            "namespace": table.set_ref.namespace,
            "name": table.set_ref.name,
            "uid": table.set_ref.uid,
        },
        "epoch": table.epoch,
        "encoding": "gzip",
        "size": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
        "chunks": [
            {"suffix": c.suffix, "size": len(p), "sha256": hashlib.sha256(p).hexdigest()}
            for c, p in zip(chunks, parts, strict=True)
        ],
    }
    root = ConfigMapPayload("", data={INDEX_KEY: _json_bytes(index).decode()})
    return [root, *chunks]


def chunk_suffixes(root: ConfigMapPayload) -> tuple[str, ...]:
    """Suffixes of the chunk ConfigMaps a reader must fetch besides the root (often none)."""
    if INDEX_KEY not in root.data:
        return ()
    return tuple(c["suffix"] for c in _index(root)["chunks"])


def decode_assignment(configmaps: Iterable[ConfigMapPayload]) -> AssignmentTable:
    """The table held by a root ConfigMap (suffix "") and, when it is an index, its chunks.

    Raises IncompleteAssignment when chunks are missing or stale (read again), and
    AssignmentFormatError when the content is invalid.
    """
    by_suffix = {c.suffix: c for c in configmaps}
    root = by_suffix.get("")
    if root is None:
        raise AssignmentFormatError("no root ConfigMap (suffix '') among the payloads")
    if DATA_KEY in root.data:
        raw = root.data[DATA_KEY].encode()
    elif GZIP_KEY in root.binary_data:
        raw = _gunzip(_unb64(root.binary_data[GZIP_KEY], GZIP_KEY))
    elif INDEX_KEY in root.data:
        raw = _gunzip(_join_chunks(_index(root), by_suffix))
    else:
        raise AssignmentFormatError(
            f"ConfigMap holds none of {DATA_KEY!r}, {GZIP_KEY!r} (binaryData), {INDEX_KEY!r}"
        )
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise AssignmentFormatError(f"assignment document is not JSON: {exc}") from None
    return from_document(doc)


def _index(root: ConfigMapPayload) -> dict[str, Any]:
    try:
        index = json.loads(root.data[INDEX_KEY])
    except ValueError as exc:
        raise AssignmentFormatError(f"{INDEX_KEY} is not JSON: {exc}") from None
    index = _object(index, INDEX_KEY)
    if index.get("apiVersion") != API_VERSION or index.get("kind") != INDEX_KIND:
        raise AssignmentFormatError(
            f"{INDEX_KEY}: unsupported index {index.get('apiVersion')!r}/{index.get('kind')!r}"
        )
    if index.get("encoding") != "gzip":
        raise AssignmentFormatError(f"{INDEX_KEY}: unsupported encoding {index.get('encoding')!r}")
    for i, chunk in enumerate(_array(index.get("chunks"), f"{INDEX_KEY}.chunks")):
        chunk = _object(chunk, f"{INDEX_KEY}.chunks[{i}]")
        _string(chunk.get("suffix"), f"{INDEX_KEY}.chunks[{i}].suffix")
        _string(chunk.get("sha256"), f"{INDEX_KEY}.chunks[{i}].sha256")
    _string(index.get("sha256"), f"{INDEX_KEY}.sha256")
    return index


def _join_chunks(index: dict[str, Any], by_suffix: Mapping[str, ConfigMapPayload]) -> bytes:
    parts = []
    for chunk in index["chunks"]:
        payload = by_suffix.get(chunk["suffix"])
        if payload is None or CHUNK_KEY not in payload.binary_data:
            raise IncompleteAssignment(
                f"chunk {chunk['suffix']!r} of epoch {index.get('epoch')} is missing"
            )
        part = _unb64(payload.binary_data[CHUNK_KEY], f"chunk {chunk['suffix']!r}")
        if hashlib.sha256(part).hexdigest() != chunk["sha256"]:
            raise IncompleteAssignment(f"chunk {chunk['suffix']!r} does not match its checksum")
        parts.append(part)
    blob = b"".join(parts)
    if hashlib.sha256(blob).hexdigest() != index["sha256"]:
        raise IncompleteAssignment("chunks do not add up to the indexed table")
    return blob


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise AssignmentFormatError(f"{what}: invalid base64: {exc}") from None


def _gunzip(blob: bytes) -> bytes:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        raw = inflater.decompress(blob, MAX_DOCUMENT_BYTES)
    except zlib.error as exc:
        raise AssignmentFormatError(f"assignment is not valid gzip: {exc}") from None
    if inflater.unconsumed_tail:
        raise AssignmentFormatError(f"assignment inflates beyond {MAX_DOCUMENT_BYTES} bytes")
    if not inflater.eof:
        raise AssignmentFormatError("assignment gzip stream is truncated")
    return raw
