"""Hexadecimal and base64 texts to bytes, over a whole Arrow array at once: WKB sent as text
(json_fields), bytea columns of Debezium events, UUIDs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming.kernels.buffers import offsets_and_bytes

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
_B64 = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"):
    _B64[_c] = _i
_PAD = 64
_B64[ord("=")] = _PAD


def _per_row(flags: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """How many of each row's bytes are flagged."""
    counts = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
    return counts[offsets[1:]] - counts[offsets[:-1]]


def _binary(lengths: np.ndarray, data: np.ndarray) -> pa.Array:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.Array.from_buffers(
        pa.binary(), len(lengths), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data.tobytes())]
    )


def _spans(texts: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each text's offsets into its bytes (from 0), the bytes, and the lengths (a null: empty)."""
    values = pc.fill_null(texts.cast(pa.binary()), b"")
    offsets, data = offsets_and_bytes(values)
    data = data[offsets[0] : offsets[-1]] if data.size else np.zeros(0, np.uint8)
    offsets = (offsets - offsets[0]).astype(np.int64)
    return offsets, data, np.diff(offsets)


def hex_decode(texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Bytes of hexadecimal texts (either case), and which texts were hexadecimal (others: empty)."""
    if len(texts) == 0:
        return pa.array([], pa.binary()), np.zeros(0, dtype=bool)
    offsets, data, lengths = _spans(texts)
    nibbles = _HEX[data]
    ok = (lengths % 2 == 0) & (lengths > 0) & (_per_row(nibbles == 255, offsets) == 0)
    keep = np.repeat(ok, lengths)
    good = nibbles[keep]
    decoded = (good[0::2] << 4) | good[1::2]
    return _binary(np.where(ok, lengths // 2, 0), decoded.astype(np.uint8)), ok


def base64_decode(texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Bytes of base64 texts (standard alphabet, padded), and which texts were base64 (others: empty)."""
    if len(texts) == 0:
        return pa.array([], pa.binary()), np.zeros(0, dtype=bool)
    offsets, data, lengths = _spans(texts)
    sextets = _B64[data]
    pads = _per_row(sextets == _PAD, offsets)
    # padding only as the last one or two characters
    padded = np.concatenate([sextets == _PAD, [False, False]])
    last, before_last = padded[np.maximum(offsets[1:] - 1, 0)], padded[np.maximum(offsets[1:] - 2, 0)]
    pads_at_end = (pads == 0) | ((pads == 1) & last) | ((pads == 2) & last & before_last)
    ok = (lengths % 4 == 0) & (lengths > 0) & (_per_row(sextets == 255, offsets) == 0) & pads_at_end
    good = sextets[np.repeat(ok, lengths)].astype(np.uint32)
    good[good == _PAD] = 0
    quads = good.reshape(-1, 4)
    word = (quads[:, 0] << 18) | (quads[:, 1] << 12) | (quads[:, 2] << 6) | quads[:, 3]
    triples = np.column_stack([(word >> 16) & 0xFF, (word >> 8) & 0xFF, word & 0xFF]).astype(np.uint8).ravel()
    full = np.where(ok, lengths // 4 * 3, 0)
    out_lengths = np.where(ok, full - pads, 0)
    # drop each row's padding bytes, the last `pads` of its full triples
    position_in_row = np.arange(triples.size) - np.repeat(np.concatenate([[0], np.cumsum(full)[:-1]]), full)
    keep = position_in_row < np.repeat(out_lengths, full)
    return _binary(out_lengths, triples[keep]), ok
