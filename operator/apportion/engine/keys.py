"""Key schemes: which unit (partition, shard) an ID belongs to.

Three schemes, each with a single-key path and a batched numpy path that give identical results:

- ``netherite``: Netherite's partition function — an ID whose text after its last ``!`` is an
  unsigned 32-bit decimal integer ``n`` goes to ``n mod p``; any other ID to
  ``FNV-1a-32(UTF-8 bytes of the ID) mod p`` (Netherite ``Fnv1aHashHelper``).
- ``akka``: Akka's default shard extractor ``abs(id.hashCode % n)`` with Java's 32-bit
  ``String.hashCode`` over UTF-16 code units (``s[0]·31^(k-1) + … + s[k-1]``, wrapping).
- ``apportion`` (default): xxh3-64 of the UTF-8 bytes reduced by multiply-shift
  ``(h · n) >> 64`` (Lemire, "A fast alternative to the modulo reduction", 2016), so unit ``u``
  owns the contiguous hash range ``[u·2⁶⁴/n, (u+1)·2⁶⁴/n)`` and doubling ``n`` splits every unit
  ``u`` into ``2u`` and ``2u+1``. The ``!n`` suffix pins an ID to ``n mod count`` as in Netherite
  (explicit co-location); pinned IDs do not follow the split rule.

:data:`SCHEMES` runs on the optional C kernel ``apportion.engine._keys`` (xxhash compiled in
from the system's header) when it is installed — :data:`NATIVE` says so — and on the Python
path of :data:`PURE_SCHEMES` otherwise; both give the same units bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Final, Protocol

import numpy as np
import xxhash

_native: ModuleType | None
try:
    import apportion.engine._keys as _native
except ImportError:  # installed from the sdist without a C compiler or libxxhash-dev
    _native = None

__all__ = [
    "DEFAULT_SCHEME",
    "MAX_COUNT",
    "NATIVE",
    "PURE_SCHEMES",
    "SCHEMES",
    "KeyScheme",
    "fnv1a_32",
    "get_scheme",
    "java_string_hash",
    "multiply_shift",
    "suffix_index",
    "xxh3_hashes",
]

MAX_COUNT: Final = 2**31 - 1
"""Largest unit count any scheme accepts (Akka's shard count is a Java ``int``)."""

NATIVE: Final = _native is not None
"""Whether :data:`SCHEMES` run on the C kernel (else on the Python path)."""

_UINT32_MAX: Final = 0xFFFFFFFF
_FNV_OFFSET: Final = 0x811C9DC5
_FNV_PRIME: Final = 0x01000193
_MASK32: Final = np.uint64(0xFFFFFFFF)
_SHIFT32: Final = np.uint64(32)

_xxh3_64: Final = xxhash.xxh3_64_intdigest


class KeyScheme(Protocol):
    """Maps an ID to one of ``count`` units (0-based)."""

    name: str

    def unit(self, key: str, count: int) -> int:
        """The unit of one ID."""
        ...

    def units(self, keys: Sequence[str], count: int) -> np.ndarray:
        """The units of many IDs at once (int64 array, same order as ``keys``)."""
        ...


def _check_count(count: int) -> None:
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"count must be between 1 and {MAX_COUNT}, got {count}")


def suffix_index(key: str) -> int | None:
    """The ``n`` of an ID ending in ``!n`` (n an unsigned 32-bit decimal integer), else None.

    Only ASCII digits count (``!07`` → 7; ``!-1``, ``!+1``, ``!٣`` and ``!4294967296`` do not).
    """
    bang = key.rfind("!")
    if bang < 0:
        return None
    tail = key[bang + 1 :]
    if not tail or not tail.isascii() or not tail.isdigit():
        return None
    # Strip leading zeros before the length check so that int() never sees a huge literal.
    digits = tail.lstrip("0") or "0"
    if len(digits) > 10:
        return None
    value = int(digits)
    return value if value <= _UINT32_MAX else None


def _utf8(key: str) -> bytes:
    """UTF-8 bytes as .NET's ``Encoding.UTF8`` produces them (lone surrogates → U+FFFD)."""
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError:
        repaired = key.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return repaired.encode("utf-8")


def _utf16_units(key: str) -> bytes:
    """UTF-16LE code units of ``key``, as Java's ``String`` stores it (surrogates kept)."""
    return key.encode("utf-16-le", "surrogatepass")


