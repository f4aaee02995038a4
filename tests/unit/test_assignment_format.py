"""The assignment ConfigMap format: round trips, storage modes, errors, the documented schema."""

from __future__ import annotations

import base64
import gzip
import json
import random
import re
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.api.assignment import (
    CHUNK_KEY,
    CHUNK_LIMIT,
    DATA_KEY,
    GZIP_KEY,
    INDEX_KEY,
    Ack,
    AssignmentFormatError,
    AssignmentTable,
    ConfigMapPayload,
    Incarnation,
    IncompleteAssignment,
    Release,
    ResourceRef,
    UnitState,
    ack_annotation_key,
    chunk_suffixes,
    decode_assignment,
    encode_assignment,
    from_document,
    storage,
    to_document,
    unit_order,
)

DOC = Path(__file__).parents[2] / "docs" / "assignment-format.md"
SET = ResourceRef("ShardSet", "default", "demo", "7d3c9a5e-0000-4000-8000-000000000001")
API_LIMIT = 1024 * 1024


def schema(name: str) -> dict:
    """A JSON Schema as published in docs/assignment-format.md."""
    match = re.search(rf"<!-- schema:{name} -->\s*```json\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"schema {name} not found in {DOC}"
    return json.loads(match.group(1))


def make_table(units: int, members: int, seed: int = 1, releasing: int = 0) -> AssignmentTable:
    rnd = random.Random(seed)
    names = [f"demo-workers-{i}" for i in range(members)]
    states = {}
    for unit in range(units):
        owner = rnd.choice(names)
        release = None
        if unit < releasing:
            release = Release(to=rnd.choice([n for n in names if n != owner]), since=1.5, epoch=9)
        states[str(unit)] = UnitState(owner, rnd.choice([1, 1, 1, 4, 7]), release)
    ms = tuple(
        Incarnation(n, f"uid-{i:04d}-{rnd.getrandbits(64):016x}") for i, n in enumerate(names)
    )
    return AssignmentTable(SET, 3, "akka", units, 9, ms, states)


@st.composite
def tables(draw: st.DrawFn) -> AssignmentTable:
    epoch = draw(st.integers(0, 2**40))
    names = draw(st.lists(st.text(min_size=1, max_size=12), unique=True, max_size=5))
    members = tuple(Incarnation(n, draw(st.text(min_size=1, max_size=8))) for n in names)
    unit_names = draw(
        st.one_of(
            st.integers(0, 40).map(lambda n: [str(i) for i in range(n)]),
            st.lists(st.text(min_size=1, max_size=10), unique=True, max_size=40),
        )
    )
    units = {}
    for unit in unit_names:
        owner = draw(st.sampled_from([None, *names]))
        unit_epoch = draw(st.integers(0, epoch))
        release = None
        others: list[str | None] = [n for n in names if n != owner]
        if owner is not None and draw(st.booleans()):
            release = Release(
                to=draw(st.sampled_from([*others, None])),  # None: to nobody
                since=draw(st.floats(-1e12, 1e12, allow_nan=False)),
                epoch=draw(st.integers(unit_epoch, epoch)),
            )
        units[unit] = UnitState(owner, unit_epoch, release)
    return AssignmentTable(
        set_ref=ResourceRef(
            *(draw(st.text(min_size=1, max_size=10)) for _ in range(4)),
        ),
        generation=draw(st.integers(0, 2**31)),
        key_scheme=draw(st.sampled_from(["netherite", "akka", "apportion"])),
        count=len(unit_names),
        epoch=epoch,
        members=members,
        units=units,
    )


# ------------------------------------------------------------------------------- round trips


@settings(max_examples=200)
@given(tables(), st.sampled_from(["map", "indexed"]))
def test_documents_round_trip(table: AssignmentTable, layout: str) -> None:
    doc = to_document(table, layout)  # type: ignore[arg-type]
    assert from_document(json.loads(json.dumps(doc))) == table


@settings(max_examples=100)
@given(tables(), st.integers(0, 4096), st.integers(16, 4096))
def test_configmaps_round_trip_in_every_storage_mode(
    table: AssignmentTable, inline_limit: int, chunk_limit: int
) -> None:
    payloads = encode_assignment(table, inline_limit=inline_limit, chunk_limit=chunk_limit)
    assert payloads[0].suffix == ""
    assert set(chunk_suffixes(payloads[0])) == {p.suffix for p in payloads[1:]}
    assert decode_assignment(reversed(payloads)) == table


def test_small_tables_are_readable_json_in_data() -> None:
    table = make_table(32, 4, releasing=2)
    (root,) = encode_assignment(table)
    assert root.binary_data == {}
    assert list(root.data) == [DATA_KEY]
    doc = json.loads(root.data[DATA_KEY])
    assert doc["layout"] == "map"
    assert doc["epoch"] == 9
    assert doc["units"]["5"] == table.units["5"].owner
    assert len(doc["releasing"]) == 2


def test_mid_size_tables_are_gzipped_in_binary_data() -> None:
    table = make_table(10_000, 50)
    (root,) = encode_assignment(table)
    assert root.data == {}
    assert list(root.binary_data) == [GZIP_KEY]
    doc = json.loads(gzip.decompress(base64.b64decode(root.binary_data[GZIP_KEY])))
    assert doc["layout"] == "indexed"
    assert "unitNames" not in doc
    assert decode_assignment([root]) == table


def test_tables_beyond_one_configmap_are_chunked_under_an_index() -> None:
    table = make_table(2_000, 30)
    payloads = encode_assignment(table, inline_limit=0, chunk_limit=1024)
    root, *chunks = payloads
    assert len(chunks) > 1
    assert list(root.data) == [INDEX_KEY]
    assert [c.suffix for c in chunks] == [f"-9-{i}" for i in range(len(chunks))]
    assert all(list(c.binary_data) == [CHUNK_KEY] and c.size <= 1024 for c in chunks)
    assert decode_assignment(payloads) == table


def test_a_hundred_thousand_units_fit_the_api_limits() -> None:
    table = make_table(100_000, 1000, releasing=500)
    payloads = encode_assignment(table)
    assert all(p.size <= CHUNK_LIMIT < API_LIMIT for p in payloads)
    assert decode_assignment(payloads) == table


def test_encoding_is_deterministic() -> None:
    table = make_table(5_000, 20)
    assert encode_assignment(table) == encode_assignment(make_table(5_000, 20))
    assert encode_assignment(table, chunk_limit=2048) == encode_assignment(table, chunk_limit=2048)


def test_payload_from_a_configmap_object() -> None:
    table = make_table(3_000, 10)
    payloads = encode_assignment(table, inline_limit=0, chunk_limit=4096)
    objects = [{"metadata": {"name": f"demo-assignment{p.suffix}"}, **p.body()} for p in payloads]
    read = [ConfigMapPayload.from_configmap(o, "demo-assignment") for o in objects]
    assert read == payloads
    assert decode_assignment(read) == table
    with pytest.raises(AssignmentFormatError, match="not part of"):
        ConfigMapPayload.from_configmap({"metadata": {"name": "other"}}, "demo-assignment")


def test_sizes_count_decoded_binary_data() -> None:
    payload = ConfigMapPayload("", data={"a": "héllo"}, binary_data={"b": "AAECAw=="})
    assert payload.size == len("héllo".encode()) + 4
    assert payload.wire_size == len("héllo".encode()) + 8


# ----------------------------------------------------------------------------------- readers


def chunked() -> list[ConfigMapPayload]:
    return encode_assignment(make_table(2_000, 30), inline_limit=0, chunk_limit=2048)


def test_a_missing_chunk_asks_for_a_reread() -> None:
    root, *chunks = chunked()
    with pytest.raises(IncompleteAssignment, match="missing"):
        decode_assignment([root, *chunks[1:]])


def test_a_chunk_of_another_write_asks_for_a_reread() -> None:
    root, _, *rest = chunked()
    other = encode_assignment(make_table(2_000, 30, seed=2), inline_limit=0, chunk_limit=2048)
    with pytest.raises(IncompleteAssignment, match="checksum"):
        decode_assignment([root, other[1], *rest])


def test_chunks_that_match_but_do_not_add_up_ask_for_a_reread() -> None:
    root, *chunks = chunked()
    index = json.loads(root.data[INDEX_KEY])
    index["sha256"] = "0" * 64
    tampered = ConfigMapPayload("", data={INDEX_KEY: json.dumps(index)})
    with pytest.raises(IncompleteAssignment, match="add up"):
        decode_assignment([tampered, *chunks])


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (ConfigMapPayload("-1-0"), "no root"),
        (ConfigMapPayload(""), "holds none of"),
        (ConfigMapPayload("", data={DATA_KEY: "{"}), "not JSON"),
        (ConfigMapPayload("", binary_data={GZIP_KEY: "***"}), "invalid base64"),
        (ConfigMapPayload("", binary_data={GZIP_KEY: "AAAA"}), "not valid gzip"),
        (
            ConfigMapPayload("", binary_data={GZIP_KEY: base64.b64encode(b"\x1f\x8b").decode()}),
            "truncated",
        ),
        (ConfigMapPayload("", data={INDEX_KEY: "[]"}), "expected an object"),
        (ConfigMapPayload("", data={INDEX_KEY: '{"kind": "Other"}'}), "unsupported index"),
    ],
)
def test_unreadable_configmaps_are_clear_errors(payload: ConfigMapPayload, message: str) -> None:
    with pytest.raises(AssignmentFormatError, match=message):
        decode_assignment([payload])


