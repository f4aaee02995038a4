"""`apportion locate` and `apportion plan`, run as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from apportion.engine.keys import get_scheme

REPO = Path(__file__).resolve().parents[2]


def apportion(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apportion", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_locate_prints_id_tab_unit() -> None:
    result = apportion(
        "locate",
        "--scheme",
        "netherite",
        "--count",
        "4",
        "customer-order-9027403995!7",
        "!07",
        "x!222",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["customer-order-9027403995!7\t3", "!07\t3", "x!222\t2"]


def test_locate_json_and_from_file(tmp_path: Path) -> None:
    ids = ["hello", "abc", "polygenelubricants"]
    path = tmp_path / "ids.txt"
    path.write_text("\n".join(ids[1:]) + "\r\n\n", encoding="utf-8")
    result = apportion(
        "locate", "--scheme", "akka", "--count", "1000", "--json", "--from-file", str(path), ids[0]
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        {"id": "hello", "unit": 322},
        {"id": "abc", "unit": 354},
        {"id": "polygenelubricants", "unit": 648},
    ]


def test_locate_stdin_default_scheme_matches_the_library() -> None:
    ids = [f"order-{i}" for i in range(50)]
    result = apportion("locate", "--count", "64", "--from-file", "-", stdin="\n".join(ids))
    assert result.returncode == 0, result.stderr
    expected = get_scheme("apportion").units(ids, 64).tolist()
    assert [int(line.split("\t")[1]) for line in result.stdout.splitlines()] == expected


def test_locate_errors() -> None:
    assert apportion("locate", "--count", "4").returncode == 2
    assert apportion("locate", "--count", "0", "x").returncode == 2
    assert apportion("locate", "--count", "4", "--scheme", "md5", "x").returncode == 2


def test_plan_from_file(tmp_path: Path) -> None:
    path = tmp_path / "snap.json"
    members = [{"name": f"m{i}"} for i in range(101)]
    units = [f"u{j}" for j in range(10_000)]
    assignment = {f"m{i}": units[i * 100 : (i + 1) * 100] for i in range(100)}
    path.write_text(
        json.dumps({"strategy": {"name": "Balanced"}, "members": members, "assignment": assignment})
    )
    result = apportion("plan", "--input", str(path), "--compact")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["metrics"]["moves"] == plan["metrics"]["lowerBound"] == 99
    assert {m["to"] for m in plan["moves"]} == {"m100"}
    assert set(plan["moves"][0]) == {"unit", "from", "to"}
    assert list(plan["assignment"]) == [f"m{i}" for i in range(101)]
    assert sorted(len(v) for v in plan["assignment"].values())[::100] == [99, 100]


def test_plan_from_stdin_least_shards() -> None:
    snapshot = {
        "strategy": {"name": "LeastShards", "absoluteLimit": 1000, "relativeLimit": 1.0},
        "members": [{"name": "A"}, {"name": "B"}, {"name": "C"}],
        "assignment": {
            "A": ["001", "002", "003", "004"],
            "B": ["005", "006", "007", "008"],
            "C": [],
        },
    }
    result = apportion("plan", "-i", "-", stdin=json.dumps(snapshot))
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert {m["unit"] for m in plan["moves"]} == {"001", "005"}
    assert plan["assignment"]["C"] == ["005", "001"] or sorted(plan["assignment"]["C"]) == [
        "001",
        "005",
    ]


def test_plan_bad_snapshots_exit_2_with_a_clear_message(tmp_path: Path) -> None:
    cases = {
        '{"strategy": {"name": "Nope"}, "members": []}': "unknown allocation strategy 'Nope'",
        '{"members": [{"name": "a", "capacity": -1}]}': "capacity must not be negative",
        '{"members": [], "units": ["x", "x"]}': "unit 'x' is listed twice",
        '{"members": [], "assignment": {"a": ["1"], "b": ["1"]}}': "assigned to 'a' and 'b'",
        '{"members": [': "malformed JSON",
    }
    for text, message in cases.items():
        result = apportion("plan", "--input", "-", stdin=text)
        assert result.returncode == 2, text
        assert message in result.stderr
        assert result.stdout == ""
    missing = apportion("plan", "--input", str(tmp_path / "nope.json"))
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr


def test_locate_tells_a_release_to_nobody_from_no_release(tmp_path: Path) -> None:
    """A unit released to nobody (a restart in place) answers `releasingTo: null`; one that is
    not releasing has no `releasingTo` at all."""
    case = json.loads((REPO / "conformance/tables/release-to-nobody.json").read_text())
    path = tmp_path / "table.json"
    path.write_text(json.dumps(case["document"]))
    # Netherite's explicit `!n`: the ID's unit is n, whatever the hash would say.
    result = apportion("locate", "--table", str(path), "--json", "order!4", "order!5")
    assert result.returncode == 0, result.stderr
    held, settled = json.loads(result.stdout)
    assert held == {"id": "order!4", "unit": 4, "pod": "demo-workers-0", "releasingTo": None}
    assert settled == {"id": "order!5", "unit": 5, "pod": "demo-workers-2"}