def fnv1a_32(data: bytes) -> int:
    """FNV-1a, 32-bit (Fowler-Noll-Vo; offset basis 2166136261, prime 16777619)."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _UINT32_MAX
    return h


def java_string_hash(key: str) -> int:
    """Java's ``String.hashCode``: ``h = 31·h + c`` over UTF-16 code units, signed 32-bit."""
    units = key.encode("ascii") if key.isascii() else memoryview(_utf16_units(key)).cast("H")
    h = 0
    for code in units:
        h = (31 * h + code) & _UINT32_MAX
    return h - (1 << 32) if h & 0x80000000 else h


def xxh3_hashes(keys: Sequence[str]) -> np.ndarray:
    """xxh3-64 of each key's UTF-8 bytes, as uint64 (one C call per key, no Python loop)."""
    try:
        encoded: Iterable[bytes] = map(str.encode, keys)
        return np.fromiter(map(_xxh3_64, encoded), dtype=np.uint64, count=len(keys))
    except UnicodeEncodeError:
        encoded = map(_utf8, keys)
        return np.fromiter(map(_xxh3_64, encoded), dtype=np.uint64, count=len(keys))


def multiply_shift(hashes: np.ndarray, count: int) -> np.ndarray:
    """``(h · count) >> 64`` for an array of uint64 hashes, exactly, without 128-bit integers.

    With ``h = hi·2³² + lo``: ``(h·count) >> 64 = (hi·count + (lo·count >> 32)) >> 32``; both
    products fit in 64 bits for ``count < 2³²`` and so does their sum.
    """
    _check_count(count)
    h = np.asarray(hashes, dtype=np.uint64)
    c = np.uint64(count)
    hi = h >> _SHIFT32
    lo = h & _MASK32
    return ((hi * c + ((lo * c) >> _SHIFT32)) >> _SHIFT32).astype(np.int64)


_PAD_BUDGET: Final = 1 << 24
"""Most code units one padded block may hold (bounds memory when a few keys are very long)."""


def _columnwise(
    encoded: list[bytes],
    dtype: type[np.unsignedinteger],
    init: int,
    step: Callable[[np.ndarray, np.ndarray], None],
) -> np.ndarray:
    """Runs a code-unit-at-a-time hash over many keys at once, one vector step per position.

    Keys are cut into blocks of at most ``_PAD_BUDGET`` padded code units; in a block, keys are
    sorted longest first so that the keys still running at position ``j`` are a prefix, and the
    steps run in place on contiguous columns.
    """
    n = len(encoded)
    unit = np.dtype(dtype).newbyteorder("<")
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=n) // unit.itemsize
    out = np.empty(n, dtype=np.uint32)
    pending = [(0, n)] if n else []
    while pending:
        lo, hi = pending.pop()
        lens = lengths[lo:hi]
        longest = int(lens.max())
        if hi - lo > 1 and longest * (hi - lo) > _PAD_BUDGET:
            mid = (lo + hi) // 2
            pending += [(lo, mid), (mid, hi)]
            continue
        if not longest:
            out[lo:hi] = init
            continue
        padded = np.array(encoded[lo:hi], dtype=f"S{longest * unit.itemsize}")
        rows = padded.view(unit).reshape(hi - lo, longest)
        order = np.argsort(-lens, kind="stable")
        columns = np.ascontiguousarray(rows[order].T)
        # running[j] = how many keys of the block are longer than j.
        running = np.searchsorted(-lens[order], -np.arange(longest), side="left")
        h = np.full(hi - lo, init, dtype=np.uint32)
        for j in range(longest):
            k = int(running[j])
            step(h[:k], columns[j, :k])
        out[lo + order] = h
    return out


def _utf8_all(keys: Sequence[str]) -> list[bytes]:
    try:
        return list(map(str.encode, keys))
    except UnicodeEncodeError:
        return [_utf8(k) for k in keys]


def _fnv_step(h: np.ndarray, c: np.ndarray) -> None:
    np.bitwise_xor(h, c, out=h)
    np.multiply(h, np.uint32(_FNV_PRIME), out=h)


def _java_step(h: np.ndarray, c: np.ndarray) -> None:
    np.multiply(h, np.uint32(31), out=h)
    np.add(h, c, out=h)


