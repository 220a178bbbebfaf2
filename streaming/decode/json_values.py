"""JSON values as column types, nested or not: what pyarrow's JSON reader reads for each type, the
conversion of what it read to the type (vectorized, naming the path of every value that does not
fit), and the same reading of one parsed value for the documents read one by one.

The reader reads structs, lists, numbers, booleans, strings, decimals and timestamps as they are.
The rest is read as the JSON value that spells it and converted after: a date, a time and a UUID
from their ISO / canonical text, fixed-size bytes from a string (its UTF-8 bytes, as a binary column
takes them), a map from an object of any members (the reader takes none, so documents of a table
with a map column are read one by one, as `key`/`value` pairs).
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from streaming.contract.types import arrow_type_holds
from streaming.decode.rejects import shown
from streaming.kernels.buffers import from_zero_offsets, offsets_with_nulls
from streaming.kernels.text_encodings import hex_decode

# (the document the value came from, what is wrong with it, path first)
Problem = tuple[int, str]

_TEXT_READ = (pa.types.is_date, pa.types.is_time)


class JsonNumber(float):
    """A JSON number with a fraction or an exponent, as a float that keeps the text it was read
    from: a decimal column takes the text's digits, all 38 of them, not the nearest double's."""

    text: str

    def __new__(cls, text: str) -> JsonNumber:
        number = super().__new__(cls, text)
        number.text = text
        return number


class ValueProblem(ValueError):
    """One value that does not fit its type; the message names its path."""


def is_uuid(kind: pa.DataType) -> bool:
    return isinstance(kind, pa.BaseExtensionType) and kind.extension_name == "arrow.uuid"


def read_type(kind: pa.DataType) -> pa.DataType:
    """What the JSON reader (or `coerce`) reads for a value of `kind`."""
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(read_type(f.type)).with_nullable(True) for f in kind])
    if pa.types.is_map(kind):
        return pa.list_(pa.struct([("key", pa.string()), ("value", read_type(kind.item_type))]))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(read_type(kind.value_type))
    if is_uuid(kind) or any(test(kind) for test in _TEXT_READ):
        return pa.string()
    if pa.types.is_fixed_size_binary(kind):
        return pa.binary()
    return kind


def has_map(kind: pa.DataType) -> bool:
    """Whether a map is anywhere in `kind`: the block reader reads none."""
    if pa.types.is_map(kind):
        return True
    if pa.types.is_struct(kind):
        return any(has_map(f.type) for f in kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return has_map(kind.value_type)
    return False


def holds_decimal(kind: pa.DataType) -> bool:
    """Whether a decimal is anywhere in `kind`: its JSON numbers are read from their text."""
    return arrow_type_holds(kind, pa.types.is_decimal)


def needs_conversion(kind: pa.DataType) -> bool:
    """Whether what the reader reads for `kind` is not yet `kind`, or holds required members."""
    if pa.types.is_struct(kind):
        return any(not f.nullable or needs_conversion(f.type) for f in kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return not kind.value_field.nullable or needs_conversion(kind.value_type)
    return read_type(kind) != kind


# -- one parsed value ---------------------------------------------------------------------------------
def coerce(value: Any, kind: pa.DataType, path: str) -> Any:
    """A value json.loads made, as the reader would read it for `kind` (see `read_type`); raises
    ValueProblem naming the path of the part that does not fit."""
    if value is None:
        return None
    if pa.types.is_struct(kind):
        if not isinstance(value, dict):
            raise ValueProblem(f"{path}: expected an object, got {shown(value)}")
        return {f.name: coerce(value.get(f.name), f.type, f"{path}.{f.name}") for f in kind}
    if pa.types.is_map(kind):
        if not isinstance(value, dict):
            raise ValueProblem(f"{path}: expected an object, got {shown(value)}")
        return [{"key": key, "value": coerce(item, kind.item_type, f"{path}.{key}")} for key, item in value.items()]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if not isinstance(value, list):
            raise ValueProblem(f"{path}: expected an array, got {shown(value)}")
        return [coerce(item, kind.value_type, f"{path}[{i}]") for i, item in enumerate(value)]
    try:
        return _coerce_scalar(value, kind)
    except (TypeError, ValueError, OverflowError, decimal.InvalidOperation, pa.ArrowInvalid):
        raise ValueProblem(_mismatch(path, value, kind)) from None


def _coerce_scalar(value: Any, kind: pa.DataType) -> Any:
    if pa.types.is_string(kind) or is_uuid(kind) or any(test(kind) for test in _TEXT_READ):
        if not isinstance(value, str):
            raise TypeError
        return value
    if pa.types.is_boolean(kind):
        if not isinstance(value, bool):
            raise TypeError
        return value
    if pa.types.is_integer(kind):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError
        pa.scalar(value, kind)  # range check
        return value
    if pa.types.is_floating(kind):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        if not math.isfinite(float(value)):
            raise ValueError("out of the double range")
        return float(value)
    if pa.types.is_decimal(kind):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError
        number = decimal.Decimal(value.text if isinstance(value, JsonNumber) else str(value))
        pa.scalar(number, kind)  # precision and scale: no digit is dropped
        return number
    if pa.types.is_binary(kind) or pa.types.is_fixed_size_binary(kind):
        if not isinstance(value, str):
            raise TypeError
        return value.encode("utf-8")
    if pa.types.is_timestamp(kind):
        if not isinstance(value, str):
            raise TypeError
        return _reader_timestamp(value, kind)
    raise TypeError


def _reader_timestamp(value: str, kind: pa.DataType) -> Any:
    """pyarrow's reader takes other spellings than datetime.fromisoformat and casts: ask it."""
    line = pa.py_buffer(json.dumps({"v": value}).encode() + b"\n")
    read = pa_json.read_json(
        pa.BufferReader(line),
        parse_options=pa_json.ParseOptions(explicit_schema=pa.schema([("v", kind)])),
        read_options=pa_json.ReadOptions(use_threads=False),
    )
    return read.column("v")[0].as_py()


