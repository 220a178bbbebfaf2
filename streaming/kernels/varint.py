"""Base-128 variable-length integers (Avro's and Protobuf's), many at once: the 8 bytes at each
integer's start read as one little-endian word, the bytes that end it found by their clear high
bits, and the 7-bit groups packed together with shifts, a few numpy operations for any count."""

from __future__ import annotations

import numpy as np

_HIGH_BITS = np.uint64(0x8080808080808080)
_LOW_BITS = np.uint64(0x7F7F7F7F7F7F7F7F)
_GROUPS = [np.uint64(0x7F << (7 * i)) for i in range(8)]
_ONE = np.uint64(1)
_ALL = np.uint64(2**64 - 1)


def words_at(data: np.ndarray) -> np.ndarray:
    """Every position of `data` (uint8) as the little-endian uint64 of the 8 bytes from it, a view
    without a copy (positions within 8 bytes of the end are left out: pad the data)."""
    return np.ndarray((max(len(data) - 7, 0),), dtype="<u8", buffer=data, strides=(1,))


def varints(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The integer that starts each word, as uint64, and its length in bytes: 1 to 8, or 0 for an
    integer longer than 8 bytes (over 56 bits), whose value here is not read."""
    stops = ~words & _HIGH_BITS
    lowest = stops & (~stops + _ONE)
    longer = lowest == 0
    n_bytes = (np.log2(np.where(longer, _ONE, lowest).astype(np.float64)).astype(np.int64) + 1) // 8
    n_bytes[longer] = 0
    keep = np.where(n_bytes == 8, _ALL, (_ONE << (8 * n_bytes).astype(np.uint64)) - _ONE)
    groups = words & keep & _LOW_BITS
    raw = groups & _GROUPS[0]
    for i in range(1, 8):
        raw |= (groups >> np.uint64(i)) & _GROUPS[i]
    return raw, n_bytes


def unzigzag(raw: np.ndarray) -> np.ndarray:
    """Zigzag-encoded integers (0, -1, 1, -2, ... as 0, 1, 2, 3, ...) as int64."""
    return (raw >> _ONE).astype(np.int64) ^ -(raw & _ONE).astype(np.int64)
