"""Data files read by field id: each file's columns as the table's current (or a past) schema has
them, whatever schema the file was written under."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StructType

from streaming.contract import regular_types


class QueryError(RuntimeError):
    """The table cannot be queried as laid out (missing properties, delete files, unreadable files, ...)."""


def result_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of an Iceberg schema as the data files store it: regular (not large)
    strings and binaries."""
    return regular_types(schema_to_pyarrow(schema, include_field_ids=False))


# -- reading data files by field id -----------------------------------------------------------------
PARQUET_FIELD_ID = b"PARQUET:field_id"


class FieldIdProjection:
    """Data files read as one Iceberg schema has the table, whatever schema they were written under.

    Iceberg knows a column by its field id, and every data file carries the ids in its Parquet
    schema (`PARQUET:field_id`), so a file written before a column was renamed, widened, dropped
    or added (`geoingest table evolve`) still reads right: each file column is found by its id and
    takes the schema's name and type, a column the file lacks (added later) is all nulls, and one
    the schema lacks (dropped) is not read. Whole columns at a time; no row passes through Python.
    A file without any field id (not written by geoingest or Spark) is matched by name instead.
    """

    def __init__(self, schema: Schema):
        self.schema = schema
        self.arrow_schema = result_schema(schema)
        self._ids = {f.field_id for f in schema.fields}
        self._names = {f.name for f in schema.fields}

    def columns_to_read(self, file_schema: pa.Schema) -> list[str]:
        """The file's top-level columns that the schema has: the only ones worth reading."""
        if not _has_field_ids(file_schema):
            return [f.name for f in file_schema if f.name in self._names]
        return [f.name for f in file_schema if _field_id(f) in self._ids]

    def paths_in_file(self, file_schema: pa.Schema, field_ids: Sequence[int], paths: Sequence[str]) -> list[str | None]:
        """The file's column paths (as its row group statistics name them) of the fields
        `field_ids`, whose paths in the schema are `paths`; None for a field the file lacks."""
        if not _has_field_ids(file_schema):
            return list(paths)
        in_file = _paths_by_field_id(file_schema)
        return [in_file.get(field_id) for field_id in field_ids]

    def __call__(self, rows: pa.Table, where: str) -> pa.Table:
        """`rows`, read from the data file `where`, as the schema has them."""
        by_id = _has_field_ids(rows.schema)
        position = {(_field_id(f) if by_id else f.name): i for i, f in enumerate(rows.schema)}
        columns = []
        for field, target in zip(self.schema.fields, self.arrow_schema):
            i = position.get(field.field_id if by_id else field.name)
            if i is None:
                if field.required:
                    raise QueryError(
                        f"{where}: the data file lacks the required column {field.name!r} (id {field.field_id})"
                    )
                columns.append(pa.chunked_array([pa.nulls(rows.num_rows, target.type)], target.type))
            else:
                columns.append(_conformed(rows.column(i), field, target, where))
        return pa.Table.from_arrays(columns, schema=self.arrow_schema)


def _field_id(field: pa.Field) -> int | None:
    raw = (field.metadata or {}).get(PARQUET_FIELD_ID)
    return None if raw is None else int(raw)


def _has_field_ids(schema: pa.Schema) -> bool:
    return any(_field_id(f) is not None for f in schema)


def _paths_by_field_id(schema: pa.Schema) -> dict[int, str]:
    """Field id -> dotted path of every field, nested ones included (the paths Parquet's column
    chunks have, for the fields this schema nests in structs only)."""
    paths: dict[int, str] = {}

    def visit(fields: Sequence[pa.Field], prefix: str) -> None:
        for f in fields:
            field_id = _field_id(f)
            if field_id is not None:
                paths[field_id] = prefix + f.name
            if pa.types.is_struct(f.type):
                visit(list(f.type), f"{prefix}{f.name}.")

    visit(list(schema), "")
    return paths


def _conformed(column: pa.ChunkedArray, field: NestedField, target: pa.Field, where: str) -> pa.ChunkedArray:
    """A file's column as the schema's `field` (Arrow: `target`) has it."""
    if column.type.equals(target.type):  # the common case: nothing to do (field metadata aside)
        return column
    if isinstance(field.field_type, StructType) and pa.types.is_struct(column.type):
        return _struct_by_field_id(column, field.field_type, target, where)
    try:
        # A widened column (int -> long, float -> double), or a string of another width.
        return column.cast(target.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise QueryError(
            f"{where}: column {field.name!r} (id {field.field_id}) is {column.type} in the data file, "
            f"which does not convert to the table's {target.type} ({exc})"
        ) from None


def _struct_by_field_id(column: pa.ChunkedArray, struct: StructType, target: pa.Field, where: str) -> pa.ChunkedArray:
    """A struct column whose fields changed: each of its fields found by id, as the top level's."""
    array = column.combine_chunks()
    position = {_field_id(f): i for i, f in enumerate(array.type)}
    children = []
    for nested, child_target in zip(struct.fields, target.type):
        i = position.get(nested.field_id)
        if i is None:
            if nested.required:
                raise QueryError(
                    f"{where}: the data file lacks the required field {nested.name!r} (id {nested.field_id}) "
                    f"of {target.name!r}"
                )
            children.append(pa.nulls(len(array), child_target.type))
        else:
            child = pa.chunked_array([pc.struct_field(array, [i])])
            children.append(_conformed(child, nested, child_target, where).combine_chunks())
    rebuilt = pa.StructArray.from_arrays(children, fields=list(target.type), mask=array.is_null())
    return pa.chunked_array([rebuilt], target.type)
