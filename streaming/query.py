"""Spatial window queries: the rows of a table whose geometry intersects a bounding box.

The table layout makes a window cheap to answer in three steps, each narrowing the next:

1. files: every manifest entry bounds the bbox.* columns of its file, so pyiceberg's scan
   planning drops the files whose bbox range misses the window;
2. row groups: the files are Hilbert-sorted, so the Parquet min/max statistics of the bbox.*
   columns of each row group are tight, and only the row groups that may match are read;
3. rows: a vectorised test on the bbox struct, then an exact GEOS intersects on the survivors.

Data files are read through the table's FileIO, so the query works wherever the table lives.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import shapely
from pyiceberg.expressions import And, BooleanExpression, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Snapshot

from streaming.contract import BBOX_FIELDS

BBox = tuple[float, float, float, float]
PRIMARY_COLUMN_PROPERTY = "geo.primary-column"
ID_COLUMN = "event_id"


@dataclass(frozen=True)
class QueryStats:
    """How much of the table a query touched.

    files_total counts the data files of the snapshot; files_scanned those whose footer was
    read (they survived manifest pruning and the limit was not yet reached). Row groups are
    counted within the scanned files, so row_groups_scanned / row_groups_total measures the
    pruning by Parquet statistics alone.
    """

    files_total: int
    files_scanned: int
    row_groups_total: int
    row_groups_scanned: int
    rows_read: int
    rows_matched: int


@dataclass(frozen=True)
class QueryResult:
    table: pa.Table  # matching rows: all columns, geometry still WKB
    stats: QueryStats


class QueryError(RuntimeError):
    """The table cannot be queried as laid out (missing properties, delete files, ...)."""


def parse_bbox(text: str) -> BBox:
    """'xmin,ymin,xmax,ymax' as four finite floats with xmin <= xmax and ymin <= ymax."""
    parts = text.split(",")
    if len(parts) != 4:
        raise ValueError(f"bbox {text!r}: expected four numbers 'xmin,ymin,xmax,ymax', got {len(parts)} values")
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"bbox {text!r}: every value must be a number") from None
    return _validated_bbox(values, f"bbox {text!r}")


def _validated_bbox(values: tuple[float, ...], label: str) -> BBox:
    if len(values) != 4:
        raise ValueError(f"{label}: expected (xmin, ymin, xmax, ymax)")
    xmin, ymin, xmax, ymax = (float(v) for v in values)
    if not all(math.isfinite(v) for v in (xmin, ymin, xmax, ymax)):
        raise ValueError(f"{label}: values must be finite numbers")
    if xmin > xmax:
        raise ValueError(f"{label}: xmin {xmin:g} is greater than xmax {xmax:g}")
    if ymin > ymax:
        raise ValueError(f"{label}: ymin {ymin:g} is greater than ymax {ymax:g}")
    return (xmin, ymin, xmax, ymax)


def query_bbox(table: Table, bbox: BBox, limit: int | None = None) -> QueryResult:
    """Rows whose geometry intersects `bbox` (table CRS, edges included), at most `limit` of them."""
    bbox = _validated_bbox(tuple(bbox), f"bbox {tuple(bbox)!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit: {limit} must not be negative")

    geometry_column = _property(table, PRIMARY_COLUMN_PROPERTY)
    covering_column = _property(table, f"geo.column.{geometry_column}.covering")
    result_schema = _result_schema(table)
    snapshot = table.current_snapshot()
    if snapshot is None or limit == 0:
        files_total = 0 if snapshot is None else _count_data_files(table, snapshot)
        return QueryResult(result_schema.empty_table(), QueryStats(files_total, 0, 0, 0, 0, 0))

    files_total = _count_data_files(table, snapshot)
    tasks = list(table.scan(
        row_filter=_manifest_filter(covering_column, bbox), snapshot_id=snapshot.snapshot_id
    ).plan_files())
    for task in tasks:
        _refuse_deletes(task)

    window = _window_geometry(bbox)
    covering_paths = [f"{covering_column}.{name}" for name in BBOX_FIELDS]
    matches: list[pa.Table] = []
    files_scanned = row_groups_total = row_groups_scanned = rows_read = rows_matched = 0
    for task in tasks:
        if limit is not None and rows_matched >= limit:
            break
        files_scanned += 1
        with table.io.new_input(task.file.file_path).open() as stream:
            parquet = pq.ParquetFile(stream, pre_buffer=True)
            row_groups_total += parquet.metadata.num_row_groups
            surviving = _row_groups_that_may_match(parquet.metadata, covering_paths, bbox)
            row_groups_scanned += len(surviving)
            # Unlimited queries read a file's row groups in one call, letting Arrow coalesce the
            # ranges; limited ones read group by group so they can stop as soon as they are done.
            if limit is None:
                reads = [surviving] if surviving else []
            else:
                reads = [[group] for group in surviving]
            for groups in reads:
                if limit is not None and rows_matched >= limit:
                    break
                rows = parquet.read_row_groups(groups, use_threads=True)
                rows_read += rows.num_rows
                hits = _exact_matches(rows, geometry_column, covering_column, bbox, window)
                if limit is not None:
                    hits = hits.slice(0, limit - rows_matched)
                rows_matched += hits.num_rows
                if hits.num_rows:
                    matches.append(_conform(hits, result_schema))

    result = pa.concat_tables(matches) if matches else result_schema.empty_table()
    stats = QueryStats(files_total, files_scanned, row_groups_total, row_groups_scanned, rows_read, rows_matched)
    return QueryResult(result, stats)


def _property(table: Table, key: str) -> str:
    value = table.properties.get(key)
    if not value:
        raise QueryError(f"table property {key!r} is missing; is this a geoingest table?")
    return value


def _manifest_filter(covering_column: str, bbox: BBox) -> BooleanExpression:
    # A file may match only if its bbox range overlaps the window on both axes.
    xmin, ymin, xmax, ymax = bbox
    c = covering_column
    return And(
        LessThanOrEqual(f"{c}.xmin", xmax),
        GreaterThanOrEqual(f"{c}.xmax", xmin),
        LessThanOrEqual(f"{c}.ymin", ymax),
        GreaterThanOrEqual(f"{c}.ymax", ymin),
    )


def _count_data_files(table: Table, snapshot: Snapshot) -> int:
    """Data files of the snapshot, from the manifest list's counts when it has them."""
    manifests = [m for m in snapshot.manifests(table.io) if m.content == ManifestContent.DATA]
    counts = [(m.added_files_count, m.existing_files_count) for m in manifests]
    if all(added is not None and existing is not None for added, existing in counts):
        return sum(added + existing for added, existing in counts)
    # Old (v1) manifest lists may omit the counts; read the manifests instead.
    return sum(1 for _ in table.scan(snapshot_id=snapshot.snapshot_id).plan_files())


