"""Writes the generated half of the conformance cases (conformance/README.md says which half).

Run from anywhere: `python3 conformance/generate.py`. Needs the `xxhash` package (the Python
binding of the reference C xxHash) and `java` (the JVM's own String.hashCode is the oracle of the
akka scheme). It imports nothing from apportion: the point of the cases is to check apportion's
readers, Python and Java, against something that is not one of them.

- tables/stored/: every hand-written table case of tables/ stored in each way the format allows
  (plain JSON, gzip, gzip split into checksummed chunks), made with the standard library's gzip,
  hashlib and base64 only, plus damaged chunk sets whose outcome the format spec fixes.
- keys/: key -> unit vectors per key scheme, from independent oracles.
- names.json: the root ConfigMap and ack annotation names of a set, from the rules of
  docs/assignment-format.md ("names too long ... end in a digest") and hashlib's SHA-256.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import xxhash

HERE = Path(__file__).resolve().parent
TABLES = HERE / "tables"
STORED = TABLES / "stored"
KEYS = HERE / "keys"

CHUNK_BYTES = 128  # small, so that even the small tables here span several chunks
COUNTS = [1, 2, 3, 7, 32, 1000, 2147483647]


# ------------------------------------------------------------------------------------- tables


def configmap(
    name: str, data: dict[str, str] | None = None, binary: dict[str, bytes] | None = None
) -> dict[str, Any]:
    cm: dict[str, Any] = {"metadata": {"name": name}}
    if data:
        cm["data"] = data
    if binary:
        cm["binaryData"] = {k: base64.b64encode(v).decode() for k, v in binary.items()}
    return cm


def document_bytes(case: dict[str, Any]) -> bytes:
    if "raw" in case:
        return case["raw"].encode()
    return json.dumps(case["document"], separators=(",", ":"), ensure_ascii=False).encode()


def root_name(case: dict[str, Any]) -> str:
    doc = case.get("document")
    ref = doc.get("set") if isinstance(doc, dict) else None
    if isinstance(ref, dict) and ref.get("name") and ref.get("kind"):
        return f"{ref['name']}-{ref['kind'].lower()}-assignment"
    return "broken-partitionset-assignment"


def chunked(name: str, blob: bytes, epoch: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The index ConfigMap and its chunks, as docs/assignment-format.md describes them."""
    parts = [blob[i : i + CHUNK_BYTES] for i in range(0, len(blob), CHUNK_BYTES)]
    suffixes = [f"-{epoch}-{i}" for i in range(len(parts))]
    index = {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "AssignmentIndex",
        "set": {"kind": "PartitionSet", "namespace": "default", "name": name, "uid": "u"},
        "epoch": epoch,
        "encoding": "gzip",
        "size": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
        "chunks": [
            {"suffix": s, "size": len(p), "sha256": hashlib.sha256(p).hexdigest()}
            for s, p in zip(suffixes, parts, strict=True)
        ],
    }
    chunks = [
        configmap(name + s, binary={"assignments.part": p})
        for s, p in zip(suffixes, parts, strict=True)
    ]
    return index, chunks


def stored_variants(case_name: str, case: dict[str, Any]) -> dict[str, dict[str, Any]]:
    name = root_name(case)
    raw = document_bytes(case)
    blob = gzip.compress(raw, compresslevel=9, mtime=0)
    doc = case.get("document")
    epoch = doc.get("epoch", 0) if isinstance(doc, dict) else 0
    epoch = epoch if type(epoch) is int and epoch >= 0 else 0
    index, chunks = chunked(name, blob, epoch)
    root = configmap(name, data={"assignments.index.json": json.dumps(index)})
    variants = {
        "plain": [configmap(name, data={"assignments.json": raw.decode()})],
        "gzip": [configmap(name, binary={"assignments.json.gz": blob})],
        "chunked": [root, *chunks],
    }
    return {
        storage: {"case": case_name, "storage": storage, "name": name, "configmaps": cms}
        for storage, cms in variants.items()
    }


