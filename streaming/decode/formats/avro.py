"""Avro records in the Confluent wire format (contract format "avro"), their schemas from a registry.

A value is a zero byte, the 4-byte big-endian id of its writer schema in the schema registry, and
the record in Avro's binary encoding. The values of a batch are grouped by schema id; each schema
is fetched once (streaming/decode/schema_registry.py) and compiled to a plan, and the records of a
group are read together, field after field, with numpy over the batch's bytes: one cursor per
record, every variable-length integer, string and number of a field read for all records at once.
No Python code runs per record on this path.

The geometry comes from the field(s) the contract's `registry` section names: bytes (WKB or EWKB),
a string (WKT), or a longitude and a latitude field; an optional field holds its EPSG code.
Other fields are the record's properties: a column `from` `properties.<field>` takes the field of
that name (a field of a nested record is `<record>.<field>`). A record that does not match its
schema (truncated, bytes left over, a union branch or enum symbol out of range, a string that is
not UTF-8) is rejected with the field and the fault; so is a record whose schema id the registry
does not know. A registry that cannot be reached stops the batch (RegistryUnavailable).

Three readers, chosen per writer schema id (and the contract's columns), never per record:

- The flat reader above reads records (nested too) of null, boolean, int, long, float, double,
  bytes, string, enum and fixed, unions of null and one other type (optional fields),
  timestamp-millis / -micros (read as timestamps; other logical types as their underlying type),
  types named from schemas it refers to (schema references, fetched with it), each leaf field
  read as a column (`properties.<record>.<field>`). The Debezium format reads its Avro envelopes
  with it alone.
- The nested reader (streaming/decode/formats/avro_nested.py) reads every other schema without
  recursion the same way, column by column for all records at once: arrays, maps, unions of
  several non-null types (the branch a record holds is its value), records read whole into
  struct columns, the logical types decimal, date, time-millis / -micros, timestamp-*,
  local-timestamp-* and uuid read as what they stand for. Each field becomes an Arrow array of
  its own type, which streaming/decode/arrow_values.py turns into its column's type.
- The general reader (GeneralReader) reads a schema whose named type contains itself (a tree):
  fastavro decodes each record to Python values, record by record, and
  streaming/decode/python_values.py converts the values of each `properties.<field>` source to
  its column's data-file type (~6,000-9,000 records per CPU second for a 30-field event).

How Avro values fill column types (the nested and general readers alike): a record fills a
struct (fields by name, fields the struct does not name ignored; a required member null or missing
rejects the record), an array a list, a map a map of string keys, an enum a string (its symbol), fixed a fixed[N] of its
size or binary, decimal a decimal whose precision and scale hold its digits, date a date,
time-millis / -micros a time, timestamp-* a timestamptz (or a timestamp, as UTC wall-clock time),
local-timestamp-* a timestamp (or a timestamptz, taken as UTC), uuid a uuid or a string. A union
value fills the column as its branch's value does (a long in a union of long and string fills a
long column, and a string column as its digits, as the columnar reader's cast of a long field does;
a string of it does not fill a long column). A value that does not fit rejects its record with
`property_type_mismatch`, the detail naming the nested path (`properties.readings[3].value:
expected int, got 2.5`). Nothing is rejected for its schema's shape: `schema_not_supported` is
left for what is no Avro record schema at all (a schema of another type, one fastavro refuses, a
top-level type other than a record).
"""

from __future__ import annotations

import io
import struct
from typing import Any, ClassVar

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import shapely