def test_inflating_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    (root,) = encode_assignment(make_table(10_000, 50))
    monkeypatch.setattr(storage, "MAX_DOCUMENT_BYTES", 1024)
    with pytest.raises(AssignmentFormatError, match="inflates beyond"):
        decode_assignment([root])


def valid_doc() -> dict:
    return to_document(make_table(4, 2, releasing=1), "map")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(apiVersion="apportion.dev/v2"), "unsupported document"),
        (lambda d: d.update(layout="tree"), "layout"),
        (lambda d: d.update(epoch=-1), "epoch: expected a non-negative integer"),
        (lambda d: d.update(epoch=True), "epoch"),
        (lambda d: d["set"].pop("uid"), "set.uid"),
        (lambda d: d["members"].append({"name": "x"}), r"members\[2\].uid"),
        (lambda d: d["members"].append(dict(d["members"][0])), "duplicate member"),
        (lambda d: d["units"].update({"3": "nobody"}), "not a member"),
        (lambda d: d["units"].update({"0": 7}), r"units\['0'\]"),
        (lambda d: d["unitEpochs"].pop("1"), "exactly the keys"),
        (lambda d: d["unitEpochs"].update({"1": 99}), "outside 0..9"),
        (lambda d: d["releasing"]["0"].update({"from": "x"}), "'from' must be the unit's owner"),
        (lambda d: d["releasing"]["0"].update({"since": "soon"}), "since: expected a number"),
        (lambda d: d["releasing"]["0"].update({"epoch": 10}), "release epoch"),
        (lambda d: d["releasing"]["0"].update({"to": d["units"]["0"]}), "another member"),
    ],
)
def test_invalid_documents_name_the_field(edit, message: str) -> None:
    doc = valid_doc()
    edit(doc)
    with pytest.raises(AssignmentFormatError, match=message):
        from_document(doc)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["owners"].append(0), "equal length"),
        (lambda d: d["owners"].__setitem__(0, 2), "member index below 2"),
        (lambda d: d["owners"].__setitem__(0, 1.0), "member index"),
        (lambda d: d.update(unitNames=["a", "a", "b", "c"]), "duplicate unit"),
        (lambda d: d.update(owners={}), "owners: expected an array"),
    ],
)
def test_invalid_indexed_documents_name_the_field(edit, message: str) -> None:
    doc = to_document(make_table(4, 2), "indexed")
    edit(doc)
    with pytest.raises(AssignmentFormatError, match=message):
        from_document(doc)


