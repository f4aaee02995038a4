"""Key schemes: known vectors worked out by hand, Netherite's published examples, properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.engine.keys import (
    MAX_COUNT,
    SCHEMES,
    fnv1a_32,
    get_scheme,
    java_string_hash,
    multiply_shift,
    suffix_index,
    xxh3_hashes,
)

netherite = get_scheme("netherite")
akka = get_scheme("akka")
apportion = get_scheme("apportion")


# --- FNV-1a-32, by hand ---------------------------------------------------------------------------


def test_fnv1a_empty_input_is_the_offset_basis() -> None:
    # No byte is processed, so the hash is the offset basis 2166136261 = 0x811C9DC5.
    assert fnv1a_32(b"") == 0x811C9DC5


def test_fnv1a_of_a_single_byte_worked_by_hand() -> None:
    # h = 0x811C9DC5 ^ 0x61 ('a')              = 0x811C9DA4
    # h * 0x01000193 = h<<24 + h*0x193:
    #   (h << 24) mod 2^32                     = 0xA4000000
    #   h * 0x193 = 2166136228 * 403           = 872952899884 = 0xCB_400C292C
    #   (0xA4000000 + 0xCB400C292C) mod 2^32   = 0xE40C292C
    assert fnv1a_32(b"a") == 0xE40C292C


def test_fnv1a_published_vector() -> None:
    # The FNV reference test suite lists FNV-1a-32("foobar") = 0xbf9cf968.
    assert fnv1a_32(b"foobar") == 0xBF9CF968


# --- Java String.hashCode, by hand ----------------------------------------------------------------


def test_java_hash_code_worked_by_hand() -> None:
    # "abc": ((97*31) + 98)*31 + 99 = 97*961 + 98*31 + 99 = 93217 + 3038 + 99 = 96354.
    assert java_string_hash("abc") == 96354
    # "Aa" and "BB" are Java's classic collision: 65*31+97 = 66*31+66 = 2112.
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    # An astral character is two UTF-16 code units (U+1F600 = D83D DE00):
    # 0xD83D*31 + 0xDE00 = 55357*31 + 56832 = 1716067 + 56832 = 1772899.
    assert java_string_hash("\U0001f600") == 1772899
    assert java_string_hash("") == 0


def test_java_hash_code_wraps_to_signed_32_bits() -> None:
    # "polygenelubricants".hashCode() is the famous Integer.MIN_VALUE.
    assert java_string_hash("polygenelubricants") == -(2**31)


def test_akka_unit_is_abs_of_java_remainder() -> None:
    # Java: Integer.MIN_VALUE % 1000 == -648 (the sign of the dividend), abs → 648.
    assert akka.unit("polygenelubricants", 1000) == 648
    # "hello".hashCode() = 99162322; 99162322 % 1000 = 322.
    assert java_string_hash("hello") == 99162322
    assert akka.unit("hello", 1000) == 322


def test_akka_negative_hash_keeps_java_semantics() -> None:
    key = next(k for k in (f"entity-{i}" for i in range(1000)) if java_string_hash(k) < 0)
    h = java_string_hash(key)
    java_remainder = -((-h) % 7)  # Java's % truncates toward zero
    assert akka.unit(key, 7) == abs(java_remainder)


# --- Netherite: the seed document's examples ------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "partitions", "expected"),
    [
        ("54f5430d-7b0a-4145-a33e-2949d44b0eea!0", 12, 0),
        ("customer-order-9027403995!7", 8, 7),
        ("customer-order-9027403995!7", 16, 7),
        ("customer-order-9027403995!7", 4, 3),
        ("mykey!7", 8, 7),
        ("!7", 8, 7),
        ("!07", 8, 7),
        ("@counter@mykey!07", 12, 7),
    ],
)
def test_netherite_explicit_placement(key: str, partitions: int, expected: int) -> None:
    assert netherite.unit(key, partitions) == expected


@pytest.mark.parametrize("partitions", [1, 3, 4, 12, 32])
def test_netherite_suffix_222_co_locates_entities_and_orchestrations(partitions: int) -> None:
    keys = ["@cart@user-1!222", "order-77!222", "!222", "x!y!222"]
    assert {netherite.unit(k, partitions) for k in keys} == {222 % partitions}


def test_netherite_hashes_ids_without_a_valid_suffix() -> None:
    for key in ["plain", "a!", "a!-1", "a!+1", "a!1.5", "a! 1", "a!4294967296", "a!\u0663"]:
        assert netherite.unit(key, 12) == fnv1a_32(key.encode()) % 12


def test_suffix_bounds() -> None:
    assert suffix_index("x!4294967295") == 4294967295  # uint32 max still counts
    assert suffix_index("x!4294967296") is None
    assert suffix_index("x!0000000000000000000000007") == 7
    assert suffix_index("x!" + "9" * 5000) is None  # no int() of a huge literal
    assert suffix_index("x!1!z") is None  # only the text after the LAST '!'


def test_netherite_hashes_utf8_bytes() -> None:
    assert netherite.unit("héllo", 1000) == fnv1a_32("héllo".encode()) % 1000


# --- apportion: multiply-shift, suffix override ---------------------------------------------------


def test_apportion_suffix_override() -> None:
    assert apportion.unit("customer-order-9027403995!7", 4) == 3
    assert apportion.unit("!07", 8) == 7


def test_multiply_shift_matches_big_integer_arithmetic() -> None:
    hashes = np.array([0, 1, 2**63, 2**64 - 1, 0xDEADBEEFCAFEBABE], dtype=np.uint64)
    for count in (1, 2, 3, 1000, MAX_COUNT):
        expected = [(int(h) * count) >> 64 for h in hashes]
        assert multiply_shift(hashes, count).tolist() == expected


def test_count_out_of_range_is_rejected() -> None:
    for scheme in SCHEMES.values():
        with pytest.raises(ValueError, match="count"):
            scheme.unit("x", 0)
        with pytest.raises(ValueError, match="count"):
            scheme.units(["x"], MAX_COUNT + 1)


def test_unknown_scheme() -> None:
    with pytest.raises(ValueError, match="unknown key scheme 'md5'"):
        get_scheme("md5")


def test_lone_surrogates_are_hashed_like_dotnet_and_java() -> None:
    # .NET's UTF-8 encoder writes U+FFFD for a lone surrogate; Java hashes the code unit itself.
    assert netherite.unit("a\ud800", 1000) == fnv1a_32("a\ufffd".encode()) % 1000
    assert java_string_hash("\ud800") == 0xD800
    for scheme in SCHEMES.values():
        keys = ["a\ud800", "\udfff!3", "ok"]
        assert scheme.units(keys, 97).tolist() == [scheme.unit(k, 97) for k in keys]


# --- properties -----------------------------------------------------------------------------------

ids = st.text(max_size=40) | st.from_regex(r"[a-z@]{0,8}![0-9]{1,12}", fullmatch=True)
counts = st.integers(min_value=1, max_value=MAX_COUNT) | st.integers(min_value=1, max_value=64)


@settings(max_examples=300)
@given(key=ids, count=counts)
def test_units_are_in_range_and_deterministic(key: str, count: int) -> None:
    for scheme in SCHEMES.values():
        unit = scheme.unit(key, count)
        assert 0 <= unit < count
        assert scheme.unit(key, count) == unit


@settings(max_examples=100)
@given(keys=st.lists(ids, max_size=60), count=counts)
def test_batched_equals_single(keys: list[str], count: int) -> None:
    for scheme in SCHEMES.values():
        batch = scheme.units(keys, count)
        assert batch.dtype == np.int64
        assert batch.tolist() == [scheme.unit(k, count) for k in keys]


@settings(max_examples=300)
@given(key=st.text(max_size=40).filter(lambda k: suffix_index(k) is None), n=counts)
def test_apportion_doubling_splits_each_unit_in_two(key: str, n: int) -> None:
    if 2 * n > MAX_COUNT:
        n //= 2
    assert apportion.unit(key, 2 * n) // 2 == apportion.unit(key, n)


def test_apportion_units_are_contiguous_hash_ranges() -> None:
    # Sorting keys by hash sorts them by unit: each unit is one contiguous range.
    keys = [f"k{i}" for i in range(2000)]
    hashes = xxh3_hashes(keys)
    units = apportion.units(keys, 37)[np.argsort(hashes)]
    assert np.all(np.diff(units) >= 0)