def _refuse_deletes(task: FileScanTask) -> None:
    # Tables written by geoingest only append; honouring deletes would need merge-on-read here.
    if task.delete_files:
        paths = sorted(d.file_path for d in task.delete_files)
        raise QueryError(
            f"data file {task.file.file_path} has {len(paths)} delete file(s) ({', '.join(paths[:3])}"
            f"{', ...' if len(paths) > 3 else ''}); query_bbox reads append-only tables and cannot "
            "apply deletes"
        )


def _row_groups_that_may_match(metadata: pq.FileMetaData, covering_paths: list[str], bbox: BBox) -> list[int]:
    """Indices of the row groups whose bbox.* statistics do not rule out the window."""
    n = metadata.num_row_groups
    if n == 0:
        return []
    column_of_path = {metadata.row_group(0).column(j).path_in_schema: j for j in range(metadata.num_columns)}
    # Without statistics a group must be read: missing minima are -inf, missing maxima +inf.
    minima = np.full((n, 4), -np.inf)
    maxima = np.full((n, 4), np.inf)
    for k, path in enumerate(covering_paths):
        j = column_of_path.get(path)
        if j is None:
            continue
        for g in range(n):
            stats = metadata.row_group(g).column(j).statistics
            if stats is not None and stats.has_min_max:
                minima[g, k], maxima[g, k] = stats.min, stats.max
    qxmin, qymin, qxmax, qymax = bbox
    xmin, ymin, xmax, ymax = range(4)
    may_match = (
        (minima[:, xmin] <= qxmax) & (maxima[:, xmax] >= qxmin)
        & (minima[:, ymin] <= qymax) & (maxima[:, ymax] >= qymin)
    )
    return np.flatnonzero(may_match).tolist()


