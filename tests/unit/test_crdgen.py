"""The pydantic → structural CRD schema converter, the generated CRDs, and `crds/` freshness."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from apportion.api import GrainType, PartitionSet, ShardSet, resource_kinds
from apportion.api.common import Duration, IntOrPercent, cel, list_map, min_duration, validations
from apportion.api.crdgen import (
    SchemaError,
    crd_for,
    rendered_files,
    stale_crds,
    structural,
    unbounded,
    write_crds,
)
from apportion.cli import main

REPO = Path(__file__).resolve().parents[2]


class Color(StrEnum):
    """A color."""

    RED = "red"
    BLUE = "blue"


class Leaf(BaseModel):
    """A leaf."""

    model_config = ConfigDict(json_schema_extra=validations(cel("self.n > 0", "n must be > 0")))

    n: int = Field(1, gt=0, le=10, description="A number.")


class Tree(BaseModel):
    """A tree."""

    leaf: Leaf = Field(
        description="Required leaf.", json_schema_extra=validations(cel("true", "field rule"))
    )
    maybe: Leaf | None = Field(None, description="Optional leaf.")
    color: Color = Field(Color.RED, description="Its color.")
    tags: dict[str, str] = Field(default_factory=dict, max_length=4)
    leaves: list[Leaf] = Field(default_factory=list, max_length=3, json_schema_extra=list_map("n"))
    anything: dict[str, Any] = Field(default_factory=dict)
    amount: IntOrPercent = Field(1, description="Count or percentage.")


@pytest.fixture(scope="module")
def tree() -> dict[str, Any]:
    return structural(Tree.model_json_schema())


def walk(node: dict[str, Any], path: str = ""):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_refs_are_inlined_and_field_text_wins(tree: dict[str, Any]) -> None:
    leaf = tree["properties"]["leaf"]
    assert "$ref" not in leaf
    assert "$defs" not in tree
    assert leaf["type"] == "object"
    assert leaf["description"] == "Required leaf."
    assert leaf["properties"]["n"]["type"] == "integer"
    assert [r["message"] for r in leaf["x-kubernetes-validations"]] == [
        "n must be > 0",
        "field rule",
    ], "the model's rules and the field's rules are both kept"
    assert tree["required"] == ["leaf"]


def test_null_unions_become_nullable(tree: dict[str, Any]) -> None:
    maybe = tree["properties"]["maybe"]
    assert maybe["nullable"] is True
    assert maybe["type"] == "object"
    assert "anyOf" not in maybe
    assert "default" not in maybe


def test_enums_defaults_and_bounds(tree: dict[str, Any]) -> None:
    color = tree["properties"]["color"]
    assert color == {
        "description": "Its color.",
        "type": "string",
        "enum": ["red", "blue"],
        "default": "red",
    }
    n = tree["properties"]["leaf"]["properties"]["n"]
    assert (n["minimum"], n["exclusiveMinimum"], n["maximum"]) == (0, True, 10)


def test_no_titles_anywhere(tree: dict[str, Any]) -> None:
    assert all("title" not in node for _, node in walk(tree))


def test_maps_lists_and_free_form(tree: dict[str, Any]) -> None:
    props = tree["properties"]
    assert props["tags"]["additionalProperties"] == {"type": "string"}
    assert props["tags"]["maxProperties"] == 4
    assert props["leaves"]["x-kubernetes-list-type"] == "map"
    assert props["leaves"]["x-kubernetes-list-map-keys"] == ["n"]
    assert props["leaves"]["items"]["type"] == "object"
    assert props["anything"]["x-kubernetes-preserve-unknown-fields"] is True
    assert "additionalProperties" not in props["anything"]


def test_int_or_string(tree: dict[str, Any]) -> None:
    amount = tree["properties"]["amount"]
    assert amount["x-kubernetes-int-or-string"] is True
    assert amount["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert "type" not in amount
    assert amount["default"] == 1
    assert "percentage" in amount["x-kubernetes-validations"][0]["message"]


def test_plain_int_or_str_union_becomes_int_or_string() -> None:
    class M(BaseModel):
        v: int | str

    assert structural(M.model_json_schema())["properties"]["v"]["x-kubernetes-int-or-string"]


def test_unions_of_objects_are_refused() -> None:
    class A(BaseModel):
        a: int

    class B(BaseModel):
        b: int

    class M(BaseModel):
        v: A | B

    with pytest.raises(SchemaError, match=r"\.v: unions of several types"):
        structural(M.model_json_schema())


def test_sets_are_refused() -> None:
    class M(BaseModel):
        v: set[int]

    with pytest.raises(SchemaError, match="uniqueItems"):
        structural(M.model_json_schema())


def test_unbounded_finds_strings_lists_and_maps() -> None:
    class M(BaseModel):
        s: str
        ok: str = Field("", max_length=3)
        li: list[int]
        m: dict[str, str] = Field(default_factory=dict, max_length=2)

    assert unbounded(structural(M.model_json_schema())) == [".s", ".li", ".m{}"]


@pytest.mark.parametrize("kind", [PartitionSet, ShardSet, GrainType], ids=lambda k: k.__name__)
def test_crd_is_structural_and_bounded(kind: type) -> None:
    crd = crd_for(kind)
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert not {"$ref", "$defs", "title", "allOf", "oneOf"} & node.keys(), path
        assert "anyOf" not in node or node.get("x-kubernetes-int-or-string"), path
        assert (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), f"{path} has no type"
    assert unbounded(schema["properties"]["spec"]) == []
    assert unbounded(schema["properties"]["status"]) == []
    assert version["subresources"] == {"status": {}}
    assert schema["required"] == ["spec"]
    for path, node in walk(schema):  # a list map keyed by `rule` for server-side apply
        rules = [v["rule"] for v in node.get("x-kubernetes-validations", ())]
        assert len(rules) == len(set(rules)), path


def test_a_rule_repeated_by_a_field_on_its_type_is_kept_once() -> None:
    """An optional Duration with a bound repeats its type's format rule (min_duration): once in
    the CRD, or server-side apply refuses it."""

    class M(BaseModel):
        d: Duration | None = Field(default=None, json_schema_extra=min_duration("d", "1s"))

    (node,) = [n for path, n in walk(structural(M.model_json_schema())) if path.endswith(".d")]
    rules = [v["rule"] for v in node["x-kubernetes-validations"]]
    assert len(rules) == 2
    assert len(set(rules)) == 2


def test_one_rule_with_two_messages_is_refused() -> None:
    class M(BaseModel):
        d: Duration | None = Field(
            default=None,
            json_schema_extra=validations(
                cel("self.matches(r'^x$')", "one"), cel("self.matches(r'^x$')", "two")
            ),
        )

    with pytest.raises(SchemaError, match="share the rule"):
        structural(M.model_json_schema())


def test_crd_metadata() -> None:
    crd = crd_for(PartitionSet)
    assert crd["metadata"]["name"] == "partitionsets.apportion.dev"
    spec = crd["spec"]
    assert spec["group"] == "apportion.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "PartitionSet",
        "listKind": "PartitionSetList",
        "plural": "partitionsets",
        "singular": "partitionset",
        "shortNames": ["pset", "psets"],
        "categories": ["apportion"],
    }
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["served"]
    assert version["storage"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Units"]["jsonPath"] == ".spec.partitions"
    assert columns["Age"]["type"] == "date"
    assert columns["Strategy"]["priority"] == 1
    assert crd_for(ShardSet)["spec"]["versions"][0]["additionalPrinterColumns"][3]["jsonPath"] == (
        ".spec.shards"
    )


def test_status_conditions_are_a_map_keyed_by_type() -> None:
    schema = crd_for(GrainType)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


@pytest.mark.parametrize(("kind", "field"), [(PartitionSet, "partitions"), (ShardSet, "shards")])
def test_unit_counts_change_only_by_a_factor_and_only_with_the_apportion_scheme(
    kind: type, field: str
) -> None:
    spec = crd_for(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "x-kubernetes-validations" not in spec["properties"][field]
    rules = [r for r in spec["x-kubernetes-validations"] if r.get("fieldPath") == f".{field}"]
    scheme, factor = rules
    assert "oldSelf.keyScheme == 'apportion'" in scheme["rule"]
    assert "netherite and akka" in scheme["message"]
    assert f"self.{field} % oldSelf.{field} == 0" in factor["rule"]
    assert f"oldSelf.{field} % self.{field} == 0" in factor["rule"]


def test_settings_objects_default_to_their_full_defaults() -> None:
    spec = crd_for(ShardSet)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    assert spec["properties"]["strategy"]["default"] == {"name": "Balanced"}
    assert spec["properties"]["rebalance"]["default"]["handoffTimeout"] == "60s"


def test_files_cover_every_kind_and_a_kustomization() -> None:
    files = rendered_files()
    assert sorted(files) == [
        "Kustomization",
        "graintypes.apportion.dev.yaml",
        "partitionsets.apportion.dev.yaml",
        "shardsets.apportion.dev.yaml",
    ]
    assert len(resource_kinds()) == 3
    kustomization = yaml.safe_load(files["Kustomization"])
    assert kustomization["resources"] == sorted(n for n in files if n.endswith(".yaml"))
    for name, text in files.items():
        assert text.startswith("# Generated by `apportion crds`"), name


def test_committed_crds_are_up_to_date() -> None:
    stale = stale_crds(REPO / "crds")
    assert stale == [], f"crds/ is stale ({stale}): run `make crds` and commit the result"


def test_check_command_detects_changes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["crds", "--check", "--output", str(tmp_path)]) == 1
    write_crds(tmp_path)
    assert main(["crds", "--check", "--output", str(tmp_path)]) == 0
    target = tmp_path / "shardsets.apportion.dev.yaml"
    target.write_text(target.read_text() + "# edited\n")
    (tmp_path / "old.apportion.dev.yaml").write_text("")
    assert main(["crds", "--check", "--output", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "shardsets.apportion.dev.yaml" in err
    assert "old.apportion.dev.yaml" in err


def test_crds_command_prints_every_crd(capsys: pytest.CaptureFixture) -> None:
    assert main(["crds"]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert sorted(d["metadata"]["name"] for d in documents) == [
        "graintypes.apportion.dev",
        "partitionsets.apportion.dev",
        "shardsets.apportion.dev",
    ]