def _suffix_overrides(keys: Sequence[str]) -> list[tuple[int, int]]:
    """(position, n) of every key with a ``!n`` suffix; one C-speed scan when there are none."""
    if "!" not in "".join(keys):
        return []
    found = []
    for i, key in enumerate(keys):
        if "!" in key:
            n = suffix_index(key)
            if n is not None:
                found.append((i, n))
    return found


class NetheriteScheme:
    """Netherite's partition function (``!n`` suffix, else FNV-1a-32 of the UTF-8 bytes)."""

    name = "netherite"

    def unit(self, key: str, count: int) -> int:
        _check_count(count)
        n = suffix_index(key)
        if n is None:
            n = fnv1a_32(_utf8(key))
        return n % count

    def units(self, keys: Sequence[str], count: int) -> np.ndarray:
        _check_count(count)
        if not keys:
            return np.empty(0, dtype=np.int64)
        hashes = _columnwise(_utf8_all(keys), np.uint8, _FNV_OFFSET, _fnv_step)
        result = hashes.astype(np.int64)
        for i, n in _suffix_overrides(keys):
            result[i] = n
        return result % count


class AkkaScheme:
    """Akka's default extractor ``abs(javaStringHashCode(id) % n)``."""

    name = "akka"

    def unit(self, key: str, count: int) -> int:
        _check_count(count)
        # Java's % keeps the dividend's sign, so abs(h % n) == abs(h) % n.
        return abs(java_string_hash(key)) % count

    def units(self, keys: Sequence[str], count: int) -> np.ndarray:
        _check_count(count)
        if not keys:
            return np.empty(0, dtype=np.int64)
        if "".join(keys).isascii():  # ASCII code units are the UTF-16 code units
            hashes = _columnwise(list(map(str.encode, keys)), np.uint8, 0, _java_step)
        else:
            hashes = _columnwise([_utf16_units(k) for k in keys], np.uint16, 0, _java_step)
        return np.abs(hashes.view(np.int32).astype(np.int64)) % count


class ApportionScheme:
    """xxh3-64 + multiply-shift (contiguous ranges, doubling splits), ``!n`` suffix override."""

    name = "apportion"

    def unit(self, key: str, count: int) -> int:
        if not 1 <= count <= MAX_COUNT:  # tested inline: this is the per-message hot path
            _check_count(count)
        if "!" in key:
            n = suffix_index(key)
            if n is not None:
                return n % count
        try:
            data = key.encode()
        except UnicodeEncodeError:
            data = _utf8(key)
        return (_xxh3_64(data) * count) >> 64

    def units(self, keys: Sequence[str], count: int) -> np.ndarray:
        _check_count(count)
        result = multiply_shift(xxh3_hashes(keys), count)
        for i, n in _suffix_overrides(keys):
            result[i] = n % count
        return result


class NativeScheme:
    """A scheme on the C kernel: one C call per key (``unit``) or per batch (``units``), with
    the results of its Python twin in :data:`PURE_SCHEMES`."""

    def __init__(self, name: str) -> None:
        self.name = name
        # A builtin function is no descriptor: ``scheme.unit(key, n)`` calls C with no frame.
        self.unit = getattr(_native, f"{name}_unit")
        self._fill = getattr(_native, f"{name}_units")

    def units(self, keys: Sequence[str], count: int) -> np.ndarray:
        out = np.empty(len(keys), dtype=np.int64)
        self._fill(keys, count, out)
        return out


PURE_SCHEMES: Final[dict[str, KeyScheme]] = {
    scheme.name: scheme for scheme in (NetheriteScheme(), AkkaScheme(), ApportionScheme())
}
SCHEMES: Final[dict[str, KeyScheme]] = (
    {name: NativeScheme(name) for name in PURE_SCHEMES} if NATIVE else PURE_SCHEMES
)
DEFAULT_SCHEME: Final = "apportion"


def get_scheme(name: str = DEFAULT_SCHEME) -> KeyScheme:
    """The key scheme called ``name`` (``netherite``, ``akka`` or ``apportion``)."""
    try:
        return SCHEMES[name]
    except KeyError:
        known = ", ".join(sorted(SCHEMES))
        raise ValueError(f"unknown key scheme {name!r} (known: {known})") from None
