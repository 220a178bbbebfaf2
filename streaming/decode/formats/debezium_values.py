"""How Debezium's PostgreSQL connector spells a column's values in JSON, and their conversion to the
contract column's type, over the whole batch.

A column's spelling (`Wire`) is its Kafka Connect schema: the Connect type (`int32`, `int64`,
`double`, `string`, `bytes`, `array`, `struct`) and the logical name the connector gives it:

    numeric  org.apache.kafka.connect.data.Decimal (decimal.handling.mode=precise, the default):
             base64 of the big-endian two's-complement unscaled integer, the scale in the schema's
             parameters; io.debezium.data.VariableScaleDecimal for a numeric without a scale:
             {scale, value}; under decimal.handling.mode=string a string, under double a number
    date     io.debezium.time.Date (or Connect's Date): days since 1970-01-01
    time     io.debezium.time.MicroTime (us since midnight), Time (ms), NanoTime (ns)
    timestamp  io.debezium.time.MicroTimestamp (us since the epoch), Timestamp (ms: a timestamp(0..3)
             column, or Connect's Timestamp), NanoTimestamp (ns)
    timestamptz  io.debezium.time.ZonedTimestamp: ISO 8601 text in UTC
    uuid     io.debezium.data.Uuid: the canonical text
    jsonb    io.debezium.data.Json: the JSON text
    arrays   a JSON array of the element's spelling

An event with its schema (the JSON converter's schemas on) says each column's spelling; an event
without one is taken as spelt as the connector's defaults spell the contract column's type
(`default_wire`): a decimal column's value as precise base64 at the column's own scale, a timestamp
as MicroTimestamp, a timestamptz as ZonedTimestamp, a struct, map or list column read from a JSON
array or, for a jsonb, its text.

What each column type takes (the decisions docs/debezium.md lists):
- decimal(P, S): a numeric of any of the three modes; a value with more fraction digits than S, or
  more digits than P, does not fit (never rounded), nor does NaN or an infinity (string mode's
  "NaN", "Infinity", "-Infinity": a decimal holds none). Under double mode the double is rounded
  to S digits: it is an approximation already.
- double, float: a numeric of any mode, as the nearest double; NaN and infinities as they are.
- int, long: a numeric without a fraction.
- string: where the event's schema says what the value is, a numeric's decimal text at its source
  scale ("12.50"), a date's ISO text, a time's and a timestamp's (`YYYY-MM-DD HH:MM:SS.ffffff`), a
  timestamptz's as sent; a jsonb's JSON text as PostgreSQL writes it, a uuid's text. Without a
  schema, a string as sent (precise mode's base64), and a number is no string (rejected).
- timestamp from a timestamptz: its UTC time; timestamptz from a timestamp: the time taken as UTC.
- struct, map, list from a jsonb: its JSON text parsed, each member to its field's type (as the
  JSON formats read them, streaming/decode/json_values.py); a list from an array, each element
  converted by its own spelling.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from streaming.decode.json_values import (
    JsonNumber,
    Problem,
    ValueProblem,
    coerce,
    convert,
    is_uuid,
    read_type,
)
from streaming.decode.rejects import shown
from streaming.kernels.buffers import offsets_and_bytes
from streaming.kernels.text_encodings import base64_decode

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
JSON_TEXT = "io.debezium.data.Json"
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
DAYS = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
# Units of the integer times and timestamps, as microseconds: (multiply, divide).
TIMESTAMP_UNITS = {
    "io.debezium.time.Timestamp": (1000, 1),
    "org.apache.kafka.connect.data.Timestamp": (1000, 1),
    "io.debezium.time.MicroTimestamp": (1, 1),
    "io.debezium.time.NanoTimestamp": (1, 1000),
}
TIME_UNITS = {
    "io.debezium.time.Time": (1000, 1),
    "org.apache.kafka.connect.data.Time": (1000, 1),
    "io.debezium.time.MicroTime": (1, 1),
    "io.debezium.time.NanoTime": (1, 1000),
}
_NUMBERS = ("int8", "int16", "int32", "int64", "float", "float32", "double", "float64")
_FLOATS = ("float", "float32", "double", "float64")
# A decimal128 holds 16 bytes: a longer unscaled integer has more digits than any column takes.
_DECIMAL_BYTES = 16


@dataclass(frozen=True)
class Wire:
    """How the connector spells one column: its Connect type, its logical name, a Decimal's scale,
    an array's element spelling."""

    type: str
    name: str = ""
    scale: int | None = None
    items: Wire | None = None

    @classmethod
    def of_schema(cls, schema: dict) -> Wire:
        """The spelling a Connect field schema (as the JSON converter writes it) names."""
        parameters = schema.get("parameters") or {}
        scale = parameters.get("scale")
        items = schema.get("items")
        return cls(
            type=str(schema.get("type", "")),
            name=str(schema.get("name", "")),
            scale=int(scale) if scale is not None else None,
            items=cls.of_schema(items) if isinstance(items, dict) else None,
        )

    @property
    def is_decimal(self) -> bool:
        return self.name in (DECIMAL, VARIABLE_SCALE_DECIMAL)