# ---------------------------------------------------------------------------- the documentation


@pytest.mark.parametrize("layout", ["map", "indexed"])
def test_documents_match_the_published_schema(layout: str) -> None:
    table = make_table(300, 7, releasing=5)
    jsonschema.validate(to_document(table, layout), schema("assignment"))  # type: ignore[arg-type]
    named = AssignmentTable(
        SET,
        1,
        "apportion",
        2,
        3,
        (Incarnation("a", "u"),),
        {"x": UnitState("a", 2), "y": UnitState(None, 3)},
    )
    jsonschema.validate(to_document(named, layout), schema("assignment"))  # type: ignore[arg-type]


def test_the_index_and_the_ack_match_their_schemas() -> None:
    root = chunked()[0]
    jsonschema.validate(json.loads(root.data[INDEX_KEY]), schema("index"))
    ack = Ack(uid="u", epoch=3, pending=frozenset({"10", "2"}), draining=True)
    jsonschema.validate(json.loads(ack.to_annotation()), schema("ack"))
    failing = Ack(uid="u", epoch=3, pending=frozenset({"2"}), failing={"2": "OSError: full"})
    jsonschema.validate(json.loads(failing.to_annotation()), schema("ack"))


def test_the_schema_rejects_what_readers_must_reject() -> None:
    doc = to_document(make_table(4, 2), "map")
    for broken in ({**doc, "layout": "tree"}, {**doc, "epoch": -1}, {**doc, "units": {"0": 1}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema("assignment"))


def test_the_documented_example_is_a_valid_table() -> None:
    example = re.search(r"## The document\s*```json\n(.*?)```", DOC.read_text(), re.S)
    assert example
    doc = json.loads(example.group(1))
    jsonschema.validate(doc, schema("assignment"))
    table = from_document(doc)
    assert table.owners()["5"] == "demo-workers-2"
    assert table.releasing()["4"] == Release("demo-workers-2", 1718000012.5, 3)
    assert doc["ackAnnotation"] == table.set_ref.ack_annotation


# ------------------------------------------------------------------------------ acks and types


def test_ack_round_trip_and_errors() -> None:
    ack = Ack(uid="u-1", epoch=12, pending=frozenset({"10", "9"}), draining=True)
    text = ack.to_annotation()
    assert json.loads(text)["pending"] == ["9", "10"]
    assert Ack.from_annotation(text) == ack
    assert Ack.from_annotation('{"uid": "u", "epoch": 0}') == Ack("u", 0)
    assert "failing" not in text  # written only when something fails: older readers see no change
    failing = Ack("u-1", 12, frozenset({"10", "9"}), failing={"10": "OSError: full", "9": "x"})
    text = failing.to_annotation()
    assert list(json.loads(text)["failing"]) == ["9", "10"]
    assert Ack.from_annotation(text) == failing
    assert "set" not in text  # named only after the API server went back
    rewound = Ack("u-1", 12, set_uid="set-uid")
    assert json.loads(rewound.to_annotation())["set"] == "set-uid"
    assert Ack.from_annotation(rewound.to_annotation()) == rewound
    for bad, message in [
        ('{"uid": "u", "epoch": 1, "set": 7}', "set"),
        ("nope", "not JSON"),
        ("[]", "JSON object"),
        ('{"epoch": 1}', "uid"),
        ('{"uid": "u", "epoch": -1}', "epoch"),
        ('{"uid": "u", "epoch": 1, "pending": "0"}', "pending"),
        ('{"uid": "u", "epoch": 1, "draining": "yes"}', "draining"),
        ('{"uid": "u", "epoch": 1, "failing": ["0"]}', "failing"),
        ('{"uid": "u", "epoch": 1, "failing": {"0": 1}}', "failing"),
    ]:
        with pytest.raises(AssignmentFormatError, match=message):
            Ack.from_annotation(bad)


ANNOTATION = re.compile(r"^apportion\.dev/[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")


def test_ack_annotation_keys_are_valid_and_distinct() -> None:
    assert ack_annotation_key("PartitionSet", "demo") == "apportion.dev/ack.partitionset.demo"
    long_a = ack_annotation_key("ShardSet", "x" * 200 + "a")
    long_b = ack_annotation_key("ShardSet", "x" * 200 + "b")
    assert long_a != long_b
    for key in (long_a, long_b, ack_annotation_key("ShardSet", "a.b-c" * 12)):
        assert ANNOTATION.match(key)
        assert len(key.split("/", 1)[1]) <= 63


def test_tables_refuse_inconsistent_content() -> None:
    a = Incarnation("a", "ua")
    with pytest.raises(AssignmentFormatError, match="duplicate"):
        AssignmentTable(SET, 1, "akka", 0, 1, (a, Incarnation("a", "ub")), {})
    with pytest.raises(AssignmentFormatError, match="not a member"):
        AssignmentTable(SET, 1, "akka", 1, 1, (a,), {"0": UnitState("b", 1)})
    with pytest.raises(AssignmentFormatError, match="outside"):
        AssignmentTable(SET, 1, "akka", 1, 1, (a,), {"0": UnitState("a", 2)})
    with pytest.raises(AssignmentFormatError, match="another member"):
        AssignmentTable(SET, 1, "akka", 1, 1, (a,), {"0": UnitState("a", 1, Release("a", 0, 1))})
    with pytest.raises(AssignmentFormatError, match="release epoch"):
        AssignmentTable(
            SET,
            1,
            "akka",
            1,
            3,
            (a, Incarnation("b", "ub")),
            {"0": UnitState("a", 2, Release("b", 0, 1))},
        )
    with pytest.raises(AssignmentFormatError, match="generation"):
        AssignmentTable(SET, -1, "akka", 0, 0, (), {})


def test_table_views() -> None:
    table = make_table(6, 2, releasing=1)
    by_member = table.by_member()
    assert sorted(u for units in by_member.values() for u in units) == sorted(table.units)
    assert list(table.owners()) == ["0", "1", "2", "3", "4", "5"]
    assert list(table.releasing()) == ["0"]
    assert table.units["0"].owner in by_member


def test_unit_order_is_numeric_then_lexicographic() -> None:
    assert unit_order(["10", "9", "b", "01", "a", "0"]) == ("0", "9", "10", "01", "a", "b")
