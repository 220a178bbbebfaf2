"""Avro records of any schema without recursion, read column by column as the flat reader reads
its schemas: arrays, maps, records, unions of several types, enums, fixed and the logical types,
nested as deep as the schema writes them, decoded for all records of a batch at once.

Each type of the schema is read for a selection of cursors and gives an Arrow array of its own
type (the type `Shape.arrow` names): a record a struct of its fields' arrays, an array a list whose
items are read one position at a time for every record that still has one (the item at position j
of every record at once; then ordered record by record), a map the same with a string key before
each value, a union of null and one type that type's array with nulls, a union of several a struct
of its branches (streaming/decode/arrow_values.py), decimal, date, time and timestamp values as
Arrow's. The work is a few numpy operations per field, per array position: it does not grow with
the records. A column then takes its field's array through `arrow_values.fit`.

A schema whose named type contains itself (a linked list, a tree) has no fixed Arrow type: the
general reader (fastavro) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming.decode.arrow_values import fit, union_of
from streaming.decode.formats.binary_cursors import Cursors
from streaming.decode.python_values import Problem
from streaming.kernels.buffers import offsets_and_bytes

# Each Avro primitive as the Arrow type it is read as (the flat reader takes them too).
PRIMITIVE_ARROW = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
# An item count past which an array of items that take no bytes (nulls, empty records) is refused.
_MAX_EMPTY_ITEMS = 1 << 20


class RecursiveSchema(ValueError):
    """A schema whose named type contains itself: no Arrow type holds it."""


@dataclass
class Shape:
    """One type of a writer schema, and the Arrow type it is read as."""

    kind: str  # an Avro primitive, "record", "array", "map", "union", "enum" or "fixed"
    arrow: pa.DataType
    fields: list[tuple[str, Shape]] = field(default_factory=list)  # record
    items: Shape | None = None  # array: its items; map: its values
    branches: list[Shape] = field(default_factory=list)  # union
    symbols: list[str] = field(default_factory=list)  # enum
    size: int = 0  # fixed
    logical: str = ""
    min_bytes: int = 1  # the fewest bytes a value takes


def shape_of(parsed: Any, named: dict[str, Any]) -> Shape:
    """The shape of a schema fastavro parsed (`named`: its named types by full name)."""
    return _shape(parsed, named, ())


def _shape(raw: Any, named: dict[str, Any], inside: tuple[str, ...]) -> Shape:
    if isinstance(raw, str):
        if raw in PRIMITIVE_ARROW:
            return Shape(raw, PRIMITIVE_ARROW[raw], min_bytes=_PRIMITIVE_BYTES.get(raw, 1))
        if raw in inside:
            raise RecursiveSchema(raw)
        return _shape(named[raw], named, inside)
    if isinstance(raw, list):
        branches = [_shape(b, named, inside) for b in raw]
        others = [b for b in branches if b.kind != "null"]
        if len(others) == 1:
            arrow = others[0].arrow
        else:
            arrow = pa.struct([pa.field(f"union.branch.{i}", b.arrow) for i, b in enumerate(others)])
        return Shape("union", arrow, branches=branches)
    kind = raw["type"]
    if isinstance(kind, dict | list):
        return _shape(kind, named, inside)
    logical = str(raw.get("logicalType", ""))
    if kind in ("record", "error"):
        name = str(raw.get("name", ""))
        fields = [(str(f["name"]), _shape(f["type"], named, (*inside, name))) for f in raw["fields"]]
        arrow = pa.struct([pa.field(n, s.arrow) for n, s in fields])
        return Shape("record", arrow, fields=fields, min_bytes=sum(s.min_bytes for _, s in fields))
    if kind == "array":
        items = _shape(raw["items"], named, inside)
        return Shape("array", pa.list_(items.arrow), items=items)
    if kind == "map":
        values = _shape(raw["values"], named, inside)
        return Shape("map", pa.map_(pa.string(), values.arrow), items=values)
    if kind == "enum":
        return Shape("enum", pa.string(), symbols=[str(s) for s in raw["symbols"]])
    if kind == "fixed":
        size = int(raw["size"])
        arrow = _decimal(raw) if logical == "decimal" else pa.binary(size)
        return Shape("fixed", arrow, size=size, logical=logical, min_bytes=size)
    arrow = _LOGICAL.get((kind, logical), PRIMITIVE_ARROW[kind])
    if (kind, logical) == ("bytes", "decimal"):
        arrow = _decimal(raw)
    return Shape(
        kind, arrow, logical=logical if arrow != PRIMITIVE_ARROW[kind] else "", min_bytes=_PRIMITIVE_BYTES[kind]
    )


_PRIMITIVE_BYTES = {"null": 0, "boolean": 1, "int": 1, "long": 1, "float": 4, "double": 8, "bytes": 1, "string": 1}
_LOGICAL = {
    ("int", "date"): pa.date32(),
    ("int", "time-millis"): pa.time32("ms"),
    ("long", "time-micros"): pa.time64("us"),
    ("long", "timestamp-millis"): pa.timestamp("ms", tz="UTC"),
    ("long", "timestamp-micros"): pa.timestamp("us", tz="UTC"),
    ("long", "timestamp-nanos"): pa.timestamp("ns", tz="UTC"),
    ("long", "local-timestamp-millis"): pa.timestamp("ms"),
    ("long", "local-timestamp-micros"): pa.timestamp("us"),
    ("long", "local-timestamp-nanos"): pa.timestamp("ns"),
}


def _decimal(raw: dict[str, Any]) -> pa.DataType:
    precision, scale = int(raw.get("precision", 0)), int(raw.get("scale", 0))
    if not 0 < precision <= 76 or not 0 <= scale <= precision:
        return pa.binary(int(raw["size"])) if raw.get("type") == "fixed" else pa.binary()  # not a valid decimal
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)


class ArrowShaped(Protocol):
    @property
    def arrow(self) -> pa.DataType: ...


class NestedSchema(Protocol):
    """A plan a nested columnar reader reads (an Avro schema's `Shape`, a Protobuf message's)."""

    schema_id: int
    paths: frozenset[str]

    @property
    def shape(self) -> ArrowShaped: ...


class ShapeCursors(Cursors):
    """Cursors that read a value of any shape for a selection of records at once (`_shaped`): the
    nested reader's whole records, and the arrays and maps inside the flat reader's records
    (streaming/decode/formats/avro.py, a Debezium envelope's array columns)."""

    def _shaped(self, shape: Shape, sel: np.ndarray, what: str) -> pa.Array:
        """The values at cursors `sel` (null where a record does not match)."""
        live = np.flatnonzero(~self.bad[sel])
        if live.size == sel.size:
            return self._shape_live(shape, sel, what)
        return spread(self._shape_live(shape, sel[live], what), live, sel.size)

    def _shape_live(self, shape: Shape, sel: np.ndarray, what: str) -> pa.Array:
        kind = shape.kind
        if kind == "null":
            return pa.nulls(sel.size)
        if kind == "record":
            children = [self._shaped(child, sel, _member(what, name)) for name, child in shape.fields]
            return pa.StructArray.from_arrays(children, fields=list(shape.arrow)) if children else _empty_structs(sel)
        if kind == "union":
            return self._union(shape, sel, what)
        if kind in ("array", "map"):
            return self._repeated(shape, sel, what)
        if kind in ("int", "long", "enum"):
            return self._integers(shape, sel, what)
        if kind in ("float", "double"):
            values, fits = self._floats(sel, 4 if kind == "float" else 8, what)
            return _numbers(values, fits, shape.arrow)
        if kind == "boolean":
            p, fits = self._fixed(sel, 1, what)
            byte = self.data[p]
            wrong = fits & (byte > 1)
            self._fail(sel, wrong, f"{what}: boolean byte {byte[wrong][:1]} is neither 0 nor 1")
            return pa.array(byte == 1, mask=~(fits & ~wrong))
        if kind in ("bytes", "string"):
            start, length, ok = self._sized(sel, what)
            return self._bytes_as(shape, sel, self._binary(start, np.where(ok, length, 0), ok), what)
        if kind == "fixed":
            p, fits = self._fixed(sel, shape.size, what)
            return self._bytes_as(shape, sel, self._binary(p, np.where(fits, shape.size, 0), fits), what)
        raise AssertionError(kind)  # pragma: no cover - shape_of makes no other kind

    def _integers(self, shape: Shape, sel: np.ndarray, what: str) -> pa.Array:
        value = self._varint(sel, what)
        ok = ~self.bad[sel]
        if shape.kind == "int":
            wide = ok & ((value < -(2**31)) | (value >= 2**31))
            self._fail(sel, wide, f"{what}: {value[wide][:1]} does not fit an Avro int")
            ok &= ~wide
        if shape.kind == "enum":
            wrong = ok & ((value < 0) | (value >= len(shape.symbols)))
            self._fail(sel, wrong, f"{what}: enum index {value[wrong][:1]} of {len(shape.symbols)} symbols")
            ok &= ~wrong
            return pa.array(shape.symbols, pa.string()).take(_numbers(np.where(ok, value, 0), ok, pa.int64()))
        return _numbers(value.astype(np.int32) if shape.kind == "int" else value, ok, shape.arrow)

    def _bytes_as(self, shape: Shape, sel: np.ndarray, binary: pa.Array, what: str) -> pa.Array:
        kind = shape.arrow
        if pa.types.is_string(kind):
            try:
                return binary.cast(pa.string())
            except pa.ArrowInvalid:
                return self._strings_or_fail(binary, sel, what)
        if pa.types.is_fixed_size_binary(kind):
            return binary.cast(kind)
        if pa.types.is_decimal(kind):
            return self._decimals(binary, kind, sel, what)
        return binary

    def _strings_or_fail(self, binary: pa.Array, sel: np.ndarray, what: str) -> pa.Array:
        """Rare: a string that is not UTF-8 fails its record."""
        out: list[str | None] = []
        for i, value in enumerate(binary.to_pylist()):
            try:
                out.append(None if value is None else value.decode("utf-8"))
            except UnicodeDecodeError as exc:
                self._fail(sel[i : i + 1], np.array([True]), f"{what}: not UTF-8 ({exc.reason})")
                out.append(None)
        return pa.array(out, pa.string())

    def _decimals(self, binary: pa.Array, kind: pa.DataType, sel: np.ndarray, what: str) -> pa.Array:
        """Big-endian two's-complement unscaled values: up to 8 bytes in numpy, longer (over 18
        digits) by Python's int."""
        offsets32, data = offsets_and_bytes(binary)
        offsets = offsets32.astype(np.int64)
        lengths = np.diff(offsets)
        valid = pc.is_valid(binary).to_numpy(zero_copy_only=False)
        short = valid & (lengths <= 8)
        idx = np.flatnonzero(short)
        padded = np.concatenate([data, np.zeros(8, np.uint8)])
        unscaled = np.zeros(idx.size, dtype=np.int64)
        for k in range(8):
            more = k < lengths[idx]
            byte = padded[offsets[idx] + k].astype(np.int64)
            unscaled = np.where(more, (unscaled << 8) | byte, unscaled)
        bits = 8 * lengths[idx]
        partial = (bits > 0) & (bits < 64)
        negative = partial & (((unscaled >> np.where(partial, bits - 1, 0)) & 1) == 1)
        unscaled = np.where(negative, unscaled - (np.int64(1) << np.where(partial, bits, 0)), unscaled)
        limbs = 2 if pa.types.is_decimal128(kind) else 4
        words = np.zeros((len(binary), limbs), dtype=np.int64)
        words[idx, 0] = unscaled
        words[idx, 1:] = (unscaled >> 63)[:, None]
        ok = short.copy()
        if kind.precision <= 18:
            over = np.zeros(len(binary), dtype=bool)
            over[idx] = np.abs(unscaled) >= 10**kind.precision
            ok &= ~over
            self._fail(sel, over, f"{what}: a decimal of more than {kind.precision} digits")
        for i in np.flatnonzero(valid & ~short):
            number = int.from_bytes(binary[int(i)].as_py(), "big", signed=True)
            if abs(number) >= 10**kind.precision:
                self._fail(sel[i : i + 1], np.array([True]), f"{what}: a decimal of more than {kind.precision} digits")
                continue
            for limb in range(limbs):
                words[i, limb] = np.uint64((number >> (64 * limb)) & (2**64 - 1)).view(np.int64)
            ok[i] = True
        return pa.Array.from_buffers(
            kind, len(binary), [pa.array(ok).buffers()[1], pa.py_buffer(words)], null_count=int((~ok).sum())
        )

    def _union(self, shape: Shape, sel: np.ndarray, what: str) -> pa.Array:
        branch = self._varint(sel, what)
        ok = ~self.bad[sel]
        out_of_range = ok & ((branch < 0) | (branch >= len(shape.branches)))
        self._fail(sel, out_of_range, f"{what}: union branch {branch[out_of_range][:1]} of {len(shape.branches)}")
        ok &= ~out_of_range
        others = [(b, s) for b, s in enumerate(shape.branches) if s.kind != "null"]
        arrays = []
        for b, branch_shape in others:
            held = np.flatnonzero(ok & (branch == b))
            values = self._shaped(branch_shape, sel[held], what)
            arrays.append(spread(values, held, sel.size))
        if not arrays:
            return pa.nulls(sel.size)
        if len(arrays) == 1:
            return arrays[0]
        return union_of(arrays, mask=~np.isin(branch, [b for b, _ in others]) | ~ok)

    def _repeated(self, shape: Shape, sel: np.ndarray, what: str) -> pa.Array:
        """An array's items (a map's keys and values) in blocks, each block's count first (negative:
        its byte size follows), a count of 0 last; item j of every record read at once."""
        items = shape.items
        assert items is not None
        is_map = shape.kind == "map"
        counts = np.zeros(sel.size, dtype=np.int64)
        owners: list[np.ndarray] = []
        keys: list[pa.Array] = []
        chunks: list[pa.Array] = []
        active = np.arange(sel.size)
        per_item = items.min_bytes + (1 if is_map else 0)
        while active.size:
            count = self._varint(sel[active], what)
            sized = ~self.bad[sel[active]] & (count < 0)
            count = np.abs(count)
            if sized.any():
                self._varint(sel[active[sized]], what)
            left = self.end[sel[active]] - self.pos[sel[active]]
            too_many = ~self.bad[sel[active]] & (count > (left // per_item if per_item else _MAX_EMPTY_ITEMS))
            self._fail(sel[active], too_many, f"{what}: {count[too_many][:1]} items run past the record's end")
            count[self.bad[sel[active]]] = 0
            for j in range(int(count.max(initial=0))):
                at = active[(count > j) & ~self.bad[sel[active]]]
                if not at.size:
                    break
                if is_map:
                    keys.append(self._shaped(_STRING, sel[at], f"{what} (a key)"))
                chunks.append(self._shaped(items, sel[at], f"{what}[]"))
                owners.append(at)
                counts[at] += 1
            active = active[(count > 0) & ~self.bad[sel[active]]]
        owner = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
        failed = self.bad[sel]
        counts[failed] = 0
        kept = np.flatnonzero(~failed[owner])
        order = kept[np.argsort(owner[kept], kind="stable")]
        offsets = np.zeros(sel.size + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        values = _concat(chunks, items.arrow).take(pa.array(order))
        mask = pa.array(failed) if failed.any() else None
        if is_map:
            map_keys = _concat(keys, pa.string()).take(pa.array(order))
            return pa.MapArray.from_arrays(pa.array(offsets), map_keys, values, type=shape.arrow, mask=mask)
        return pa.ListArray.from_arrays(pa.array(offsets), values, type=shape.arrow, mask=mask)


class NestedReader(ShapeCursors):
    """Reads the records of one schema (its `shape`), all at once: the same faces as the other
    readers to the format (`read`, `bad`, `detail`, `columns`, `arrow`, `property`)."""

    def __init__(self, plan: NestedSchema, data: np.ndarray, pos: np.ndarray, end: np.ndarray):
        super().__init__(data, pos, end)
        self.plan = plan
        self.columns = plan.paths
        self.records: pa.Array = pa.nulls(len(pos), plan.shape.arrow)

    def read(self) -> None:
        assert isinstance(self.plan.shape, Shape), "a Protobuf plan's reader reads it (protobuf_nested.py)"
        records = self._shaped(self.plan.shape, np.arange(len(self.pos)), "record")
        self._nothing_left()
        everyone = np.arange(len(records))
        self.records = records.take(pa.array(everyone, mask=self.bad)) if self.bad.any() else records

    def arrow(self, name: str) -> pa.Array:
        """The field at path `name` (`record.field`) in its Avro type's Arrow type."""
        value = self.records
        for step in name.split("."):
            if not pa.types.is_struct(value.type) or value.type.get_field_index(step) < 0:
                return pa.nulls(len(self.records))
            value = pc.struct_field(value, step)
        return value

    def property(self, name: str, target: pa.DataType) -> tuple[pa.Array, list[Problem]]:
        """A field as a column of `target`, and the records whose value does not fit it."""
        return fit(self.arrow(name), target, f"properties.{name}")


_STRING = Shape("string", pa.string())


def _numbers(values: np.ndarray, valid: np.ndarray, kind: pa.DataType) -> pa.Array:
    """Numbers (or the day, time or instant counts of a date, time or timestamp type of their
    width) as an Arrow array of `kind`, on their numpy buffer, null where not `valid`."""
    if valid.all():
        return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)], null_count=0)
    kept = np.where(valid, values, 0)
    bitmap = pa.array(valid).buffers()[1]
    return pa.Array.from_buffers(kind, len(values), [bitmap, pa.py_buffer(kept)], null_count=int((~valid).sum()))


def _member(what: str, name: str) -> str:
    return f"field {name!r}" if what == "record" else f"{what}.{name}"


def spread(values: pa.Array, held: np.ndarray, n: int) -> pa.Array:
    """A length-n array with values[i] at held[i] (distinct rows, in any order), null elsewhere."""
    if held.size == n and not (np.diff(held) < 0).any():
        return values
    positions = np.zeros(n, dtype=np.int64)
    positions[held] = np.arange(held.size)
    absent = np.ones(n, dtype=bool)
    absent[held] = False
    return values.take(pa.array(positions, mask=absent)) if len(values) else pa.nulls(n, values.type)


def _concat(chunks: list[pa.Array], kind: pa.DataType) -> pa.Array:
    return pa.concat_arrays(chunks) if chunks else pa.array([], kind)


def _empty_structs(sel: np.ndarray) -> pa.Array:
    return pa.array([{}] * sel.size, pa.struct([]))
