"""One cursor per record over a batch's bytes, every value of a field read for all records at once
with numpy: variable-length integers (Avro's zigzag ones and Protobuf's plain ones), values of a
fixed size, byte strings gathered into an Arrow array. A record that does not match is flagged with
the fault and its cursor moved to its end; no Python code runs per record."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from streaming.kernels.varint import unzigzag, varints, words_at

PAD = 16  # zero bytes after the data, so a gather of up to 10 bytes past a cursor never overruns
_VARINT_BYTES = np.arange(10)
_SHIFTS = (7 * np.arange(10)).astype(np.uint64)


class Cursors:
    """The records of a batch: `data` holds record i at [pos[i], end[i]); `bad[i]` and `detail[i]`
    say whether and why it does not match what it was read as."""

    def __init__(self, data: np.ndarray, pos: np.ndarray, end: np.ndarray):
        self.data = np.concatenate([data, np.zeros(PAD, dtype=np.uint8)])
        self.pos = pos.astype(np.int64).copy()
        self.end = end.astype(np.int64)
        n = len(pos)
        self.bad = np.zeros(n, dtype=bool)
        self.detail = np.full(n, None, dtype=object)
        self._words = words_at(self.data)
        self._f4_at = np.ndarray((len(self.data) - 3,), dtype="<f4", buffer=self.data, strides=(1,))
        self._f8_at = np.ndarray((len(self.data) - 7,), dtype="<f8", buffer=self.data, strides=(1,))

    def _nothing_left(self) -> None:
        """Flags the records with bytes after their last field."""
        left = ~self.bad & (self.pos != self.end)
        for i in np.flatnonzero(left):
            self.detail[i] = f"{int(self.end[i] - self.pos[i])} bytes after the record's last field"
        self.bad |= left

    def _fail(self, sel: np.ndarray, mask: np.ndarray, message: str) -> None:
        idx = sel[mask]
        fresh = idx[~self.bad[idx]]
        self.bad[fresh] = True
        self.detail[fresh] = message
        self.pos[idx] = self.end[idx]

    def _varint(self, sel: np.ndarray, what: str, zigzag: bool = True) -> np.ndarray:
        """A variable-length integer at each cursor: zigzag-encoded (Avro's, Protobuf's sint) or
        plain (Protobuf's other integers, whose negatives are their 64-bit two's complement)."""
        p = self.pos[sel]
        first = self.data[p]
        if not (first >= 0x80).any():  # one byte each: most lengths, counts, branches, small numbers
            length = np.ones(len(sel), dtype=np.int64)
            value = first.astype(np.int64)
            if zigzag:
                value = (value >> 1) ^ -(value & 1)
        else:
            raw, length = varints(self._words[p])
            longer = np.flatnonzero(length == 0)
            if longer.size:
                raw[longer], length[longer] = self._long_varints(p[longer])
            value = unzigzag(raw) if zigzag else raw.view(np.int64)
        after = p + length
        over = after > self.end[sel]
        if over.any():
            self._fail(sel, over, f"{what}: the record ends inside a variable-length integer")
            self.pos[sel[~over]] = after[~over]
        else:
            self.pos[sel] = after
        return value

    def _long_varints(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Integers of 9 or 10 bytes (Protobuf's negative int64s), and 11 for more: no integer."""
        b = self.data[p[:, None] + _VARINT_BYTES]
        term = b < 0x80
        n_bytes = np.where(term.any(axis=1), term.argmax(axis=1) + 1, 11)
        raw = np.zeros(p.size, dtype=np.uint64)
        for k in range(10):
            raw |= np.where(k < n_bytes, (b[:, k] & 0x7F).astype(np.uint64) << _SHIFTS[k], np.uint64(0))
        return raw, n_bytes

    def _floats(self, sel: np.ndarray, size: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """A little-endian float (size 4) or double (8) at each cursor, and which fit."""
        p, fits = self._fixed(sel, size, what)
        view = self._f4_at if size == 4 else self._f8_at
        return np.where(fits, view[p], 0), fits

    def _fixed(self, sel: np.ndarray, size: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """Start of `size` bytes at each cursor (the cursor moves past them), and which fit."""
        p = self.pos[sel]
        after = p + size
        fits = after <= self.end[sel]
        if fits.all():
            self.pos[sel] = after
        else:
            self._fail(sel, ~fits, f"{what}: the record ends inside its {size} bytes")
            self.pos[sel[fits]] = after[fits]
        return p, fits

    def _sized(self, sel: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The start and length of a length-prefixed value at each cursor, and which are whole."""
        length = self._varint(sel, what)
        ok = ~self.bad[sel]
        negative = ok & (length < 0)
        self._fail(sel, negative, f"{what}: negative length {length[negative][:1]}")
        ok &= ~negative
        p = self.pos[sel]
        over = ok & (p + length > self.end[sel])
        self._fail(sel, over, f"{what}: a length of {length[over][:1]} bytes runs past the record's end")
        ok &= ~over
        self.pos[sel[ok]] = p[ok] + length[ok]
        return p, length, ok

    def _binary(self, start: np.ndarray, length: np.ndarray, valid: np.ndarray) -> pa.Array:
        offsets = np.zeros(len(start) + 1, dtype=np.int64)
        np.cumsum(length, out=offsets[1:])
        total = int(offsets[-1])
        gather = np.repeat(start - offsets[:-1], length) + np.arange(total)
        data = self.data[gather]
        if total < 2**31:
            return pa.Array.from_buffers(
                pa.binary(),
                len(start),
                [pa.array(valid).buffers()[1], pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
                null_count=int((~valid).sum()),
            )
        return pa.Array.from_buffers(  # pragma: no cover - a batch over 2 GiB of strings
            pa.large_binary(),
            len(start),
            [pa.array(valid).buffers()[1], pa.py_buffer(offsets), pa.py_buffer(data)],
            null_count=int((~valid).sum()),
        ).cast(pa.binary())