from streaming.contract import Contract
from streaming.decode.columns import _cast_or_reject
from streaming.decode.formats.avro_nested import (
    PRIMITIVE_ARROW,
    NestedReader,
    ShapeCursors,
)
from streaming.decode.formats.avro_schema import (
    EVOLVED_KIND,
    GeneralPlan,
    NestedPlan,
    Node,
    Plan,
    UnsupportedSchema,
    compile_avro,
    declared_kind,
    nested_field_kinds,
)
from streaming.decode.formats.base import Decoded, InputFormat
from streaming.decode.formats.wkb import EWKB_SRID_FLAG, read_wkb
from streaming.decode.python_values import to_arrow
from streaming.decode.rejects import Reason, Rejects
from streaming.decode.schema_registry import (
    RegisteredSchema,
    RegistrySettings,
    SchemaRegistryClient,
    UnknownSchemaId,
    client_for,
)
from streaming.kernels.buffers import NONE, offsets_and_bytes, scatter_into

WIRE_HEADER = 5  # magic byte 0x00 + 4-byte schema id
_NUMPY = {"int": np.int64, "long": np.int64, "float": np.float64, "double": np.float64, "boolean": np.bool_}
_ARROW = {**PRIMITIVE_ARROW, "fixed": pa.binary(), "enum": pa.string()}
_LOGICAL = {"timestamp-millis": pa.timestamp("ms", tz="UTC"), "timestamp-micros": pa.timestamp("us", tz="UTC")}


class _Column:
    """A leaf's values for every record of a group: numbers, (start, length) of byte strings, or
    the arrays an array or map field was read into (with the records each holds)."""

    def __init__(self, node: Node, n: int):
        self.node = node
        self.valid = np.zeros(n, dtype=bool)
        self.pieces: list[tuple[np.ndarray, pa.Array]] = []
        if node.kind in ("bytes", "string", "fixed"):
            self.start = np.zeros(n, dtype=np.int64)
            self.length = np.zeros(n, dtype=np.int64)
        else:
            self.values: np.ndarray = np.zeros(n, dtype=_NUMPY.get(node.kind, np.int64))


class RecordReader(ShapeCursors):
    """Reads the records of one schema, all at once: `data` holds them at [pos[i], end[i])."""

    def __init__(self, plan: Plan, data: np.ndarray, pos: np.ndarray, end: np.ndarray):
        super().__init__(data, pos, end)
        self.plan = plan
        self.columns = {name: _Column(node, len(pos)) for name, node in plan.leaves.items()}

    def read(self) -> None:
        everyone = np.arange(len(self.pos))
        self._read(self.plan.root, everyone)
        self._nothing_left()

    def _read(self, node: Node, sel: np.ndarray) -> None:
        sel = sel[~self.bad[sel]]
        if sel.size == 0 or node.kind == "null":
            return
        what = f"field {node.name!r}" if node.name else "record"
        kind = node.kind
        if kind == "record":
            for child in node.fields:
                self._read(child, sel)
            return
        if kind == "union":
            branch = self._varint(sel, what)
            live = ~self.bad[sel]
            out_of_range = live & ((branch < 0) | (branch >= len(node.branches)))
            self._fail(sel, out_of_range, f"{what}: union branch {branch[out_of_range][:1]} of {len(node.branches)}")
            for b, child in enumerate(node.branches):
                self._read(child, sel[live & (branch == b)])
            return
        column = self.columns[node.name]
        if kind == "nested":
            assert node.shape is not None
            column.pieces.append((sel, self._shaped(node.shape, sel, what)))
            column.valid[sel] = True
        elif kind in ("int", "long", "enum"):
            value = self._varint(sel, what)
            ok = ~self.bad[sel]
            if kind == "int":
                wide = ok & ((value < -(2**31)) | (value >= 2**31))
                self._fail(sel, wide, f"{what}: {value[wide][:1]} does not fit an Avro int")
                ok &= ~wide
            if kind == "enum":
                wrong = ok & ((value < 0) | (value >= len(node.symbols)))
                self._fail(sel, wrong, f"{what}: enum index {value[wrong][:1]} of {len(node.symbols)} symbols")
                ok &= ~wrong
            column.values[sel[ok]] = value[ok]
            column.valid[sel[ok]] = True
        elif kind in ("float", "double"):
            values, fits = self._floats(sel, 4 if kind == "float" else 8, what)
            column.values[sel[fits]] = values[fits]
            column.valid[sel[fits]] = True
        elif kind == "boolean":
            p, fits = self._fixed(sel, 1, what)
            byte = self.data[p]
            wrong = fits & (byte > 1)
            self._fail(sel, wrong, f"{what}: boolean byte {byte[wrong][:1]} is neither 0 nor 1")
            ok = fits & ~wrong
            column.values[sel[ok]] = byte[ok] == 1
            column.valid[sel[ok]] = True
        elif kind in ("bytes", "string"):
            p, length, ok = self._sized(sel, what)
            good = sel[ok]
            column.start[good] = p[ok]
            column.length[good] = length[ok]
            column.valid[good] = True
        elif kind == "fixed":
            p, fits = self._fixed(sel, node.size, what)
            column.start[sel[fits]] = p[fits]
            column.length[sel[fits]] = node.size
            column.valid[sel[fits]] = True
        else:  # pragma: no cover - compile_schema admits no other kind
            raise UnsupportedSchema(kind)

    # -- columns -------------------------------------------------------------------------------
    def arrow(self, name: str) -> pa.Array:
        """The column of a leaf as Arrow (null where a record has no value, or was rejected)."""
        column = self.columns[name]
        node = column.node
        valid = column.valid & ~self.bad
        if node.kind == "nested":
            return _assembled(column.pieces, valid, node)
        if node.kind in ("bytes", "string", "fixed"):
            binary = self._binary(column.start, np.where(valid, column.length, 0), valid)
            if node.kind != "string":
                return binary
            try:
                return binary.cast(pa.string())
            except pa.ArrowInvalid:
                return self._strings_or_fail(binary, np.arange(len(binary)), f"field {node.name!r}")
        if node.kind == "enum":
            symbols = pa.array(node.symbols, pa.string())
            return symbols.take(pa.array(np.where(valid, column.values, 0), mask=~valid))
        arrow_type = _LOGICAL.get(node.logical, _ARROW[node.kind])
        return pa.array(column.values, mask=~valid).cast(arrow_type)