_AVRO_CONNECT_TYPES = {"int": "int32", "long": "int64", "float": "float", "double": "double", "boolean": "boolean"}


def avro_wire(kind: str, connect_name: str, scale: int | None) -> Wire:
    """The spelling of a column an Avro converter wrote: its Avro type and the Connect type's
    name and scale the converter notes in the schema."""
    return Wire(_AVRO_CONNECT_TYPES.get(kind, kind), connect_name, scale)


def default_wire(target: pa.DataType) -> Wire | None:
    """The spelling the connector's default settings give a PostgreSQL column of the type a
    contract column of `target` mirrors; None where the value is read as the target itself."""
    if pa.types.is_decimal(target):
        return Wire("bytes", DECIMAL, target.scale)
    if pa.types.is_date(target):
        return Wire("int32", DAYS[0])
    if pa.types.is_time(target):
        return Wire("int64", "io.debezium.time.MicroTime")
    if pa.types.is_timestamp(target):
        return Wire("string", ZONED_TIMESTAMP) if target.tz else Wire("int64", "io.debezium.time.MicroTimestamp")
    if is_uuid(target):
        return Wire("string", "io.debezium.data.Uuid")
    if pa.types.is_list(target) or pa.types.is_large_list(target):
        return Wire("array", items=default_wire(target.value_type) or Wire(""))
    if pa.types.is_struct(target) or pa.types.is_map(target):
        return Wire("string", JSON_TEXT)
    return None


def wire_read_type(wire: Wire | None, target: pa.DataType) -> pa.DataType | None:
    """What the JSON reader reads for a column of `target` spelt `wire`; None: as before this
    module (the target itself; bytes as base64 text), converted by the caller."""
    if wire is None:
        return None
    if wire.name == VARIABLE_SCALE_DECIMAL:
        return pa.struct([("scale", pa.int32()), ("value", pa.string())])
    if wire.name == DECIMAL or wire.type == "bytes" and pa.types.is_decimal(target):
        return pa.string()
    if wire.type == "array":
        if not (pa.types.is_list(target) or pa.types.is_large_list(target)):
            return None
        element = wire_read_type(wire.items, target.value_type) if wire.items else None
        return pa.list_(element or read_type(target.value_type))
    if wire.name in DAYS or wire.name in TIME_UNITS or wire.name in TIMESTAMP_UNITS:
        return pa.int64()
    if wire.type in _FLOATS and (pa.types.is_decimal(target) or pa.types.is_string(target)):
        return pa.float64()
    if wire.type in _NUMBERS and pa.types.is_decimal(target):
        return pa.int64()
    if wire.type == "string" and not pa.types.is_binary(target):
        return pa.string()
    if wire.type == "struct" and (pa.types.is_struct(target) or pa.types.is_map(target)):
        return read_type(target)
    return None


def to_column(
    read: pa.Array, wire: Wire, target: pa.DataType, path: str, rows: np.ndarray
) -> tuple[pa.Array, list[Problem]]:
    """Values the reader read (`wire_read_type(wire, target)`) as `target`; rows[i] is the record
    of value i. A value that does not fit is null, with a problem naming its record and path."""
    problems: list[Problem] = []
    return _to_column(read, wire, target, path, rows, problems), problems


