"""Python values as an Arrow array of a column's data-file type, nested or not: what the general
readers of registry-encoded records (fastavro's records, Protobuf messages walked to dicts) hand
over, converted value by value, checking each against the type and naming the path of every value
that does not fit (`properties.reading[3].value: expected double, got 'n/a'`).

What a value may be, per type (the types a record's reader gives, and the lossless ones beside):

- struct: a dict (an Avro record, a Protobuf message); members by name, others ignored; a required
  member missing or null is a problem;
- list: a list or tuple; map: a dict (its keys of the map's key type) or a list of (key, value) pairs;
- string: a str (an enum's name), or a UUID (its canonical text); boolean: a bool;
- int / long: an int (not a bool) in range, a whole float, or an enum value's number (NamedNumber);
  float / double: an int or a float (not a bool);
- decimal(P, S): a Decimal or an int whose digits fit P and S (none dropped);
- date: a date (not a datetime); time: a time (its time zone, if any, dropped);
- timestamptz: a datetime; one without a time zone is taken as UTC;
  timestamp: a datetime without a time zone, or one with, as its UTC wall-clock time;
- uuid: a UUID, its canonical text, or 16 bytes;
- binary: bytes; fixed[N]: bytes of length N.
"""

from __future__ import annotations

import datetime
import decimal
import math
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from streaming.decode.json_values import ValueProblem, _described, is_uuid
from streaming.decode.rejects import shown

# (the index of the value in the input, what is wrong with it, path first)
Problem = tuple[int, str]

_UTC = datetime.UTC


class NamedNumber(str):
    """An enum value: its name, which a string column takes, and its number, which an integer
    column takes (a Protobuf enum; columns of either type read them)."""

    number: int

    def __new__(cls, name: str, number: int) -> NamedNumber:
        named = super().__new__(cls, name)
        named.number = number
        return named


def to_arrow(values: Sequence[Any], kind: pa.DataType, path: str) -> tuple[pa.Array, list[Problem]]:
    """`values` as an array of `kind`: a value that does not fit is null, and a problem naming its
    index and the path of its part that does not fit (the first such part)."""
    problems: list[Problem] = []
    built: list[Any] = []
    for i, value in enumerate(values):
        try:
            built.append(coerce(value, kind, path))
        except ValueProblem as exc:
            problems.append((i, str(exc)))
            built.append(None)
    build = storage_type(kind)
    array = pa.array(built, build)
    return (array if build == kind else array.cast(kind)), problems


def storage_type(kind: pa.DataType) -> pa.DataType:
    """`kind` with each UUID as its 16 bytes: pyarrow builds no extension type from Python values."""
    if is_uuid(kind):
        return pa.binary(16)
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(storage_type(f.type)) for f in kind])
    if pa.types.is_map(kind):
        return pa.map_(
            kind.key_field.with_type(storage_type(kind.key_type)),
            kind.item_field.with_type(storage_type(kind.item_type)),
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(kind.value_field.with_type(storage_type(kind.value_type)))
    return kind


def coerce(value: Any, kind: pa.DataType, path: str) -> Any:
    """One value as pyarrow builds `storage_type(kind)` from it; raises ValueProblem naming the path
    of the part that does not fit."""
    if value is None:
        return None
    if pa.types.is_struct(kind):
        if not isinstance(value, dict):
            raise ValueProblem(f"{path}: expected a record, got {shown(value)}")
        out = {}
        for f in kind:
            member = coerce(value.get(f.name), f.type, f"{path}.{f.name}")
            if member is None and not f.nullable:
                raise ValueProblem(f"{path}.{f.name}: required, but missing or null")
            out[f.name] = member
        return out
    if pa.types.is_map(kind):
        pairs: list[Any] = list(value.items()) if isinstance(value, dict) else value
        if not isinstance(pairs, list | tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
            raise ValueProblem(f"{path}: expected a map, got {shown(value)}")
        entries = []
        for key, item in pairs:
            key_out = coerce(key, kind.key_type, f"{path} (a key)")
            if key_out is None:
                raise ValueProblem(f"{path}: a null key")
            item_out = coerce(item, kind.item_type, f"{path}.{key}")
            if item_out is None and not kind.item_field.nullable:
                raise ValueProblem(f"{path}.{key}: required, but null")
            entries.append((key_out, item_out))
        return entries
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if not isinstance(value, list | tuple):
            raise ValueProblem(f"{path}: expected an array, got {shown(value)}")
        items = []
        for i, item in enumerate(value):
            item_out = coerce(item, kind.value_type, f"{path}[{i}]")
            if item_out is None and not kind.value_field.nullable:
                raise ValueProblem(f"{path}[{i}]: required, but null")
            items.append(item_out)
        return items
    try:
        return _scalar(value, kind)
    except (TypeError, ValueError, OverflowError, decimal.InvalidOperation, pa.ArrowInvalid):
        raise ValueProblem(f"{path}: expected {_described(kind)}, got {shown(value)}") from None


def _scalar(value: Any, kind: pa.DataType) -> Any:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if isinstance(value, uuid.UUID):
            return str(value)
        if not isinstance(value, str):
            raise TypeError
        return str(value)
    if pa.types.is_boolean(kind):
        if not isinstance(value, bool):
            raise TypeError
        return value
    if pa.types.is_integer(kind):
        if isinstance(value, NamedNumber):
            value = value.number
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # a whole double fits, as the columnar path's safe cast takes it
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError
        pa.scalar(value, kind)  # range check
        return value
    if pa.types.is_floating(kind):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        number = float(value)
        if math.isinf(number) and not math.isinf(value):
            raise ValueError("out of the double range")
        return number
    if pa.types.is_decimal(kind):
        if isinstance(value, bool) or not isinstance(value, int | decimal.Decimal):
            raise TypeError
        exact = decimal.Decimal(value)
        pa.scalar(exact, kind)  # precision and scale: no digit is dropped
        return exact
    if is_uuid(kind):
        if isinstance(value, uuid.UUID):
            return value.bytes
        if isinstance(value, str):
            return uuid.UUID(value).bytes
        if isinstance(value, bytes) and len(value) == 16:
            return value
        raise TypeError
    if pa.types.is_fixed_size_binary(kind):
        if not isinstance(value, bytes) or len(value) != kind.byte_width:
            raise TypeError
        return value
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        if not isinstance(value, bytes):
            raise TypeError
        return value
    if pa.types.is_timestamp(kind):
        if not isinstance(value, datetime.datetime):
            raise TypeError
        if kind.tz is not None:
            return value if value.tzinfo is not None else value.replace(tzinfo=_UTC)
        return value if value.tzinfo is None else value.astimezone(_UTC).replace(tzinfo=None)
    if pa.types.is_date(kind):
        if isinstance(value, datetime.datetime) or not isinstance(value, datetime.date):
            raise TypeError
        return value
    if pa.types.is_time(kind):
        if not isinstance(value, datetime.time):
            raise TypeError
        return value.replace(tzinfo=None)
    raise TypeError