def _described(kind: pa.DataType) -> str:
    """The type as a contract names it."""
    if is_uuid(kind):
        return "uuid"
    if pa.types.is_date(kind):
        return "date (YYYY-MM-DD)"
    if pa.types.is_time(kind):
        return "time (HH:MM:SS[.ffffff])"
    if pa.types.is_fixed_size_binary(kind):
        return f"fixed[{kind.byte_width}]"
    if pa.types.is_decimal(kind):
        return f"decimal({kind.precision}, {kind.scale})"
    if pa.types.is_timestamp(kind):
        return "timestamptz" if kind.tz else "timestamp"
    if pa.types.is_integer(kind):
        return "long" if kind.bit_width == 64 else "int"
    if pa.types.is_floating(kind):
        return "double" if kind.bit_width == 64 else "float"
    if pa.types.is_boolean(kind):
        return "boolean"
    return str(kind)


def _mismatch(path: str, value: Any, kind: pa.DataType) -> str:
    return f"{path}: expected {_described(kind)}, got {shown(value)}"


# -- what the reader read, converted ------------------------------------------------------------------
def convert(read: pa.Array, kind: pa.DataType, path: str, rows: np.ndarray) -> tuple[pa.Array, list[Problem]]:
    """`read` (of `read_type(kind)`) as `kind`; `rows[i]` is the document of element i. Values that
    do not fit are null, each with a problem naming its document and path (the first per document
    counts), as are missing required members."""
    problems: list[Problem] = []
    out = _convert(read, kind, path, rows, problems)
    return out, problems


def _convert(read: pa.Array, kind: pa.DataType, path: str, rows: np.ndarray, problems: list[Problem]) -> pa.Array:
    if pa.types.is_struct(kind):
        return _struct(read, kind, path, rows, problems)
    if pa.types.is_map(kind):
        return _map(read, kind, path, rows, problems)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _list(read, kind, path, rows, problems)
    if read.type == kind:
        return read
    if pa.types.is_date(kind):
        return _by_value(read, kind, path, rows, problems, lambda s: datetime.date.fromisoformat(s))
    if pa.types.is_time(kind):
        return _by_value(read, kind, path, rows, problems, lambda s: datetime.time.fromisoformat(s))
    if is_uuid(kind):
        return _uuids(read, kind, path, rows, problems)
    if pa.types.is_fixed_size_binary(kind):
        lengths = pc.binary_length(read).to_numpy(zero_copy_only=False)
        wrong = pc.is_valid(read).to_numpy(zero_copy_only=False) & (lengths != kind.byte_width)
        for i in np.flatnonzero(wrong):
            problems.append((int(rows[i]), _mismatch(path, read[int(i)].as_py(), kind)))
        return pc.if_else(pa.array(wrong), pa.nulls(len(read), read.type), read).cast(kind)
    return read.cast(kind)