def _to_column(
    read: pa.Array, wire: Wire, target: pa.DataType, path: str, rows: np.ndarray, problems: list[Problem]
) -> pa.Array:
    if pa.types.is_list(read.type) and (pa.types.is_list(target) or pa.types.is_large_list(target)):
        return _list(read, wire, target, path, rows, problems)
    if wire.is_decimal or (pa.types.is_decimal(target) and wire.type == "bytes"):
        exact = _unscaled(read, wire, target, path, rows, problems)
        return _cast_rows(exact, target, path, rows, problems)
    if wire.name in DAYS and pa.types.is_integer(read.type):
        return _cast_rows(read.cast(pa.int32()).cast(pa.date32()), target, path, rows, problems)
    if wire.name in TIMESTAMP_UNITS and pa.types.is_integer(read.type):
        multiply, divide = TIMESTAMP_UNITS[wire.name]
        micros = pc.divide(pc.multiply(read.cast(pa.int64()), multiply), divide)
        values = micros.cast(pa.timestamp("us"))
        if pa.types.is_timestamp(target) and target.tz:
            values = values.cast(pa.timestamp("us", tz="UTC"))  # a timestamp without zone, taken as UTC
        return _cast_rows(values, target, path, rows, problems)
    if wire.name in TIME_UNITS and pa.types.is_integer(read.type):
        multiply, divide = TIME_UNITS[wire.name]
        micros = pc.divide(pc.multiply(read.cast(pa.int64()), multiply), divide)
        return _cast_rows(micros.cast(pa.time64("us")), target, path, rows, problems)
    if wire.name == ZONED_TIMESTAMP and pa.types.is_timestamp(target):
        zoned = _cast_rows(read, pa.timestamp("us", tz="UTC"), path, rows, problems)
        return zoned if target.tz else zoned.cast(pa.timestamp("us"))
    if pa.types.is_string(read.type) and _is_nested(target):
        return _parsed_json(read, target, path, rows, problems)
    if read.type == read_type(target) and read.type != target or pa.types.is_struct(target):
        converted, found = convert(read, target, path, rows)
        problems.extend(found)
        return converted
    return _cast_rows(read, target, path, rows, problems)


