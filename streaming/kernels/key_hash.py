"""A 64-bit hash of each row's key, equal for equal keys in whichever process it is computed: the
tasks of an upsert batch route every version of a key to one reducer by it (streaming/write/versions.py).

Arrow's hash kernels are not exposed to Python, and pandas' `hash_array` builds a Python object per
string (1.1 s for a million short keys, measured here); this reads the Arrow buffers with numpy.
A text or binary value hashes its bytes as a polynomial (each byte weighted by a power of an odd
constant by its place in the value, summed modulo 2^64, with the length mixed in); fixed-width
values hash their 64-bit pattern; columns combine in order. Every value ends in the splitmix64
finaliser, so the low bits spread keys over buckets evenly. Only routing depends on the hash: two
keys that collide meet in one reducer, which still tells them apart by value.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_BYTE_WEIGHT = np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime
_LENGTH_WEIGHT = np.uint64(0x9E3779B97F4A7C15)
_COLUMN_WEIGHT = np.uint64(0xC2B2AE3D27D4EB4F)


def key_hashes(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """One uint64 per row over all `columns` (of equal length); a null hashes as a value of its own."""
    if not columns:
        raise ValueError("key_hashes: no key columns")
    combined: np.ndarray | None = None
    for column in columns:
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        hashed = _column_hashes(array)
        combined = hashed if combined is None else _mix(combined * _COLUMN_WEIGHT + hashed)
    assert combined is not None
    return combined


def _column_hashes(array: pa.Array) -> np.ndarray:
    kind = array.type
    if pa.types.is_dictionary(kind):
        array = array.dictionary_decode()
        kind = array.type
    if pa.types.is_decimal(kind):
        # A decimal key is exact: its digits as text hash alike whatever its width.
        array, kind = pc.cast(array, pa.string()), pa.string()
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_fixed_size_binary(kind):
        array = array.cast(pa.large_binary() if pa.types.is_large_string(kind) else pa.binary())
        kind = array.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        hashed = _bytes_hashes(array)
    elif pa.types.is_floating(kind):
        values = array.cast(pa.float64()).to_numpy(zero_copy_only=False)
        values = np.where(values == 0.0, 0.0, values)  # -0.0 equals 0.0 as a key
        hashed = _mix(values.view(np.uint64).copy())
    elif pa.types.is_boolean(kind):
        hashed = _mix(array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64))
    elif pa.types.is_integer(kind) or pa.types.is_temporal(kind):
        hashed = _mix(_as_int64(array).view(np.uint64).copy())
    else:
        raise TypeError(f"key_hashes: a key column of type {kind} cannot be hashed")
    if array.null_count:
        hashed[array.is_null().to_numpy(zero_copy_only=False)] = _NULL_HASH
    return hashed


_NULL_HASH = np.uint64(0x5BD1E9955BD1E995)


def _as_int64(array: pa.Array) -> np.ndarray:
    if pa.types.is_temporal(array.type):
        width = array.type.bit_width
        array = array.view(pa.int64() if width == 64 else pa.int32())
    return array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)


def _bytes_hashes(array: pa.Array) -> np.ndarray:
    n = len(array)
    large = pa.types.is_large_binary(array.type)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if large else np.int32)[
        array.offset : array.offset + n + 1
    ].astype(np.int64)
    data_buffer = array.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    start, stop = int(offsets[0]), int(offsets[-1])
    lengths = np.diff(offsets)
    if stop > start:
        place = np.arange(stop - start, dtype=np.int64) - np.repeat(offsets[:-1] - start, lengths)
        weights = np.cumprod(np.full(int(lengths.max()), _BYTE_WEIGHT, dtype=np.uint64))
        terms = (data[start:stop].astype(np.uint64) + np.uint64(1)) * weights[place]
        sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(terms, dtype=np.uint64)])
        polynomial = sums[offsets[1:] - start] - sums[offsets[:-1] - start]
    else:
        polynomial = np.zeros(n, np.uint64)
    return _mix(polynomial ^ (lengths.astype(np.uint64) * _LENGTH_WEIGHT))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, over uint64 with wrap-around."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x
