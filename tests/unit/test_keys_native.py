"""The C key kernel against the Python path, bit for bit, on arbitrary Unicode."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.engine.keys import MAX_COUNT, NATIVE, PURE_SCHEMES, SCHEMES


def test_the_kernel_is_built_wherever_it_can_be() -> None:
    # Where libxxhash-dev puts its header (`make setup` installs it).
    if shutil.which("cc") is None or not Path("/usr/include/xxhash.h").exists():
        pytest.skip("no C compiler or no xxhash.h here: the Python path is the expected one")
    assert NATIVE, "cc and xxhash.h are present but apportion.engine._keys is not importable"


def test_without_the_kernel_the_python_path_serves() -> None:
    code = (
        "import sys; sys.modules['apportion.engine._keys'] = None\n"  # as if never built
        "from apportion.engine import keys\n"
        "assert not keys.NATIVE and keys.SCHEMES is keys.PURE_SCHEMES\n"
        "print(keys.get_scheme().unit('customer-42', 64))"
    )
    run = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert int(run.stdout) == PURE_SCHEMES["apportion"].unit("customer-42", 64)


native = pytest.mark.skipif(not NATIVE, reason="C kernel not built (Python path only)")

# Every code point, lone surrogates included (Java keeps them, .NET turns them into U+FFFD).
any_char = st.characters(exclude_categories=())
surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
text = st.text(st.one_of(any_char, surrogate, st.sampled_from("!0123456789a")), max_size=80)
digits = st.one_of(
    st.integers(0, 2**34).map(str),
    st.from_regex(r"0{0,12}[0-9]{0,12}", fullmatch=True),
    st.sampled_from(["4294967295", "4294967296", "0004294967295", "00000000000", "-1", "+1", "٣"]),
)
keys = st.one_of(
    text,
    st.builds(lambda head, bang, tail: head + bang + tail, text, st.sampled_from("!!!x"), digits),
    st.text(any_char, min_size=200, max_size=400),  # past the kernel's on-stack buffer
)
counts = st.one_of(
    st.integers(1, MAX_COUNT), st.sampled_from([1, 2, 3, 7, 1 << 30, MAX_COUNT - 1, MAX_COUNT])
)
names = st.sampled_from(sorted(PURE_SCHEMES))


@native
@settings(max_examples=1500)
@given(name=names, key=keys, count=counts)
def test_unit_equals_the_python_path(name: str, key: str, count: int) -> None:
    assert SCHEMES[name].unit(key, count) == PURE_SCHEMES[name].unit(key, count)


@native
@settings(max_examples=300)
@given(name=names, batch=st.lists(keys, max_size=40), count=counts)
def test_units_equal_the_python_path(name: str, batch: list[str], count: int) -> None:
    got = SCHEMES[name].units(batch, count)
    assert got.dtype == np.int64
    assert got.tolist() == PURE_SCHEMES[name].units(batch, count).tolist()
    assert got.tolist() == [SCHEMES[name].unit(k, count) for k in batch]


@native
def test_known_values_and_sequences_other_than_lists() -> None:
    apportion = SCHEMES["apportion"]
    assert SCHEMES["akka"].unit("polygenelubricants", 1000) == 648
    assert SCHEMES["netherite"].unit("@counter@x!07", 32) == 7
    assert apportion.unit("x!4294967295", MAX_COUNT) == 4294967295 % MAX_COUNT
    ids = ("a", "b!3", "\U0001f600")
    assert apportion.units(ids, 5).tolist() == apportion.units(list(ids), 5).tolist()
    # The native kernel takes any sequence of str, a numpy array of them too, which the
    # KeyScheme protocol's Sequence[str] does not name (the Python path needs a real sequence).
    array = cast("Sequence[str]", np.array(ids))
    assert apportion.units(array, 5).tolist() == apportion.units(list(ids), 5).tolist()
    assert apportion.units([], 5).tolist() == []


@native
@pytest.mark.parametrize("name", sorted(PURE_SCHEMES))
@pytest.mark.parametrize("count", [0, -1, MAX_COUNT + 1, 2**70])
def test_bad_counts_raise_as_the_python_path(name: str, count: int) -> None:
    message = f"count must be between 1 and {MAX_COUNT}, got {count}"
    for scheme in (SCHEMES[name], PURE_SCHEMES[name]):
        with pytest.raises(ValueError, match=message):
            scheme.unit("k", count)
        with pytest.raises(ValueError, match=message):
            scheme.units(["k"], count)


@native
def test_bad_arguments_are_clear_errors() -> None:
    apportion = SCHEMES["apportion"]
    with pytest.raises(TypeError, match="keys must be str, not int"):
        apportion.unit(5, 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keys must be str, not bytes"):
        apportion.units(["a", b"b"], 10)  # type: ignore[list-item]
    fill = apportion._fill  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="int64"):
        fill(["a"], 10, np.empty(1, dtype=np.int32))
    with pytest.raises(ValueError, match="out holds 2 items, keys 1"):
        fill(["a"], 10, np.empty(2, dtype=np.int64))
    with pytest.raises(TypeError, match="sequence of str"):
        fill(5, 10, np.empty(1, dtype=np.int64))
