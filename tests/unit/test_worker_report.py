"""The worker metrics contract: Prometheus text rendered by workers, parsed by the operator."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.api.worker_report import (
    ACTIVATIONS,
    CONTENT_TYPE,
    METRICS,
    UNIT_LOAD,
    ExpositionError,
    Sample,
    WorkerReport,
    parse,
    render,
)

metric_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True)
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True)
label_values = st.text(max_size=20)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**53), max_value=2**53),
)
samples = st.builds(
    Sample, metric_names, values, st.dictionaries(label_names, label_values, max_size=4)
)


def same_value(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def by_family(items: list[Sample]) -> list[Sample]:
    """`render` groups samples by family in order of first appearance."""
    order: dict[str, list[Sample]] = {}
    for sample in items:
        order.setdefault(sample.name, []).append(sample)
    return [s for family in order.values() for s in family]


@settings(derandomize=True, max_examples=300)
@given(st.lists(samples, max_size=12))
def test_parse_reads_back_what_render_wrote(items: list[Sample]) -> None:
    parsed = parse(render(items))
    expected = by_family(items)
    assert [(s.name, dict(s.labels)) for s in parsed] == [
        (s.name, dict(s.labels)) for s in expected
    ]
    assert all(same_value(p.value, float(e.value)) for p, e in zip(parsed, expected, strict=True))


unit_ids = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8)
loads = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)
byte_counts = st.none() | st.integers(min_value=0, max_value=2**50)
worker_reports = st.builds(
    WorkerReport,
    unit_loads=st.dictionaries(
        unit_ids, st.dictionaries(unit_ids, loads, min_size=1, max_size=5), max_size=3
    ),
    activations=st.dictionaries(unit_ids, st.integers(0, 2**40), max_size=4),
    cpu_percent=st.none() | st.floats(min_value=0, max_value=100),
    cpu_count=st.none() | st.integers(1, 1024),
    memory_usage_bytes=byte_counts,
    memory_available_bytes=byte_counts,
    memory_max_available_bytes=byte_counts,
    overloaded=st.none() | st.booleans(),
)


@settings(derandomize=True, max_examples=300)
@given(worker_reports)
def test_worker_report_round_trip(report: WorkerReport) -> None:
    assert WorkerReport.parse(report.render()) == report


def test_rendered_page_is_what_docs_metrics_md_shows() -> None:
    text = WorkerReport(
        unit_loads={"orders": {"7": 12.5, "9": 0}},
        activations={"Cart": 40},
        cpu_percent=37.5,
        overloaded=False,
    ).render()
    assert 'apportion_unit_load{set="orders",unit="7"} 12.5\n' in text
    assert 'apportion_unit_load{set="orders",unit="9"} 0\n' in text
    assert 'apportion_activations{grain_type="Cart"} 40\n' in text
    assert "apportion_process_cpu_percent 37.5\n" in text
    assert "apportion_overloaded 0\n" in text
    assert "# TYPE apportion_unit_load gauge\n" in text
    assert f"# HELP apportion_unit_load {METRICS[UNIT_LOAD].help}\n" in text
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


# A page as a Prometheus client library serves it: other families, a histogram, timestamps,
# odd spacing, escapes, an OpenMetrics exemplar and EOF.
CLIENT_PAGE = r"""
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.47
# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_bucket{le="0.05"} 24054 # {trace_id="abc"} 0.04 1.6e9
http_request_duration_seconds_bucket{le="+Inf"} 144320
http_request_duration_seconds_sum 53423
# HELP apportion_unit_load Load.
# TYPE apportion_unit_load gauge
apportion_unit_load{set="orders",unit="0"} 1.5e1 1712345678000
apportion_unit_load { unit = "1" , set="orders" , } 3
apportion_unit_load{set="odd \"set\"\\name",unit="2\n"} .25
apportion_activations{grain_type="Cart"}	4e0
apportion_process_cpu_percent +Inf
this is not valid exposition but belongs to no family we read
# EOF
"""


def test_parse_reads_a_client_library_page() -> None:
    found = parse(CLIENT_PAGE, [UNIT_LOAD, ACTIVATIONS])
    assert found == [
        Sample(UNIT_LOAD, 15.0, {"set": "orders", "unit": "0"}),
        Sample(UNIT_LOAD, 3.0, {"unit": "1", "set": "orders"}),
        Sample(UNIT_LOAD, 0.25, {"set": 'odd "set"\\name', "unit": "2\n"}),
        Sample(ACTIVATIONS, 4.0, {"grain_type": "Cart"}),
    ]


def test_parse_without_a_filter_reads_every_family_and_rejects_bad_lines() -> None:
    with pytest.raises(ExpositionError, match="line 16: expected a value"):
        parse(CLIENT_PAGE)
    assert len(parse(CLIENT_PAGE.replace("this is not", "# this is not"))) == 9


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apportion_unit_load", "line 1: expected a value"),
        ('\napportion_unit_load{set="a} 1', "line 2: unterminated label value"),
        ('apportion_unit_load{set="a\\t"} 1', r"invalid escape \\t"),
        ('apportion_unit_load{set="a" unit="b"} 1', "expected , or }"),
        ('apportion_unit_load{set="a",set="b"} 1', "label set repeated"),
        ("apportion_unit_load{set=a} 1", 'expected =" after label set'),
        ("apportion_unit_load 1_000", "expected a timestamp"),
        ("apportion_unit_load 1 2 3", "unexpected text after the value"),
        ('apportion_unit_load{1a="x"} 1', "expected a label name"),
    ],
)
def test_parse_names_the_line_and_the_problem(text: str, message: str) -> None:
    with pytest.raises(ExpositionError, match=message):
        parse(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('apportion_unit_load{set="a",unit="1"} -1', "must be a finite number >= 0"),
        ('apportion_unit_load{set="a",unit="1"} NaN', "must be a finite number >= 0"),
        ('apportion_unit_load{unit="1"} 1', "needs a non-empty 'set' label"),
        ('apportion_activations{grain_type=""} 1', "needs a non-empty 'grain_type' label"),
        (
            'apportion_unit_load{set="a",unit="1"} 1\napportion_unit_load{unit="1",set="a"} 2',
            "appears twice",
        ),
        ("apportion_cpu_count 2\napportion_cpu_count 4", "apportion_cpu_count appears twice"),
    ],
)
def test_worker_report_rejects_values_placement_cannot_use(text: str, message: str) -> None:
    with pytest.raises(ExpositionError, match=message):
        WorkerReport.parse(text)


def test_render_rejects_invalid_names() -> None:
    with pytest.raises(ValueError, match="not a valid metric name"):
        render([Sample("1bad", 1)])
    with pytest.raises(ValueError, match="not a valid label name"):
        render([Sample("good", 1, {"bad-label": "x"})])


def test_empty_report_renders_empty_page() -> None:
    assert WorkerReport().render() == ""
    assert WorkerReport.parse("") == WorkerReport()