def _assembled(pieces: list[tuple[np.ndarray, pa.Array]], valid: np.ndarray, node: Node) -> pa.Array:
    """One value per record from the arrays read for some records each (a union's branch reads
    a field for the records that took it), null where a record has none."""
    assert node.shape is not None
    if not pieces:
        return pa.nulls(len(valid), node.shape.arrow)
    held = np.concatenate([records for records, _ in pieces])
    at = np.full(len(valid), -1, dtype=np.int64)
    at[held] = np.arange(held.size)
    values = pa.concat_arrays([values for _, values in pieces])
    return values.take(pa.array(np.maximum(at, 0), mask=~valid | (at < 0)))


# -- the general reader: fastavro, record by record ----------------------------------------------
_READ_FAULTS = (EOFError, ValueError, IndexError, KeyError, TypeError, OverflowError, struct.error)


class GeneralReader:
    """Reads the records of a schema the columnar reader does not read with fastavro, one by one
    (the schemas with arrays, maps, unions of several types, decimals, dates, times, UUIDs, record
    fields read as structs): the same faces as RecordReader to the format."""

    def __init__(self, plan: GeneralPlan, data: np.ndarray, pos: np.ndarray, end: np.ndarray):
        self.plan = plan
        self.data = data
        self.pos = pos.astype(np.int64)
        self.end = end.astype(np.int64)
        n = len(pos)
        self.bad = np.zeros(n, dtype=bool)
        self.detail = np.full(n, None, dtype=object)
        self.columns = plan.paths
        self.records: list[Any] = [None] * n

    def read(self) -> None:
        buffer = memoryview(self.data.data)
        parsed = self.plan.parsed
        for i, (start, stop) in enumerate(zip(self.pos.tolist(), self.end.tolist(), strict=True)):
            body = io.BytesIO(buffer[start:stop])
            try:
                self.records[i] = fastavro.schemaless_reader(body, parsed, None)
            except _READ_FAULTS as exc:
                self.bad[i] = True
                self.detail[i] = f"{type(exc).__name__}: {exc}" if str(exc) else "the record ends inside a field"
                continue
            left = stop - start - body.tell()
            if left:
                self.bad[i] = True
                self.detail[i] = f"{left} bytes after the record's last field"
                self.records[i] = None

    def values(self, name: str) -> list[Any]:
        """The field at path `name` of each record (None where absent or the record rejected)."""
        steps = name.split(".")
        if len(steps) == 1:
            return [None if record is None else record.get(name) for record in self.records]
        out: list[Any] = []
        for record in self.records:
            value: Any = record
            for step in steps:
                value = value.get(step) if isinstance(value, dict) else None
            out.append(value)
        return out

    def arrow(self, name: str) -> pa.Array:
        """A leaf field as Arrow, in its Avro type's (the geometry's and SRID's fields)."""
        node = self.plan.leaves.get(name)
        values = self.values(name)
        try:
            return pa.array(values, _ARROW.get(node.kind) if node else None)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return pa.nulls(len(values))

    def property(self, name: str, target: pa.DataType) -> tuple[pa.Array, list[tuple[int, str]]]:
        """A field as a column of `target`, and the records whose value does not fit it."""
        return to_arrow(self.values(name), target, f"properties.{name}")


