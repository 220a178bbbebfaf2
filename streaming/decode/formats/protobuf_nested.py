"""Protobuf messages of any schema without recursion, read column by column as the flat Protobuf
reader reads its flat ones: nested messages, repeated fields (packed or not), maps, enums, oneof
members and the well-known Timestamp, Duration and wrapper types, for all records of a batch at once.

A message is read as the flat reader reads one: every record's next field tag at once, then the
value of each field number for the records that have it, until every record is read. A field
whose value is a message keeps where that value's bytes are; once its message is read, those bytes
are read as messages of the field's type, the same way, one level down (a message field written
twice is the two parts read as one, as Protobuf merges them). A repeated field's values are items
of their record in the order they came, however they were written (packed or one by one); a map's
entries are messages of a key and a value, kept in key order, the last of a key winning. The values
come out as the general reader's (streaming/decode/formats/protobuf.py) do, as Arrow: a message a
struct, a repeated field a list, a map a map, an enum its value's name (its digits when the enum
names no value of that number), a Timestamp an instant in microseconds, a Duration its
microseconds, a wrapper its value; a field with presence that is not set is null, a plain proto3
field absent its default.

Which message types it reads, and the Arrow type of each: streaming/decode/formats/protobuf_shape.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming.decode.formats.avro_nested import NestedReader, NestedSchema, spread
from streaming.decode.formats.binary_cursors import Cursors
from streaming.decode.formats.protobuf_shape import MAP, REPEATED, SINGLE, WIRE_TYPE, Field, MessageShape, Value
from streaming.decode.python_values import Problem
from streaming.kernels.buffers import scatter_into
from streaming.kernels.varint import unzigzag, varints

_FIXED_DTYPE = {
    "double": "<f8",
    "float": "<f4",
    "fixed64": "<u8",
    "sfixed64": "<i8",
    "fixed32": "<u4",
    "sfixed32": "<i4",
}
_EMPTY = np.zeros(0, dtype=np.int64)
# The seconds a Timestamp (0001-01-01 to 9999-12-31) and a Duration (about 10,000 years) may hold.
_SECONDS = {"timestamp": (-62_135_596_800, 253_402_300_799), "duration": (-315_576_000_000, 315_576_000_000)}


class ProtoCursors(Cursors):
    """Cursors over the values of one message type: the records, or the values of a message field
    of the message one level up (sharing its bytes)."""

    @classmethod
    def over(cls, outer: Cursors, pos: np.ndarray, end: np.ndarray) -> ProtoCursors:
        inner = cls.__new__(cls)
        inner.data, inner._words, inner._f4_at, inner._f8_at = outer.data, outer._words, outer._f4_at, outer._f8_at
        inner.pos = pos.astype(np.int64).copy()
        inner.end = end.astype(np.int64)
        inner.bad = np.zeros(len(pos), dtype=bool)
        inner.detail = np.full(len(pos), None, dtype=object)
        return inner

    def scalars(self, encoding: str, rows: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
        """A scalar at each cursor, as its raw number (int64, or the float's or fixed value's own
        dtype), and which were read."""
        if encoding in ("varint", "zigzag"):
            value = self._varint(rows, what, zigzag=encoding == "zigzag")
            return value, ~self.bad[rows]
        return fixed_scalars(self, encoding, rows, what)


def skip_field(cursors: Cursors, rows: np.ndarray, wire: int, what: str) -> None:
    """A value of a field the schema does not name at each cursor, by its wire type (the flat
    reader's too)."""
    if wire == 0:
        cursors._varint(rows, what, zigzag=False)
    elif wire in (1, 5):
        cursors._fixed(rows, 8 if wire == 1 else 4, what)
    elif wire == 2:
        length_delimited(cursors, rows, what)
    else:
        cursors._fail(rows, np.ones(rows.size, dtype=bool), f"{what}: wire type {wire} (groups) is not supported")


def length_delimited(cursors: Cursors, rows: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A length-delimited value at each cursor: its start, its length, and which are whole (the
    cursor moves past it)."""
    length = cursors._varint(rows, what, zigzag=False)
    ok = ~cursors.bad[rows]
    p = cursors.pos[rows]
    over = ok & ((length < 0) | (p + length > cursors.end[rows]))
    cursors._fail(rows, over, f"{what}: a length of {length[over][:1]} bytes runs past the record's end")
    ok &= ~over
    cursors.pos[rows[ok]] = p[ok] + length[ok]
    return p, length, ok


def fixed_scalars(cursors: Cursors, encoding: str, rows: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """A fixed-size scalar (double, float, [s]fixed32/64) at each cursor, in its own dtype, and
    which fit in their record."""
    p, fits = cursors._fixed(rows, np.dtype(_FIXED_DTYPE[encoding]).itemsize, what)
    return _fixed_values(cursors.data, p, fits, encoding), fits


def _fixed_values(data: np.ndarray, p: np.ndarray, fits: np.ndarray, encoding: str) -> np.ndarray:
    dtype = np.dtype(_FIXED_DTYPE[encoding])
    view = np.ndarray((len(data) - dtype.itemsize + 1,), dtype=dtype, buffer=data, strides=(1,))
    return np.where(fits, view[np.where(fits, p, 0)], 0).astype(dtype)


@dataclass
class _Collected:
    """What the passes over a message found of one field."""

    values: np.ndarray | None = None  # a single scalar: its last value per record
    present: np.ndarray | None = None
    last_pass: np.ndarray | None = None  # a oneof member: the pass of its last value per record
    starts: list[np.ndarray] = field(default_factory=list)  # bytes values and messages: each part's
    lengths: list[np.ndarray] = field(default_factory=list)
    owners: list[np.ndarray] = field(default_factory=list)  # ... and whose it is
    items: list[np.ndarray] = field(default_factory=list)  # a repeated scalar's values, in order
    packed: list[bool] = field(default_factory=list)  # whether each part of those is a packed run


def read_messages(shape: MessageShape, cursors: ProtoCursors) -> pa.StructArray:
    """The messages at the cursors (each from pos to end), as a struct array of `shape.arrow`;
    a message that does not match is flagged in `cursors.bad` (its values are left null)."""
    n = len(cursors.pos)
    found = {f.number: _Collected() for f in shape.fields}
    for f in shape.fields:
        if f.label == SINGLE and f.value.kind in ("scalar", "enum") and f.value.encoding != "len":
            found[f.number].values = np.zeros(n, dtype=_raw_dtype(f.value.encoding))
            found[f.number].present = np.zeros(n, dtype=bool)
        if f.oneof >= 0:
            found[f.number].last_pass = np.full(n, -1, dtype=np.int64)
    passes = 0
    while (fields := next_fields(cursors)) is not None:
        for key, rows in fields:
            known = shape.by_number.get(key >> 3)
            if known is None:
                skip_field(cursors, rows, key & 7, f"field {key >> 3} (not in the schema)")
                continue
            _take(known, key & 7, rows, cursors, found[known.number], passes)
        passes += 1
    _one_of_each_oneof(shape, found)
    children = [_assemble(f, found[f.number], cursors, n) for f in shape.fields]
    return pa.StructArray.from_arrays(children, fields=list(shape.arrow)) if children else _no_members(n)


def next_fields(cursors: Cursors) -> list[tuple[int, np.ndarray]] | None:
    """The next field tag of every record not read to its end (the flat reader's too): the records
    of each key (field number * 8 + wire type); None once every record is read."""
    sel = np.flatnonzero(~cursors.bad & (cursors.pos < cursors.end))
    if sel.size == 0:
        return None
    tag = cursors._varint(sel, "field tag", zigzag=False)
    ok = ~cursors.bad[sel]
    zero = ok & (tag >> 3 < 1)
    cursors._fail(sel, zero, "field number 0")
    return _by_key(tag, ok & ~zero, sel)


def _by_key(keys: np.ndarray, ok: np.ndarray, sel: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """The records of each field key (number and wire type) read in a pass: mostly one key, as
    records of one producer write their fields in one order."""
    live = keys[ok]
    if live.size and (live == live[0]).all():
        return [(int(live[0]), sel[ok])]
    # Field numbers are mostly small: counting each key is far cheaper than sorting or hashing them.
    found = (
        np.flatnonzero(np.bincount(live)) if live.size and 0 <= live.min() and live.max() < 1 << 16 else np.unique(live)
    )
    return [(int(key), sel[ok & (keys == key)]) for key in found]


def _raw_dtype(encoding: str) -> Any:
    return _FIXED_DTYPE.get(encoding, np.int64)


def _take(f: Field, wire: int, rows: np.ndarray, cursors: ProtoCursors, into: _Collected, passes: int) -> None:
    """The value of field `f` written with wire type `wire` at each of `rows`."""
    what = f"field {f.name!r}"
    value = f.value
    expected = 2 if value.kind not in ("scalar", "enum") else WIRE_TYPE[value.encoding]
    packed = f.label == REPEATED and wire == 2 and expected != 2
    if wire != expected and not packed:
        cursors._fail(
            rows, np.ones(rows.size, dtype=bool), f"{what}: wire type {wire}, its type is written as {expected}"
        )
        return
    if into.last_pass is not None:
        into.last_pass[rows] = passes
    if expected == 2 or packed:
        start, length, ok = length_delimited(cursors, rows, what)
        into.starts.append(start[ok])
        into.lengths.append(length[ok])
        into.owners.append(rows[ok])
        if f.label == REPEATED and expected != 2:
            into.items.append(_EMPTY)  # a run of values: read from its bytes once all are found
            into.packed.append(True)
        return
    raw, ok = cursors.scalars(value.encoding, rows, what)
    if f.label == SINGLE:
        assert into.values is not None and into.present is not None
        into.values[rows[ok]] = raw[ok]
        into.present[rows[ok]] = True
    else:
        into.items.append(raw[ok])
        into.owners.append(rows[ok])
        into.starts.append(_EMPTY)
        into.lengths.append(_EMPTY)
        into.packed.append(False)


def _one_of_each_oneof(shape: MessageShape, found: dict[int, _Collected]) -> None:
    """Of the members of a oneof set in a message, the last one written is the one it holds."""
    for oneof in range(shape.oneofs):
        members = [f for f in shape.fields if f.oneof == oneof]
        passes = np.stack([found[f.number].last_pass for f in members])  # type: ignore[misc]
        winner = np.argmax(passes, axis=0)
        for i, f in enumerate(members):
            lost = (passes[i] >= 0) & (winner != i)
            if lost.any():
                _drop(found[f.number], lost)


def _drop(into: _Collected, rows_mask: np.ndarray) -> None:
    """Forgets the values of a single field (a oneof member) that the rows of `rows_mask` hold."""
    if into.present is not None:
        into.present[rows_mask] = False
    keep = [~rows_mask[o] for o in into.owners]
    into.owners = [o[k] for o, k in zip(into.owners, keep, strict=True)]
    into.starts = [s[k] if s.size else s for s, k in zip(into.starts, keep, strict=True)]
    into.lengths = [s[k] if s.size else s for s, k in zip(into.lengths, keep, strict=True)]


def _assemble(f: Field, into: _Collected, cursors: ProtoCursors, n: int) -> pa.Array:
    value = f.value
    if f.label == SINGLE and into.values is not None:
        assert into.present is not None
        valid = into.present if f.presence else np.ones(n, dtype=bool)
        return _scalar_array(value, into.values, valid)
    if f.label == SINGLE:
        owners, starts, lengths = _parts(into)
        if value.kind in ("scalar", "enum"):  # string or bytes: the last value written
            last = np.full(n, -1, dtype=np.int64)
            np.maximum.at(last, owners, np.arange(owners.size))
            has = last >= 0
            pick = np.where(has, last, 0)
            start = np.where(has, starts[pick], 0) if owners.size else np.zeros(n, dtype=np.int64)
            length = np.where(has, lengths[pick], 0) if owners.size else np.zeros(n, dtype=np.int64)
            valid = has if f.presence else np.ones(n, dtype=bool)
            return _bytes_array(cursors, value.arrow, start, length, valid, np.arange(n), f"field {f.name!r}")
        if not f.presence:  # a map's message value left out: the message of no fields set
            absent = np.setdiff1d(np.arange(n), owners)
            owners = np.concatenate([owners, absent])
            starts, lengths = (
                np.concatenate([starts, np.zeros_like(absent)]),
                np.concatenate([lengths, np.zeros_like(absent)]),
            )
        inner, held = _one_part_each(cursors, owners, starts, lengths)
        messages = _messages(value, inner, held, cursors, f"field {f.name!r}")
        return _as_value(value, messages, held, n)
    items, owners = _items(f, into, cursors)
    order = np.argsort(owners, kind="stable")
    items, owners = items.take(pa.array(order)), owners[order]
    if f.label == MAP:
        items, owners = _map_entries(items, owners)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(owners, minlength=n), out=offsets[1:])
    if f.label == MAP:
        return pa.MapArray.from_arrays(pa.array(offsets), items.field(0), items.field(1), type=f.arrow)
    return pa.ListArray.from_arrays(pa.array(offsets), items, type=f.arrow)


def _parts(into: _Collected) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not into.owners:
        return _EMPTY, _EMPTY, _EMPTY
    return np.concatenate(into.owners), np.concatenate(into.starts), np.concatenate(into.lengths)


def _items(f: Field, into: _Collected, cursors: ProtoCursors) -> tuple[pa.Array, np.ndarray]:
    """Every value of a repeated field or map in the order written, and whose each is."""
    value = f.value
    what = f"field {f.name!r}"
    if value.kind not in ("scalar", "enum") or value.encoding == "len":
        owners, starts, lengths = _parts(into)
        if value.kind in ("scalar", "enum"):
            return _bytes_array(cursors, value.arrow, starts, lengths, np.ones(owners.size, bool), owners, what), owners
        messages = _messages(value, ProtoCursors.over(cursors, starts, starts + lengths), owners, cursors, what)
        return _as_value(value, messages, np.arange(owners.size), owners.size), owners
    parts_values: list[np.ndarray] = []
    parts_owners: list[np.ndarray] = []
    for items, owners, starts, lengths, packed in zip(
        into.items, into.owners, into.starts, into.lengths, into.packed, strict=True
    ):
        if packed:
            run_values, run_owners = _packed(cursors, value.encoding, owners, starts, lengths, what)
            parts_values.append(run_values)
            parts_owners.append(run_owners)
        else:
            parts_values.append(items)
            parts_owners.append(owners)
    dtype = _raw_dtype(value.encoding)
    raw = np.concatenate([v.astype(dtype) for v in parts_values]) if parts_values else np.zeros(0, dtype)
    owners = np.concatenate(parts_owners) if parts_owners else _EMPTY
    return _scalar_array(value, raw, np.ones(raw.size, dtype=bool)), owners


def _packed(
    cursors: ProtoCursors, encoding: str, owners: np.ndarray, starts: np.ndarray, lengths: np.ndarray, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """The values of packed runs (each a record's, at starts, of lengths bytes) and whose each is."""
    if encoding in ("varint", "zigzag"):
        ends = starts + lengths
        total = int(lengths.sum())
        if total == 0:
            return _EMPTY, _EMPTY
        at = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(total)
        run_of = np.repeat(np.arange(owners.size), lengths)
        last_byte = cursors.data[at] < 0x80
        # Each run ends with a byte that ends an integer, or the record does not match.
        whole = np.ones(owners.size, dtype=bool)
        nonempty = lengths > 0
        whole[nonempty] = cursors.data[ends[nonempty] - 1] < 0x80
        for i in np.flatnonzero(~whole):
            _fail_row(cursors, int(owners[i]), f"{what}: a packed run ends inside a variable-length integer")
        first = np.concatenate([[True], last_byte[:-1]]) | np.concatenate([[True], run_of[1:] != run_of[:-1]])
        begins = at[first & whole[run_of]]
        raw, taken = varints(cursors._words[begins])
        longer = np.flatnonzero(taken == 0)
        if longer.size:
            raw[longer], taken[longer] = cursors._long_varints(begins[longer])
        values = unzigzag(raw) if encoding == "zigzag" else raw.view(np.int64)
        return values, owners[run_of[first & whole[run_of]]]
    size = np.dtype(_FIXED_DTYPE[encoding]).itemsize
    whole = lengths % size == 0
    for i in np.flatnonzero(~whole):
        _fail_row(
            cursors, int(owners[i]), f"{what}: a packed run of {int(lengths[i])} bytes, not of {size}-byte values"
        )
    counts = np.where(whole, lengths // size, 0)
    total = int(counts.sum())
    at = np.repeat(starts - size * np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + size * np.arange(total)
    return _fixed_values(cursors.data, at, np.ones(total, dtype=bool), encoding), np.repeat(owners, counts)


def _fail_row(cursors: ProtoCursors, row: int, detail: str) -> None:
    if not cursors.bad[row]:
        cursors.bad[row] = True
        cursors.detail[row] = detail


def _one_part_each(
    cursors: ProtoCursors, owners: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> tuple[ProtoCursors, np.ndarray]:
    """Cursors over each record's value of a single message field, and whose each is. A field
    written more than once is its parts merged, as Protobuf merges them: read as one message, from
    a buffer of the parts put together."""
    if not owners.size or np.bincount(owners).max() == 1:
        return ProtoCursors.over(cursors, starts, starts + lengths), owners
    order = np.argsort(owners, kind="stable")
    owners, starts, lengths = owners[order], starts[order], lengths[order]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    gathered = cursors.data[np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))]
    held, first = np.unique(owners, return_index=True)
    merged = np.add.reduceat(lengths, first)
    return ProtoCursors(gathered, offsets[first], offsets[first] + merged), held


def _messages(
    value: Value, inner: ProtoCursors, owners: np.ndarray, cursors: ProtoCursors, what: str
) -> pa.StructArray:
    """The messages at `inner` (one per part) of a message-typed field; a part that does not match
    fails its owner, a record of `cursors`."""
    assert value.message is not None
    messages = read_messages(value.message, inner)
    for i in np.flatnonzero(inner.bad):
        _fail_row(cursors, int(owners[i]), f"{what}: {inner.detail[i]}")
    if value.kind in ("timestamp", "duration"):
        seconds, nanos = _seconds_and_nanos(messages)
        low, high = _SECONDS[value.kind]
        wrong = (seconds < low) | (seconds > high) | (np.abs(nanos) > 999_999_999)
        for i in np.flatnonzero(wrong):
            _fail_row(
                cursors, int(owners[i]), f"{what}: a {value.kind} of {seconds[i]} s and {nanos[i]} ns is out of range"
            )
    return messages


def _seconds_and_nanos(messages: pa.StructArray) -> tuple[np.ndarray, np.ndarray]:
    """A Timestamp's or a Duration's two fields, as int64."""
    return tuple(messages.field(i).to_numpy(zero_copy_only=False).astype(np.int64) for i in (0, 1))


def _as_value(value: Value, messages: pa.StructArray, held: np.ndarray, n: int) -> pa.Array:
    """Messages (message i that of record held[i]) as the value they stand for (a well-known
    type's), spread over the n records: null where a record holds none."""
    if value.kind in ("timestamp", "duration"):
        seconds, nanos = _seconds_and_nanos(messages)
        micros = nanos // 1000 if value.kind == "timestamp" else np.trunc(nanos / 1000).astype(np.int64)
        out: pa.Array = pa.array(seconds * 1_000_000 + micros, pa.int64()).cast(value.arrow)
    elif value.kind == "wrapper":
        out = messages.field(0)
    else:
        out = messages
    return spread(out, held, n)


def _scalar_array(value: Value, raw: np.ndarray, valid: np.ndarray) -> pa.Array:
    """Raw numbers (int64 for a varint) as the Arrow type of the value, null where not valid."""
    arrow = value.arrow
    if value.kind == "enum":
        numbers = raw.astype(np.int64).astype(np.int32)
        found, inverse = np.unique(numbers, return_inverse=True)
        names = pa.array([value.symbols.get(int(k), str(int(k))) for k in found], pa.string())
        return names.take(pa.array(inverse.astype(np.int64), mask=~valid))
    if pa.types.is_boolean(arrow):
        return pa.array(raw != 0, mask=~valid)
    numbers = raw.astype(np.dtype(arrow.to_pandas_dtype()), copy=False)  # a varint's low bits: int32, uint32, uint64
    if valid.all():
        return pa.Array.from_buffers(
            arrow, len(numbers), [None, pa.py_buffer(np.ascontiguousarray(numbers))], null_count=0
        )
    bitmap = pa.array(valid).buffers()[1]
    kept = np.where(valid, numbers, 0).astype(numbers.dtype)
    return pa.Array.from_buffers(arrow, len(kept), [bitmap, pa.py_buffer(kept)], null_count=int((~valid).sum()))


def _bytes_array(
    cursors: ProtoCursors,
    arrow: pa.DataType,
    start: np.ndarray,
    length: np.ndarray,
    valid: np.ndarray,
    owners: np.ndarray,
    what: str,
) -> pa.Array:
    binary = cursors._binary(start, np.where(valid, length, 0), valid)
    if not pa.types.is_string(arrow):
        return binary
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        out: list[str | None] = []
        for i, raw in enumerate(binary.to_pylist()):
            try:
                out.append(None if raw is None else raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                _fail_row(cursors, int(owners[i]), f"{what}: not UTF-8 ({exc.reason})")
                out.append(None)
        return pa.array(out, pa.string())


def _map_entries(entries: pa.StructArray, owners: np.ndarray) -> tuple[pa.StructArray, np.ndarray]:
    """A map's entries (in record order, each record's in the order written) in key order within
    each record, the last written of a key alone kept."""
    if not len(entries):
        return entries, owners
    written = np.arange(len(entries))
    order = pc.sort_indices(
        pa.table({"owner": owners, "key": entries.field(0), "written": written}),
        sort_keys=[("owner", "ascending"), ("key", "ascending"), ("written", "ascending")],
    ).to_numpy()
    entries, owners = entries.take(pa.array(order)), owners[order]
    keys = entries.field(0)
    same_next = np.zeros(len(entries), dtype=bool)
    if len(entries) > 1:
        same_key = pc.equal(keys.slice(0, len(keys) - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
        same_next[:-1] = same_key & (owners[:-1] == owners[1:])
    kept = np.flatnonzero(~same_next)
    return entries.take(pa.array(kept)), owners[kept]


def _no_members(n: int) -> pa.Array:
    return pa.array([{}] * n, pa.struct([]))


class NestedProtoReader(NestedReader):
    """Reads the messages of one schema, all at once: the same faces as the other readers to the
    format (`read`, `bad`, `detail`, `columns`, `arrow`, `property`). The records of the file's
    first message are read here; those that name another of its messages (Confluent's message
    indexes) by the reader `others` makes for them (the general reader), and put in their places."""

    def __init__(
        self,
        plan: NestedSchema,
        data: np.ndarray,
        pos: np.ndarray,
        end: np.ndarray,
        others: Callable[[np.ndarray, np.ndarray, np.ndarray], Any],
    ):
        super().__init__(plan, data, pos, end)
        self._reader_of_others = others
        self._others: Any = None
        self._other_rows = _EMPTY

    def read(self) -> None:
        assert isinstance(self.plan.shape, MessageShape), "an Avro plan's reader reads it (avro_nested.py)"
        cursors = ProtoCursors.over(self, self.pos, self.end)
        everyone = np.arange(len(self.pos))
        other = _names_another_message(cursors, everyone)
        if other.any():
            self._other_rows = np.flatnonzero(other)
            self._others = self._reader_of_others(self.data, self.pos[other], self.end[other])
            self._others.read()
            cursors.pos[other] = cursors.end[other]  # read as no message here
        records = read_messages(self.plan.shape, cursors)
        self.bad, self.detail = cursors.bad, cursors.detail
        if self._others is not None:
            self.bad[other], self.detail[other] = self._others.bad, self._others.detail
        left_out = self.bad | other
        self.records = records.take(pa.array(everyone, mask=left_out)) if left_out.any() else records

    def arrow(self, name: str) -> pa.Array:
        mine = super().arrow(name)
        if self._others is None:
            return mine
        theirs = self._others.arrow(name)
        try:
            theirs = theirs.cast(mine.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            try:
                mine = mine.cast(theirs.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                theirs = pa.nulls(len(theirs), mine.type)
        return scatter_into(mine, theirs, self._other_rows)

    def property(self, name: str, target: pa.DataType) -> tuple[pa.Array, list[Problem]]:
        mine, problems = super().property(name, target)
        if self._others is None:
            return mine, problems
        theirs, their_problems = self._others.property(name, target)
        problems += [(int(self._other_rows[i]), problem) for i, problem in their_problems]
        return scatter_into(mine, theirs, self._other_rows), problems


def _names_another_message(cursors: ProtoCursors, sel: np.ndarray) -> np.ndarray:
    """Reads Confluent's message indexes at each cursor: whether the record is of another message
    of the file than its first (a count of 0, or a single index 0, names the first)."""
    count = cursors._varint(sel, "message indexes")
    ok = ~cursors.bad[sel]
    other = ok & (count != 0)
    one = ok & (count == 1)
    if one.any():
        start = cursors.pos[sel[one]].copy()
        index = cursors._varint(sel[one], "message index")
        first = ~cursors.bad[sel[one]] & (index == 0)
        other[np.flatnonzero(one)[first]] = False
        cursors.pos[sel[one][~first]] = start[~first]
    return other