def _is_nested(kind: pa.DataType) -> bool:
    return pa.types.is_struct(kind) or pa.types.is_map(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _list(
    read: pa.Array, wire: Wire, target: pa.DataType, path: str, rows: np.ndarray, problems: list[Problem]
) -> pa.Array:
    """Each element converted by the array's element spelling, over all elements at once."""
    if len(read) and read.offsets[0].as_py() != 0:
        read = pa.concat_arrays([read])  # offsets from 0, as from_arrays wants them
    values = read.values
    parents = rows[pc.list_parent_indices(read).to_numpy()] if len(values) else rows[:0]
    element_wire = wire.items or Wire("")
    if wire_read_type(element_wire, target.value_type) is None:
        converted, found = convert(values, target.value_type, f"{path}[]", parents)
        problems.extend(found)
    else:
        converted = _to_column(values, element_wire, target.value_type, f"{path}[]", parents, problems)
    if not target.value_field.nullable:
        for row in np.unique(parents[pc.is_null(converted).to_numpy(zero_copy_only=False)]):
            problems.append((int(row), f"{path}[]: an element is null, and the list's elements are required"))
    return pa.ListArray.from_arrays(read.offsets, converted, type=pa.list_(target.value_field), mask=read.is_null())


def _unscaled(
    read: pa.Array, wire: Wire, target: pa.DataType, path: str, rows: np.ndarray, problems: list[Problem]
) -> pa.Array:
    """A numeric in any decimal.handling.mode as an exact Arrow value: precise mode's base64 (at the
    schema's scale, else the column's) and VariableScaleDecimal's {scale, value} as decimal128(38,
    scale), string mode's text as itself (cast after), double mode's number as a double."""
    if pa.types.is_floating(read.type) or pa.types.is_integer(read.type):
        return read
    if pa.types.is_struct(read.type):
        scales = pc.fill_null(pc.struct_field(read, "scale"), 0).to_numpy(zero_copy_only=False)
        texts = pc.if_else(pc.is_valid(read), pc.struct_field(read, "value"), pa.nulls(len(read), pa.string()))
        # Each scale's values decoded at it, and all brought to the widest, which loses no digit
        # (for a string column: each as its text at its own scale).
        widest = int(scales.max()) if len(scales) else 0
        out = pa.nulls(len(read), pa.string() if pa.types.is_string(target) else pa.decimal128(38, widest))
        for scale in np.unique(scales):
            at = scales == scale
            part = _base64_decimals(texts.filter(pa.array(at)), int(scale), path, rows[at], problems)
            out = _placed(out, part.cast(out.type), at)
        return out
    if wire.name != DECIMAL and wire.type != "bytes":
        return read  # string mode: the decimal's text
    scale = wire.scale if wire.scale is not None else (target.scale if pa.types.is_decimal(target) else 0)
    return _base64_decimals(read, scale, path, rows, problems)


def _placed(into: pa.Array, values: pa.Array, at: np.ndarray) -> pa.Array:
    """`into` with its elements where `at` is set taken from `values` (one per set element)."""
    index = np.zeros(len(into), dtype=np.int64)
    index[at] = np.arange(int(at.sum()))
    return pc.if_else(pa.array(at), values.take(pa.array(index)) if len(values) else into, into)


def _base64_decimals(texts: pa.Array, scale: int, path: str, rows: np.ndarray, problems: list[Problem]) -> pa.Array:
    """Big-endian two's-complement unscaled integers (their base64 text, or the bytes themselves)
    as decimal128(38, scale), decoded over the whole array: each value's bytes reversed into a 16-byte little-endian word whose
    higher bytes take the sign."""
    n = len(texts)
    valid = pc.is_valid(texts).to_numpy(zero_copy_only=False)
    if pa.types.is_binary(texts.type):  # an Avro converter's bytes, no base64
        blobs, ok = pc.fill_null(texts, b""), np.ones(n, dtype=bool)
    else:
        blobs, ok = base64_decode(texts)
    offsets, data = offsets_and_bytes(blobs)
    offsets = offsets.astype(np.int64)
    lengths = np.diff(offsets)
    fits = ok & (lengths <= _DECIMAL_BYTES)
    for i in np.flatnonzero(valid & ~fits):
        what = "not base64 text" if not ok[i] else "more digits than a decimal holds"
        problems.append((int(rows[i]), f"{path}: {shown(texts[int(i)].as_py())} is {what}"))
    lengths = np.where(fits, lengths, 0)
    words = np.zeros((n, _DECIMAL_BYTES), dtype=np.uint8)
    first = data[offsets[:-1][lengths > 0]] if data.size else np.zeros(0, np.uint8)
    negative = np.zeros(n, dtype=bool)
    negative[lengths > 0] = first >= 0x80
    words[negative] = 0xFF
    owner = np.repeat(np.arange(n), lengths)
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    source = np.repeat(offsets[:-1], lengths) + within
    words[owner, np.repeat(lengths, lengths) - 1 - within] = data[source]
    values = pa.Array.from_buffers(pa.decimal128(38, scale), n, [None, pa.py_buffer(words.tobytes())])
    keep = valid & fits
    return pc.if_else(pa.array(keep), values, pa.nulls(n, values.type))


def _cast_rows(values: pa.Array, target: pa.DataType, path: str, rows: np.ndarray, problems: list[Problem]) -> pa.Array:
    """values cast to target at once; if some do not fit, each value alone, those nulls with a
    problem naming the value."""
    if values.type == target:
        return values
    try:
        return values.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    out: list[Any] = []
    for i in range(len(values)):
        one = values.slice(i, 1)
        try:
            out.append(one.cast(target)[0].as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            problems.append((int(rows[i]), f"{path}: expected {_described(target)}, got {shown(one[0].as_py())}"))
            out.append(None)
    if is_uuid(target):
        return pa.array(out, pa.binary(16)).cast(target)
    return pa.array(out, target)


def _described(target: pa.DataType) -> str:
    if pa.types.is_decimal(target):
        return f"decimal({target.precision}, {target.scale})"
    if is_uuid(target):
        return "uuid"
    return str(target)


def _parsed_json(read: pa.Array, target: pa.DataType, path: str, rows: np.ndarray, problems: list[Problem]) -> pa.Array:
    """JSON texts (a jsonb's) as a struct, map or list: read as one block when the reader can (each text
    one line of `{"v": <text>}`), else one by one; then converted as the JSON formats convert."""
    kind = read_type(target)
    read_values = _block_read(read, kind)
    if read_values is None:
        parsed: list[Any] = []
        for i, text in enumerate(read.to_pylist()):
            if text is None:
                parsed.append(None)
                continue
            try:
                parsed.append(coerce(json.loads(text, parse_float=JsonNumber), target, path))
            except ValueError as exc:
                detail = str(exc) if isinstance(exc, ValueProblem) else f"{path}: {shown(text)} is not JSON text"
                problems.append((int(rows[i]), detail))
                parsed.append(None)
        read_values = pa.array(parsed, kind)
    converted, found = convert(read_values, target, path, rows)
    problems.extend(found)
    return converted


def _block_read(texts: pa.Array, kind: pa.DataType) -> pa.Array | None:
    if pa.types.is_map(kind) or len(texts) == 0:
        return None
    lines = pc.binary_join_element_wise('{"v":', pc.fill_null(texts, "null"), "}\n", "")
    offsets, data = offsets_and_bytes(lines.cast(pa.binary()))
    block = pa.py_buffer(data[offsets[0] : offsets[-1]].tobytes())
    try:
        table = pa_json.read_json(
            pa.BufferReader(block),
            parse_options=pa_json.ParseOptions(explicit_schema=pa.schema([("v", kind)])),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(block.size + 1, 1 << 20)),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(texts):  # a text holding several documents, or a line break
        return None
    return table.column("v").combine_chunks()