AnyReader = RecordReader | GeneralReader | NestedReader


def wire_parts(values: pa.Array, rows: np.ndarray) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The values at rows as binary, their bytes and offsets, the schema id of each and which are
    too short to have one."""
    taken = values.take(pa.array(rows)).cast(pa.binary())
    offsets32, data = offsets_and_bytes(taken)
    offsets = offsets32.astype(np.int64)
    short = np.diff(offsets) < WIRE_HEADER
    padded = np.concatenate([data, np.zeros(WIRE_HEADER, dtype=np.uint8)])
    head = offsets[:-1]
    ids = (
        (padded[head + 1].astype(np.int64) << 24)
        | (padded[head + 2].astype(np.int64) << 16)
        | (padded[head + 3].astype(np.int64) << 8)
        | padded[head + 4].astype(np.int64)
    )
    return taken, data, offsets, ids, short


_POINT_WKB = np.dtype([("order", "u1"), ("type", "<u4"), ("x", "<f8"), ("y", "<f8")])


def point_wkb(xy: np.ndarray) -> np.ndarray:
    """The stored form (little-endian ISO WKB) of each x, y: 21 bytes, written for all at once."""
    packed = np.zeros(len(xy), dtype=_POINT_WKB)
    packed["order"], packed["type"], packed["x"], packed["y"] = 1, 1, xy[:, 0], xy[:, 1]
    offsets = np.arange(len(xy) + 1, dtype=np.int32) * _POINT_WKB.itemsize
    blobs = pa.Array.from_buffers(pa.binary(), len(xy), [None, pa.py_buffer(offsets), pa.py_buffer(packed.tobytes())])
    return blobs.to_numpy(zero_copy_only=False)


class AvroFormat(InputFormat):
    """Avro in the Confluent wire format, read with the writer schema the registry holds for its id."""

    names: ClassVar[tuple[str, ...]] = ("avro",)
    first_bytes: ClassVar[tuple[int, ...]] = (0,)
    described: ClassVar[str] = "an Avro record in the Confluent wire format"
    first_bytes_shown: ClassVar[tuple[str, ...]] = ("0x00",)
    # Its values start with 0x00, as big-endian WKB does: a topic is either registry-encoded or not.
    registry_encoded: ClassVar[bool] = True
    # The registry's name of the schemas it reads (streaming/decode/formats/protobuf.py reads "PROTOBUF").
    schema_type: ClassVar[str] = "AVRO"
    # Whether its leaves' kinds tell a 32-bit integer from a 64-bit one (Protobuf's read both as long).
    integer_widths: ClassVar[bool] = True

    def __init__(self, contract: Contract, max_nesting: int, property_types: dict[str, pa.DataType]):
        super().__init__(contract, max_nesting, property_types)
        self._client: SchemaRegistryClient | None = None
        self._settings = RegistrySettings()
        self._plans: dict[int, Plan | UnsupportedSchema] = {}
        self._nested_kinds: dict[int, dict[str, str]] = {}

    def use_registry(self, settings: RegistrySettings) -> None:
        self._settings = settings

    @property
    def client(self) -> SchemaRegistryClient:
        if self._client is None:
            self._client = client_for(self._settings)
        return self._client

    def plan(self, schema_id: int) -> Plan:
        """The compiled schema of an id; raises UnknownSchemaId, UnsupportedSchema, RegistryUnavailable."""
        cached = self._plans.get(schema_id)
        if cached is None:
            cached = self.learn(self.client.schema(schema_id))
        if isinstance(cached, UnsupportedSchema):
            raise cached
        return cached

    def learn(self, registered: RegisteredSchema) -> Plan | UnsupportedSchema:
        """Compile a registered schema, kept for the records that name its id: its plan, or why
        none, and the types schema evolution sees in it."""
        plan: Plan | UnsupportedSchema
        if registered.schema_type != self.schema_type:
            plan = UnsupportedSchema(
                f"schema id {registered.id} is of type {registered.schema_type}, not {self.schema_type}"
            )
        else:
            try:
                plan = self.compile(registered)
            except UnsupportedSchema as exc:
                plan = exc
            self._nested_kinds[registered.id] = self.nested_kinds(registered, plan)
        self._plans[registered.id] = plan
        return plan

    @property
    def reads_every_schema(self) -> bool:
        """Whether schemas the columnar reader does not read go to the general reader: for a topic
        of this format, not for the Debezium format, which reads its Avro envelopes with this
        format's columnar reader (streaming/decode/formats/debezium_avro.py) and rejects the rest."""
        return any(name in self.contract.formats for name in self.names)

    def compile(self, registered: RegisteredSchema) -> Plan:
        return compile_avro(
            registered.id, registered.text, registered.references, self.property_types, self.reads_every_schema
        )

    def nested_kinds(self, registered: RegisteredSchema, plan: Plan | UnsupportedSchema) -> dict[str, str]:
        """Schema evolution's types of the record's nested fields (`nested_field_kinds`), from the
        plan just compiled when the nested reader's, so the schema is not parsed again."""
        return nested_field_kinds(
            registered.id, registered.text, registered.references, plan if isinstance(plan, NestedPlan) else None
        )

    def reader(self, plan: Plan, data: np.ndarray, start: np.ndarray, end: np.ndarray) -> AnyReader:
        if isinstance(plan, NestedPlan):
            return NestedReader(plan, data, start, end)
        if isinstance(plan, GeneralPlan):
            return GeneralReader(plan, data, start, end)
        return RecordReader(plan, data, start, end)

    def decode(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        rejects = out.rejects
        taken, data, offsets, ids, short = wire_parts(values, rows)
        rejects.add(
            rows[short],
            Reason.BAD_WIRE_FORMAT,
            "shorter than the Confluent wire format's header (a zero byte and a 4-byte schema id)",
        )
        head = offsets[:-1]
        for schema_id in np.unique(ids[~short]):
            local = np.flatnonzero(~short & (ids == schema_id))
            try:
                plan = self.plan(int(schema_id))
            except UnknownSchemaId:
                rejects.add(
                    rows[local],
                    Reason.UNKNOWN_SCHEMA_ID,
                    f"schema id {int(schema_id)} is not in the schema registry at {self._settings.url}",
                )
                continue
            except UnsupportedSchema as exc:
                rejects.add(rows[local], Reason.SCHEMA_NOT_SUPPORTED, str(exc))
                continue
            reader = self.reader(plan, data, head[local] + WIRE_HEADER, offsets[1:][local])
            reader.read()
            bad = reader.bad
            rejects.add(
                rows[local[bad]],
                Reason.SCHEMA_MISMATCH,
                [f"the record does not match its schema (id {int(schema_id)}): {d}" for d in reader.detail[bad]],
            )
            self._geometry(reader, rows[local], out)
            self._properties(reader, rows[local], out)

    # -- geometry and properties -----------------------------------------------------------------
    def _geometry(self, reader: AnyReader, rows: np.ndarray, out: Decoded) -> None:
        spec = self.contract.registry
        assert spec is not None, "an avro contract has a registry section (streaming/contract/sources.py)"
        rejects = out.rejects
        if spec.geometry_field:
            names = [spec.geometry_field]
        else:
            names = [spec.lon_field, spec.lat_field]
        for name in names:
            if name not in reader.columns:
                rejects.add(
                    rows,
                    Reason.MISSING_GEOMETRY,
                    f"schema id {reader.plan.schema_id} has no field {name!r} (registry.* of the contract)",
                )
                return
        if spec.srid_field:
            srid = self._field_or_none(reader, spec.srid_field)
            if srid is not None:
                codes = pc.fill_null(srid.cast(pa.int64()), self.contract.geometry.epsg).to_numpy()
                out.srids[rows] = codes
        if not spec.geometry_field:
            lon = reader.arrow(spec.lon_field)
            lat = reader.arrow(spec.lat_field)
            for arr, name in ((lon, spec.lon_field), (lat, spec.lat_field)):
                if not (pa.types.is_floating(arr.type) or pa.types.is_integer(arr.type)):
                    rejects.add(rows, Reason.SCHEMA_NOT_SUPPORTED, f"field {name!r} is a {arr.type}, not a number")
                    return
            missing = pc.is_null(lon).to_numpy(zero_copy_only=False) | pc.is_null(lat).to_numpy(zero_copy_only=False)
            rejects.add(rows[missing], Reason.MISSING_GEOMETRY, f"{spec.lon_field} or {spec.lat_field} is null")
            xy = np.column_stack(
                [
                    pc.fill_null(lon.cast(pa.float64()), np.nan).to_numpy(),
                    pc.fill_null(lat.cast(pa.float64()), np.nan).to_numpy(),
                ]
            )
            infinite = rejects.ok[rows] & ~np.isfinite(xy).all(axis=1)
            rejects.add(
                rows[infinite], Reason.NON_FINITE_COORDINATES, f"{spec.lon_field} / {spec.lat_field} is not finite"
            )
            live = rejects.ok[rows]
            # In the table CRS a point is stored as it came (its WKB written here, in bulk);
            # in another CRS it becomes a geometry the rules reproject.
            plain = live & (out.srids[rows] == self.contract.geometry.epsg)
            out.points_xy[rows[plain]] = xy[plain]
            out.wkb[rows[plain]] = point_wkb(xy[plain])
            other = live & ~plain
            out.geoms[rows[other]] = shapely.points(xy[other])
            return
        name = spec.geometry_field
        arr = reader.arrow(name)
        missing = pc.is_null(arr).to_numpy(zero_copy_only=False)
        rejects.add(rows[missing], Reason.MISSING_GEOMETRY, f"field {name!r} is null")
        live = rejects.ok[rows]
        if not live.any():
            return
        if pa.types.is_binary(arr.type):
            read_rows, codes, geoms = read_wkb(
                arr.filter(pa.array(live)), rows[live], out, self.contract, self.max_nesting, where=f"field {name!r}"
            )
            has_srid = (codes & EWKB_SRID_FLAG) != 0
            if has_srid.any():
                out.srids[read_rows[has_srid]] = shapely.get_srid(geoms[has_srid])
        elif pa.types.is_string(arr.type):
            texts = arr.filter(pa.array(live)).to_numpy(zero_copy_only=False)
            geoms = shapely.from_wkt(texts, on_invalid="ignore")
            unread = np.equal(geoms, NONE)
            live_rows = rows[live]
            rejects.add(live_rows[unread], Reason.BAD_WKT, f"field {name!r} is not WKT")
            out.geoms[live_rows[~unread]] = geoms[~unread]
        else:
            rejects.add(rows, Reason.SCHEMA_NOT_SUPPORTED, f"field {name!r} is a {arr.type}: expected bytes or string")

    def _field_or_none(self, reader: AnyReader, name: str) -> pa.Array | None:
        return reader.arrow(name) if name in reader.columns else None

    def _properties(self, reader: AnyReader, rows: np.ndarray, out: Decoded) -> None:
        for name, target in self.property_types.items():
            if name not in reader.columns:
                continue  # an older schema without the field: the column stays null
            if isinstance(reader, GeneralReader | NestedReader):
                cast, problems = reader.property(name, target)
                for i, problem in problems:
                    out.rejects.add(rows[i : i + 1], Reason.PROPERTY_TYPE_MISMATCH, problem)
            else:
                arr = reader.arrow(name)
                local = Rejects(len(rows))
                cast = _cast_or_reject(arr, target, f"properties.{name}", local)
                bad = ~local.ok
                if bad.any():
                    out.rejects.add(rows[bad], Reason.PROPERTY_TYPE_MISMATCH, list(local.detail[bad]))
            out.properties[name] = scatter_into(out.properties[name], cast, rows)

    def unmapped_fields(
        self,
        values: pa.Array,
        rows: np.ndarray,
        mapped: frozenset[str],
        order: tuple[np.ndarray, ...],
        declared: frozenset[str] = frozenset(),
    ) -> dict[str, Any]:
        """The record fields no column maps, of the schemas these values name (schema evolution's
        scan: a field a new schema version adds becomes a column under `add-columns`), and of the
        mapped fields in `declared`, the type their writer schema declares (a column may widen to
        it). A field counts every record of a schema that has it; its first record is the group's
        first in Kafka order. Records whose schema is unknown or unsupported name none (the
        decoder rejects them)."""
        # Here, not at the top: streaming.decode.properties imports the formats package.
        from streaming.decode.properties import NESTED, PropertySeen, merge_seen

        spec = self.contract.registry
        own = {spec.geometry_field, spec.lon_field, spec.lat_field, spec.srid_field} if spec else set()
        _, _, _, ids, short = wire_parts(values, rows)
        timestamps, partitions, offsets = order
        seen: dict[str, PropertySeen] = {}
        for schema_id in np.unique(ids[~short]):
            local = np.flatnonzero(~short & (ids == schema_id))
            try:
                plan = self.plan(int(schema_id))
            except (UnknownSchemaId, UnsupportedSchema):
                continue
            k = local[np.lexsort((offsets[local], partitions[local], timestamps[local]))[0]]
            first = (int(timestamps[k]), int(partitions[k]), int(offsets[k]))
            nested = self._nested_kinds.get(int(schema_id), {})
            for name, nested_kind in nested.items():
                if name not in own and name not in mapped:
                    merge_seen(seen, {name: PropertySeen(nested_kind, int(local.size), first)})
            for name, node in plan.leaves.items():
                if name in own or (name in mapped and name not in declared) or name.split(".", 1)[0] in nested:
                    continue
                kind = (
                    declared_kind(node, self.integer_widths) if name in mapped else EVOLVED_KIND.get(node.kind, NESTED)
                )
                if kind is None:
                    continue
                found = PropertySeen(kind, int(local.size), first)
                merge_seen(seen, {name: found})
        return seen