def _struct(read: pa.Array, kind: pa.StructType, path: str, rows: np.ndarray, problems: list[Problem]) -> pa.Array:
    valid = pc.is_valid(read).to_numpy(zero_copy_only=False)
    children = []
    for field in kind:
        child = pc.struct_field(read, field.name) if len(read) else pa.array([], read_type(field.type))
        converted = _convert(child, field.type, f"{path}.{field.name}", rows, problems)
        if not field.nullable:
            missing = valid & pc.is_null(converted).to_numpy(zero_copy_only=False)
            for i in np.flatnonzero(missing):
                problems.append((int(rows[i]), f"{path}.{field.name}: required, but missing or null"))
        children.append(converted)
    mask = pa.array(~valid) if not valid.all() else None
    return pa.StructArray.from_arrays(children, fields=list(kind), mask=mask)


def _list(read: pa.Array, kind: pa.DataType, path: str, rows: np.ndarray, problems: list[Problem]) -> pa.Array:
    read = from_zero_offsets(read)
    values = read.values
    parents = rows[pc.list_parent_indices(read).to_numpy()] if len(values) else rows[:0]
    converted = _convert(values, kind.value_type, f"{path}[]", parents, problems)
    if not kind.value_field.nullable:
        for row in np.unique(parents[pc.is_null(converted).to_numpy(zero_copy_only=False)]):
            problems.append((int(row), f"{path}[]: an element is null, and the list's elements are required"))
    return pa.ListArray.from_arrays(read.offsets, converted, type=pa.list_(kind.value_field), mask=read.is_null())


def _map(read: pa.Array, kind: pa.MapType, path: str, rows: np.ndarray, problems: list[Problem]) -> pa.Array:
    read = from_zero_offsets(read)
    entries = read.values
    parents = rows[pc.list_parent_indices(read).to_numpy()] if len(entries) else rows[:0]
    keys = pc.struct_field(entries, "key") if len(entries) else pa.array([], pa.string())
    items = pc.struct_field(entries, "value") if len(entries) else pa.array([], read_type(kind.item_type))
    if not pa.types.is_string(kind.key_type):
        keys = _by_value(keys, kind.key_type, f"{path} (a key)", parents, problems, _key_parser(kind.key_type))
    values = _convert(items, kind.item_type, f"{path}{{}}", parents, problems)
    if not kind.item_field.nullable:
        for row in np.unique(parents[pc.is_null(values).to_numpy(zero_copy_only=False)]):
            problems.append((int(row), f"{path}: a value is null, and the map's values are required"))
    return pa.MapArray.from_arrays(offsets_with_nulls(read), keys, values, type=kind)


def _key_parser(kind: pa.DataType):
    if pa.types.is_integer(kind):
        return int
    if pa.types.is_floating(kind):
        return float
    if pa.types.is_decimal(kind):
        return decimal.Decimal
    if pa.types.is_date(kind):
        return datetime.date.fromisoformat
    if is_uuid(kind):
        return lambda s: uuid.UUID(s).bytes
    return lambda s: s


def _by_value(
    read: pa.Array, kind: pa.DataType, path: str, rows: np.ndarray, problems: list[Problem], parse
) -> pa.Array:
    """Text parsed value by value: dates, times and keys are seldom enough that Python's own
    parsers (exact ISO 8601, the error each raises) cost little beside the reader's pass."""
    out: list[Any] = []
    for i, text in enumerate(read.to_pylist()):
        if text is None:
            out.append(None)
            continue
        try:
            out.append(parse(text))
        except (ValueError, TypeError, ArithmeticError):
            problems.append((int(rows[i]), _mismatch(path, text, kind)))
            out.append(None)
    if is_uuid(kind):
        return pa.array(out, pa.binary(16)).cast(kind)
    return pa.array(out, kind)


def _uuids(read: pa.Array, kind: pa.DataType, path: str, rows: np.ndarray, problems: list[Problem]) -> pa.Array:
    """Canonical UUID text (hyphens anywhere, either case) to 16 bytes, over the whole array."""
    decoded, hexadecimal = hex_decode(pc.replace_substring(read, "-", ""))
    valid = pc.is_valid(read).to_numpy(zero_copy_only=False)
    keep = hexadecimal & (pc.binary_length(decoded).to_numpy(zero_copy_only=False) == 16)
    for i in np.flatnonzero(valid & ~keep):
        problems.append((int(rows[i]), _mismatch(path, read[int(i)].as_py(), kind)))
    sixteen = pc.if_else(pa.array(keep), decoded, pa.nulls(len(read), pa.binary()))
    return sixteen.cast(pa.binary(16)).cast(kind)
