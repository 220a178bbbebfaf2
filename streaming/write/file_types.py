"""Rows cast between the types they travel in (contract.arrow_schema, where a time is microseconds
and a UUID or fixed-size value plain bytes) and the data files' types (contract.data_file_schema),
either way.

A struct that is null may still hold nulls in its required members (Spark's Arrow exchange and the
Parquet reader leave them so), which Arrow refuses to cast to a non-nullable member; they are filled
with a zero value first, which no reader sees under the null struct. Rows whose required members
are null where the struct is not never get here: the decoder rejects them."""

from __future__ import annotations

import datetime
import decimal
import json

import pyarrow as pa
import pyarrow.compute as pc

from streaming.kernels.buffers import from_zero_offsets, offsets_with_nulls


class WkbGeometry(pa.ExtensionType):
    """WKB as the `geoarrow.wkb` extension type, which pyarrow writes as Parquet's GEOMETRY logical
    type with its geospatial statistics: the data files of native-geometry tables."""

    def __init__(self, crs: str = "OGC:CRS84") -> None:
        self.crs = crs
        super().__init__(pa.binary(), "geoarrow.wkb")

    def __arrow_ext_serialize__(self) -> bytes:
        return json.dumps({"crs": self.crs}).encode()

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> WkbGeometry:
        return cls(json.loads(serialized or b"{}").get("crs", "OGC:CRS84"))


try:
    pa.register_extension_type(WkbGeometry())
except pa.ArrowKeyError:  # a reader of ours, or geoarrow-pyarrow, registered the name before
    pass


def with_native_geometry(schema: pa.Schema, name: str, crs: str) -> pa.Schema:
    """`schema` with column `name` as WkbGeometry in `crs` (its field id kept)."""
    index = schema.get_field_index(name)
    return schema.set(index, schema.field(index).with_type(WkbGeometry(crs)))


def as_types(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table`'s columns named in `schema`, in its types."""
    table = table.select(schema.names)
    columns = [_filled(table.column(f.name).combine_chunks(), f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=table.schema).cast(schema)


def as_type(values: pa.Array, kind: pa.DataType) -> pa.Array:
    """One column's values in `kind`."""
    return _filled(values, kind).cast(kind)


def _filled(values: pa.Array, kind: pa.DataType) -> pa.Array:
    if not _has_required_member(kind):
        return values
    if pa.types.is_list(kind):
        values = from_zero_offsets(values)
        inner = _filled(values.values, kind.value_type)
        return pa.ListArray.from_arrays(values.offsets, inner, type=values.type, mask=_mask(values))
    if pa.types.is_map(kind):
        values = from_zero_offsets(values)
        items = _filled(values.items, kind.item_type)
        return pa.MapArray.from_arrays(offsets_with_nulls(values), values.keys, items, type=values.type)
    children = []
    for field in kind:
        child = _filled(pc.struct_field(values, field.name), field.type)
        if not field.nullable and child.null_count:
            child = pc.fill_null(child, _zero(child.type))
        children.append(child)
    return pa.StructArray.from_arrays(children, fields=list(values.type), mask=_mask(values))


def _has_required_member(kind: pa.DataType) -> bool:
    """Whether a struct, at any depth of `kind`, has a required member."""
    if pa.types.is_struct(kind):
        return any(not f.nullable or _has_required_member(f.type) for f in kind)
    if pa.types.is_list(kind):
        return _has_required_member(kind.value_type)
    if pa.types.is_map(kind):
        return _has_required_member(kind.item_type)
    return False


def _mask(values: pa.Array) -> pa.Array | None:
    return values.is_null() if values.null_count else None


def _zero(kind: pa.DataType) -> pa.Scalar:
    if pa.types.is_struct(kind):
        return pa.scalar({f.name: _zero(f.type).as_py() for f in kind}, kind)
    if pa.types.is_list(kind) or pa.types.is_map(kind):
        return pa.scalar([], kind)
    if pa.types.is_string(kind):
        return pa.scalar("", kind)
    if pa.types.is_binary(kind):
        return pa.scalar(b"", kind)
    if pa.types.is_fixed_size_binary(kind):
        return pa.scalar(bytes(kind.byte_width), kind)
    if pa.types.is_boolean(kind):
        return pa.scalar(False, kind)
    if pa.types.is_decimal(kind):
        return pa.scalar(decimal.Decimal(0), kind)
    if pa.types.is_date(kind):
        return pa.scalar(datetime.date(1970, 1, 1), kind)
    return pa.scalar(0, pa.int64()).cast(kind)