def _window_geometry(bbox: BBox) -> shapely.Geometry:
    # A zero-width window is a line or a point; as a polygon it would be invalid and GEOS's
    # answers about it unreliable.
    xmin, ymin, xmax, ymax = bbox
    if xmin == xmax and ymin == ymax:
        return shapely.Point(xmin, ymin)
    if xmin == xmax or ymin == ymax:
        return shapely.LineString([(xmin, ymin), (xmax, ymax)])
    return shapely.box(xmin, ymin, xmax, ymax)


def _exact_matches(rows: pa.Table, geometry_column: str, covering_column: str, bbox: BBox,
                   window: shapely.Geometry) -> pa.Table:
    # The bbox test is exact for points and a cheap necessary condition for everything else,
    # so GEOS only sees geometries whose bbox overlaps the window.
    qxmin, qymin, qxmax, qymax = bbox
    covering = rows.column(covering_column)
    overlaps = pc.and_(
        pc.and_(pc.less_equal(pc.struct_field(covering, "xmin"), qxmax),
                pc.greater_equal(pc.struct_field(covering, "xmax"), qxmin)),
        pc.and_(pc.less_equal(pc.struct_field(covering, "ymin"), qymax),
                pc.greater_equal(pc.struct_field(covering, "ymax"), qymin)),
    )
    candidates = rows.filter(overlaps)
    if candidates.num_rows == 0:
        return candidates
    wkb = candidates.column(geometry_column).to_numpy(zero_copy_only=False)
    intersects = shapely.intersects(shapely.from_wkb(wkb), window)
    return candidates.filter(pa.array(intersects))


def _result_schema(table: Table) -> pa.Schema:
    """The table's Arrow schema as the data files store it: regular (not large) strings and binaries."""
    schema = schema_to_pyarrow(table.schema(), include_field_ids=False)
    return pa.schema([f.with_type(_regular_type(f.type)) for f in schema])


def _regular_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_regular_type(f.type)) for f in t])
    return t


def _conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    # Files carry Parquet field-id metadata and may differ in string width; results share one schema.
    return rows.select(schema.names).cast(schema)


# -- GeoJSON output -------------------------------------------------------------------------------
def to_geojson_lines(result: QueryResult, geometry_column: str) -> Iterator[str]:
    """One GeoJSON Feature per line (GeoJSON text sequence without separators, as `ogr2ogr` and
    `jq` read it): the geometry, every other column as a property, and `event_id` as the id."""
    table = result.table
    if geometry_column not in table.column_names:
        raise ValueError(f"geometry column {geometry_column!r} is not in the result ({table.column_names})")
    property_names = [n for n in table.column_names if n != geometry_column]
    for batch in table.to_batches(max_chunksize=4096):
        geometries = shapely.to_geojson(
            shapely.from_wkb(batch.column(geometry_column).to_numpy(zero_copy_only=False))
        )
        columns = {name: _json_ready(batch.column(name)).to_pylist() for name in property_names}
        ids = columns.get(ID_COLUMN)
        for i, geometry in enumerate(geometries.tolist()):
            properties = {name: values[i] for name, values in columns.items()}
            head = '{"type":"Feature",'
            if ids is not None and ids[i] is not None:
                head += f'"id":{json.dumps(ids[i])},'
            yield (f'{head}"geometry":{geometry},"properties":'
                   f'{json.dumps(properties, default=_json_default, allow_nan=False, separators=(",", ":"))}}}')


def _json_ready(column: pa.Array) -> pa.Array:
    # JSON has no NaN or infinity; GeoJSON readers expect null for an unknown number.
    if pa.types.is_floating(column.type):
        return pc.if_else(pc.is_finite(column), column, pa.nulls(len(column), column.type))
    if pa.types.is_struct(column.type):
        fields = [_json_ready(pc.struct_field(column, [i])) for i in range(column.type.num_fields)]
        return pa.StructArray.from_arrays(fields, fields=list(column.type), mask=column.is_null())
    return column


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} {value!r} has no JSON form")
