"""A query's result as users take it away: GeoJSON Features one per line, or a GeoParquet 1.1 file."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO
from uuid import UUID

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import shapely

from streaming.contract import Contract
from streaming.decode.covering import with_covering
from streaming.decode.json_values import has_map
from streaming.kernels.antimeridian import union_x
from streaming.kernels.buffers import from_zero_offsets
from streaming.kernels.geoparquet import geo_metadata
from streaming.kernels.wkb import geometry_type_names
from streaming.read.query import QueryResult


def write_geoparquet(result: QueryResult, contract: Contract, where: str | Path | BinaryIO) -> dict:
    """Write the result as a GeoParquet 1.1 file (WKB geometry, bbox covering, zstd) and return
    its `geo` metadata. The file bbox is that of the rows; an empty result has none."""
    rows = result.table
    g = contract.geometry.name
    if g not in rows.column_names or (contract.bbox_stored and contract.bbox_name not in rows.column_names):
        raise ValueError(f"the result lacks the contract's columns {g!r} and {contract.bbox_name!r}")
    types = sorted(geometry_type_names(rows.column(g))) if rows.num_rows else []
    if rows.num_rows:
        # A table that stores no covering: the file's bbox from the rows' geometries all the same.
        covering = with_covering(rows, contract).column(contract.bbox_name)
        xmin, xmax = pc.struct_field(covering, "xmin"), pc.struct_field(covering, "xmax")
        bbox = (
            pc.min(xmin).as_py(),
            pc.min(pc.struct_field(covering, "ymin")).as_py(),
            pc.max(xmax).as_py(),
            pc.max(pc.struct_field(covering, "ymax")).as_py(),
        )
        if pc.any(pc.greater(xmin, xmax)).as_py():
            # rows across the anti-meridian: the shortest x range covering them all, maybe wrapped
            lo, hi = union_x(xmin.to_numpy(zero_copy_only=False), xmax.to_numpy(zero_copy_only=False))
            bbox = (lo, bbox[1], hi, bbox[3])
        metadata = geo_metadata(contract, types, bbox)
    else:
        metadata = geo_metadata(contract, types, (0.0, 0.0, 0.0, 0.0))
        del metadata["columns"][g]["bbox"]  # optional in GeoParquet; there is nothing to bound
    schema_metadata = dict(rows.schema.metadata or {})
    schema_metadata[b"geo"] = json.dumps(metadata, separators=(",", ":")).encode()
    pq.write_table(
        rows.replace_schema_metadata(schema_metadata),
        where,
        compression="zstd",
        row_group_size=contract.clustering.row_group_rows,
        write_statistics=True,
    )
    return metadata


# -- GeoJSON output -------------------------------------------------------------------------------
def feature_id_column(contract: Contract) -> str | None:
    """The column a GeoJSON Feature's `id` comes from: the primary key's (when it has one column),
    else the first column fed by the event's own `id`, else none."""
    if len(contract.primary_key) == 1:
        return contract.primary_key[0]
    return next((c.name for c in contract.columns if "id" in c.sources), None)


def to_geojson_lines(result: QueryResult, geometry_column: str, id_column: str | None = None) -> Iterator[str]:
    """One GeoJSON Feature per line (GeoJSON text sequence without separators, as `ogr2ogr` and
    `jq` read it): the geometry, every other column as a property, and `id_column` as the id."""
    table = result.table
    if geometry_column not in table.column_names:
        raise ValueError(f"geometry column {geometry_column!r} is not in the result ({table.column_names})")
    property_names = [n for n in table.column_names if n != geometry_column]
    for batch in table.to_batches(max_chunksize=4096):
        geometries = shapely.to_geojson(shapely.from_wkb(batch.column(geometry_column).to_numpy(zero_copy_only=False)))
        columns = {name: _json_values(_json_ready(batch.column(name))) for name in property_names}
        ids = columns.get(id_column) if id_column else None
        for i, geometry in enumerate(geometries.tolist()):
            properties = {name: values[i] for name, values in columns.items()}
            head = '{"type":"Feature",'
            if ids is not None and ids[i] is not None:
                # A binary key goes as base64 text, as binary properties do.
                head += f'"id":{json.dumps(ids[i], default=_json_default)},'
            yield (
                f'{head}"geometry":{geometry},"properties":'
                f"{json.dumps(properties, default=_json_default, allow_nan=False, separators=(',', ':'))}}}"
            )


def _json_ready(column: pa.Array) -> pa.Array:
    # JSON has no NaN or infinity; GeoJSON readers expect null for an unknown number.
    if pa.types.is_floating(column.type):
        return pc.if_else(pc.is_finite(column), column, pa.nulls(len(column), column.type))
    if pa.types.is_struct(column.type):
        fields = [_json_ready(pc.struct_field(column, [i])) for i in range(column.type.num_fields)]
        return pa.StructArray.from_arrays(fields, fields=list(column.type), mask=column.is_null())
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        column = from_zero_offsets(column)
        values = _json_ready(column.values)
        return type(column).from_arrays(column.offsets, values, type=column.type, mask=column.is_null())
    return column


def _json_values(column: pa.Array) -> list:
    """The column's values as JSON takes them: a map an object (pyarrow gives key/value pairs)."""
    values = column.to_pylist()
    return values if not has_map(column.type) else [_objects(v, column.type) for v in values]


def _objects(value: Any, kind: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_map(kind):
        return {str(k): _objects(v, kind.item_type) for k, v in value}
    if pa.types.is_struct(kind):
        return {f.name: _objects(value[f.name], f.type) for f in kind}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [_objects(v, kind.value_type) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Decimal):
        # As text: every digit kept, which a JSON number read as a double would not.
        return str(value)
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} {value!r} has no JSON form")