def damaged(case_name: str, case: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Chunk sets a reader must refuse: "incomplete" (read the root again) or "format"."""
    name = root_name(case)
    blob = gzip.compress(document_bytes(case), compresslevel=9, mtime=0)
    index, chunks = chunked(name, blob, case["document"]["epoch"])
    assert len(chunks) >= 3, "the damaged cases need a table of at least three chunks"

    def variant(
        storage: str,
        error: str,
        root_index: dict[str, Any] | None,
        parts: list[dict[str, Any]],
        **root_data: str,
    ) -> dict[str, Any]:
        data = dict(root_data) or {"assignments.index.json": json.dumps(root_index)}
        return {
            "case": case_name,
            "storage": storage,
            "name": name,
            "error": error,
            "configmaps": [configmap(name, data=data), *parts],
        }

    flipped = bytearray(blob[CHUNK_BYTES : 2 * CHUNK_BYTES])
    flipped[7] ^= 0x01
    wrong_total = dict(index, sha256=hashlib.sha256(b"another table").hexdigest())
    # Consistent checksums over a stream cut short: the gzip itself is broken, not the read.
    short = blob[: len(blob) - 9]
    short_index, short_chunks = chunked(name, short, case["document"]["epoch"])
    return {
        "chunk-missing": variant("chunk-missing", "incomplete", index, [chunks[0], chunks[2]]),
        "chunk-checksum": variant(
            "chunk-checksum",
            "incomplete",
            index,
            [
                chunks[0],
                configmap(
                    name + index["chunks"][1]["suffix"], binary={"assignments.part": bytes(flipped)}
                ),
                *chunks[2:],
            ],
        ),
        "total-checksum": variant("total-checksum", "incomplete", wrong_total, chunks),
        "truncated-gzip": variant("truncated-gzip", "format", short_index, short_chunks),
        "unknown-encoding": variant(
            "unknown-encoding", "format", dict(index, encoding="zstd"), chunks
        ),
        "no-table-key": variant("no-table-key", "format", None, [], **{"other.json": "{}"}),
    }


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n")


def generate_tables() -> None:
    STORED.mkdir(exist_ok=True)
    for old in STORED.glob("*.json"):
        old.unlink()
    for path in sorted(TABLES.glob("*.json")):
        case = json.loads(path.read_text())
        for storage, stored in stored_variants(path.stem, case).items():
            write_json(STORED / f"{path.stem}.{storage}.json", stored)
    example = json.loads((TABLES / "spec-example-map.json").read_text())
    for storage, stored in damaged("spec-example-map", example).items():
        write_json(STORED / f"spec-example-map.{storage}.json", stored)


# --------------------------------------------------------------------------------------- keys

KEYS_PLAIN = [
    "",
    "a",
    "abc",
    "order-1",
    "order-2",
    "customer-42",
    "user:1234567",
    "Grüße",
    "日本語のキー",
    "🍕 pizza",
    "\ud800x",
    "x\udfff",
    "polygenelubricants",
    "x" * 15,
    "y" * 16,
    "z" * 17,
    "m" * 128,
    "n" * 129,
    "o" * 240,
    "p" * 241,
    "q" * 1000,
]
"""Lengths around xxh3's 16/128/240-byte code paths; astral, unpaired-surrogate and non-Latin
keys; "polygenelubricants", whose Java hashCode is Integer.MIN_VALUE."""

KEYS_SUFFIX = [
    "customer!7",
    "a!b!12",
    "x!4294967295",
    "x!4294967296",
    "!07",
    "k!0000000000000000000012",
    "a!-1",
    "a!+1",
    "a!\u0663",
    "a!",
    "a!1 ",
    "!",
]
"""The `!n` suffix rule: n an unsigned 32-bit decimal of ASCII digits after the last `!`."""

# Published FNV-1a 32 values (the FNV reference, draft-eastlake-fnv): guards this file's FNV.
FNV1A_32_PUBLISHED = {b"": 0x811C9DC5, b"a": 0xE40C292C, b"foobar": 0xBF9CF968}
# Published XXH3-64 of the empty input, seed 0 (xxHash's sanity test): guards the binding.
XXH3_EMPTY = 0x2D06800538D394C2


def utf8(key: str) -> bytes:
    """UTF-8 with unpaired surrogates replaced by U+FFFD (.NET's Encoding.UTF8; the spec)."""
    return key.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").encode()


def suffix(key: str) -> int | None:
    bang = key.rfind("!")
    tail = key[bang + 1 :] if bang >= 0 else ""
    if not tail or not all("0" <= c <= "9" for c in tail):
        return None
    value = int(tail)
    return value if value <= 0xFFFFFFFF else None


def fnv1a_32(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


JAVA_AKKA = """
import java.nio.file.*;
public class Akka {
  public static void main(String[] args) throws Exception {
    String[] lines = Files.readString(Path.of(args[0])).split("\\n");
    int[] counts =
        java.util.Arrays.stream(args[1].split(",")).mapToInt(Integer::parseInt).toArray();
    StringBuilder out = new StringBuilder();
    for (String line : lines) {
      if (line.isEmpty()) continue;
      String[] hex = line.equals("-") ? new String[0] : line.split(" ");
      char[] units = new char[hex.length];
      for (int i = 0; i < hex.length; i++) units[i] = (char) Integer.parseInt(hex[i], 16);
      String id = new String(units);
      out.append(id.hashCode());
      for (int n : counts) out.append(' ').append(Math.abs(id.hashCode() % n));
      out.append('\\n');
    }
    System.out.print(out);
  }
}
"""


def java_akka(keys: list[str]) -> list[tuple[int, list[int]]]:
    """(String.hashCode, [abs(hashCode % n) for n in COUNTS]) per key, computed by the JVM."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "Akka.java")
        source.write_text(JAVA_AKKA)
        lines = []
        for key in keys:
            units = key.encode("utf-16-le", "surrogatepass")
            codes = [units[i] | units[i + 1] << 8 for i in range(0, len(units), 2)]
            lines.append(" ".join(f"{c:x}" for c in codes) or "-")
        Path(tmp, "keys.txt").write_text("\n".join(lines) + "\n")
        out = subprocess.run(
            ["java", str(source), str(Path(tmp, "keys.txt")), ",".join(map(str, COUNTS))],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split("\n")
    return [
        (int(row[0]), [int(u) for u in row[1:]])
        for row in (line.split() for line in out[: len(keys)])
    ]


def generate_keys() -> None:
    assert all(fnv1a_32(k) == v for k, v in FNV1A_32_PUBLISHED.items())
    assert xxhash.xxh3_64_intdigest(b"") == XXH3_EMPTY
    keys = KEYS_PLAIN + KEYS_SUFFIX

    def vectors(hash_of: Any, unit_of: Any) -> list[dict[str, Any]]:
        return [
            {"key": key, "hash": hash_of(key), "units": {str(n): unit_of(key, n) for n in COUNTS}}
            for key in keys
        ]

    def xxh3_unit(key: str, n: int) -> int:
        pinned = suffix(key)
        return pinned % n if pinned is not None else (xxhash.xxh3_64_intdigest(utf8(key)) * n) >> 64

    def fnv_unit(key: str, n: int) -> int:
        pinned = suffix(key)
        return (pinned if pinned is not None else fnv1a_32(utf8(key))) % n

    akka = java_akka(keys)
    schemes = {
        "apportion": (
            "xxh3-64 of the UTF-8 bytes (xxhash, the reference C implementation), "
            "as 16 hex digits; unit (hash*count)>>64, or n % count for a `!n` suffix",
            vectors(lambda k: f"{xxhash.xxh3_64_intdigest(utf8(k)):016x}", xxh3_unit),
        ),
        "netherite": (
            "FNV-1a-32 of the UTF-8 bytes, as 8 hex digits; unit hash % count, or "
            "n % count for a `!n` suffix",
            vectors(lambda k: f"{fnv1a_32(utf8(k)):08x}", fnv_unit),
        ),
        "akka": (
            "Java String.hashCode (signed, decimal) and Math.abs(hashCode % count), both "
            "computed by the JVM",
            [
                {"key": k, "hash": h, "units": dict(zip(map(str, COUNTS), units, strict=True))}
                for k, (h, units) in zip(keys, akka, strict=True)
            ],
        ),
    }
    KEYS.mkdir(exist_ok=True)
    for name, (meaning, vecs) in schemes.items():
        # One vector a line; ASCII only, so unpaired surrogates travel as \\u escapes.
        lines = ",\n".join(json.dumps(v, separators=(",", ":")) for v in vecs)
        head = json.dumps({"scheme": name, "hash": meaning})[:-1]
        (KEYS / f"{name}.json").write_text(f'{head}, "vectors": [\n{lines}\n]}}\n')


# ------------------------------------------------------------------------------------ names

NAMES = [
    ("PartitionSet", "demo"),
    ("ShardSet", "carts"),
    ("ShardSet", "a" * 50),  # the ack key's name part just fits in 63 characters
    ("ShardSet", "a" * 51),  # one more: cut, with a digest
    ("PartitionSet", "b" * 230),  # the ConfigMap name leaves no room for chunk suffixes
    ("ShardSet", "x" * 208 + "-.-" + "z" * 20),  # the cut ends in "-.", which is dropped
]


def generate_names() -> None:
    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    def config_map(kind: str, name: str) -> str:
        full = f"{name}-{kind.lower()}-assignment"  # at most 253 - 32: room for "-<epoch>-<i>"
        return full if len(full) <= 221 else f"{full[:210].rstrip('-.')}-{digest(full)}"

    def ack(kind: str, name: str) -> str:
        local = f"ack.{kind.lower()}.{name}"  # an annotation name part: at most 63 characters
        return "apportion.dev/" + (local if len(local) <= 63 else f"{local[:52]}-{digest(local)}")

    cases = [
        {"kind": k, "name": n, "configMap": config_map(k, n), "ackAnnotation": ack(k, n)}
        for k, n in NAMES
    ]
    write_json(HERE / "names.json", cases)


if __name__ == "__main__":
    generate_tables()
    generate_keys()
    generate_names()
