"""Spatial queries: the rows of a table whose geometry intersects, lies within or contains a
query geometry Q, at the current snapshot or an older one.

The table layout makes a query cheap to answer in three steps, each narrowing the next. Each
predicate on the geometry implies conditions on the row's bbox struct (its inclusive projection,
as the Havasu spec calls it), and those are what the statistics can rule out:

- intersects Q: the row's bbox overlaps Q's bbox;
- within Q: the row's bbox lies inside Q's bbox (so, a fortiori, overlaps it);
- contains Q: the row's bbox contains Q's bbox.

1. files: every manifest entry bounds the bbox.* columns of its file, so the conditions, given to
   pyiceberg as a row filter, drop the files that cannot hold a match. For intersects and within
   a non-rectangular Q is then tested against each remaining file's MBR itself (MBR intersects Q);
2. row groups: the files are Hilbert-sorted, so the Parquet min/max statistics of the bbox.*
   columns of each row group are tight, and the same tests pick the row groups to read;
3. rows: the conditions on the bbox struct, then the exact GEOS predicate on the survivors.

Data files are read through the table's FileIO, so the query works wherever the table lives.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import shapely
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Or,
    Reference,
    StartsWith,
)
from pyiceberg.expressions.literals import literal
from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator, expression_evaluator, inclusive_projection
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from streaming.contract import (
    BBOX_FIELDS,
    CELL_PROPERTY_PREFIX,
    EVENT_TIME_PROPERTY,
    Contract,
    ContractError,
    parse_contract,
)
from streaming.kernels.antimeridian import split_at_antimeridian, unwrapped, window_intervals, x_overlaps
from streaming.kernels.geohash import covering_cells, prefix_cells
from streaming.kernels.wkb import wkb_storage
from streaming.read.bounds import FileBounds, row_group_bounds
from streaming.read.predicate import XMAX, XMIN, YMAX, YMIN, BBox, Condition, Predicate, window_geometry
from streaming.read.projection import FieldIdProjection, QueryError
from streaming.table.catalog import TableMismatch
from streaming.table.catalog import table_contract as contract_of_table
from streaming.table.deletes import EqualityDeletes, has_delete_files, snapshot_files
from streaming.write.data_files import WRAPPED_ROWS_KEY

PRIMARY_COLUMN_PROPERTY = "geo.primary-column"
CONTRACT_PROPERTY = "geoingest.contract"


@dataclass(frozen=True)
class QueryStats:
    """How much of the table a query touched.

    files_total counts the data files of the snapshot; files_scanned those whose footer was
    read (they survived pruning and the limit was not yet reached). Row groups are counted
    within the scanned files, so row_groups_scanned / row_groups_total measures the pruning by
    Parquet statistics alone. snapshot_id is the snapshot read (None for a table without one).
    """

    files_total: int
    files_scanned: int
    row_groups_total: int
    row_groups_scanned: int
    rows_read: int
    rows_matched: int
    snapshot_id: int | None = None


@dataclass(frozen=True)
class QueryResult:
    table: pa.Table  # matching rows: all columns, geometry still WKB
    stats: QueryStats


# -- time travel ----------------------------------------------------------------------------------
def parse_as_of(value: str | int | datetime) -> int:
    """A point in time as epoch milliseconds: an ISO 8601 timestamp (without a zone: UTC), a
    datetime, or epoch milliseconds (an int or a string of digits)."""
    if isinstance(value, bool):
        raise ValueError(f"as-of {value!r}: expected an ISO 8601 timestamp or epoch milliseconds")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                f"as-of {value!r}: not an ISO 8601 timestamp (2024-06-01T12:00:00Z) or epoch milliseconds"
            ) from None
    else:
        raise ValueError(f"as-of {value!r}: expected an ISO 8601 timestamp or epoch milliseconds")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return math.floor(moment.timestamp() * 1000)


def resolve_snapshot(
    table: Table, snapshot_id: int | None = None, as_of: str | int | datetime | None = None
) -> Snapshot | None:
    """The snapshot to read: `snapshot_id`, the one current at `as_of`, or the current one."""
    name = ".".join(table.name())
    if snapshot_id is not None and as_of is not None:
        raise ValueError(f"snapshot {snapshot_id} and as-of {as_of!r}: give one of them, not both")
    if snapshot_id is not None:
        snapshot = table.snapshot_by_id(snapshot_id)
        if snapshot is None:
            known = [s.snapshot_id for s in table.snapshots()]
            listed = ", ".join(str(s) for s in known[-5:]) + (", ..." if len(known) > 5 else "")
            raise ValueError(
                f"snapshot {snapshot_id}: table {name} has no such snapshot"
                + (f" (latest: {listed})" if known else " (it has no snapshots)")
            )
        return snapshot
    if as_of is not None:
        timestamp_ms = parse_as_of(as_of)
        snapshot = table.snapshot_as_of_timestamp(timestamp_ms)
        if snapshot is None:
            history = table.history()
            first = (
                f"; its first snapshot was committed at {_iso(history[0].timestamp_ms)}"
                if history
                else "; it has no snapshots"
            )
            raise ValueError(f"as-of {as_of!r}: table {name} has no snapshot at or before {_iso(timestamp_ms)}{first}")
        return snapshot
    return table.current_snapshot()


def _iso(timestamp_ms: int) -> str:
    return datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _schema_of(table: Table, snapshot: Snapshot | None) -> Schema:
    if snapshot is not None and snapshot.schema_id is not None:
        for schema in table.metadata.schemas:
            if schema.schema_id == snapshot.schema_id:
                return schema
    return table.schema()


# -- the query ------------------------------------------------------------------------------------
def query_bbox(
    table: Table,
    bbox: BBox,
    limit: int | None = None,
    snapshot_id: int | None = None,
    as_of: str | int | datetime | None = None,
) -> QueryResult:
    """Rows whose geometry intersects `bbox` (table CRS, edges included), at most `limit` of them."""
    return query(table, Predicate.from_bbox(bbox), limit=limit, snapshot_id=snapshot_id, as_of=as_of)


def query(
    table: Table,
    predicate: Predicate,
    limit: int | None = None,
    snapshot_id: int | None = None,
    as_of: str | int | datetime | None = None,
    time_from: str | int | datetime | None = None,
    time_to: str | int | datetime | None = None,
) -> QueryResult:
    """Rows whose geometry meets `predicate`, at most `limit` of them, read from the current
    snapshot, snapshot `snapshot_id`, or the snapshot current at `as_of` (see parse_as_of).

    With `time_from` and/or `time_to` (as parse_as_of reads them), only rows whose event time
    lies in [time_from, time_to). The window and the predicate prune together: partitions (the
    time transform of the event-time column, the spatial cells a window covers), then file
    bounds, then row groups."""
    if not isinstance(predicate, Predicate):
        raise TypeError(f"predicate: expected a Predicate, got {type(predicate).__name__}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit: {limit} must not be negative")

    # Read the short way, a row's or file's x range may be wrapped (xmin > xmax): the conditions
    # on x are replaced by a test of the ranges against Q's x intervals, which knows both kinds.
    short_way = antimeridian_reading(table) == "short"
    if predicate.wrapped_x is not None and not short_way:
        raise ValueError(
            f"bbox xmin {predicate.wrapped_x[0]:g} > xmax {predicate.wrapped_x[1]:g} (across the anti-meridian) "
            "needs a table whose contract reads longitudes the short way (geometry.antimeridian = 'short')"
        )
    snapshot = resolve_snapshot(table, snapshot_id, as_of)
    geometry_column = _property(table, PRIMARY_COLUMN_PROPERTY)
    # Time travel reads a snapshot as its own schema had it; otherwise the table's current schema
    # holds, which may be newer than the current snapshot (`geoingest table evolve` commits none).
    time_travel = snapshot_id is not None or as_of is not None
    schema = _schema_of(table, snapshot) if time_travel else table.schema()
    projection = FieldIdProjection(schema)
    result_schema = projection.arrow_schema
    if snapshot is None:
        return QueryResult(result_schema.empty_table(), QueryStats(0, 0, 0, 0, 0, 0, None))
    files_total = _count_data_files(table, snapshot)
    if limit == 0:
        return QueryResult(result_schema.empty_table(), QueryStats(files_total, 0, 0, 0, 0, 0, snapshot.snapshot_id))

    conditions = predicate.bbox_conditions()
    x_intervals = predicate.x_intervals() if short_way else None
    if x_intervals is not None and predicate.kind != "within":
        # A wrapped row's xmin and xmax need not bracket a window it meets. The conditions of
        # "within" stay: a row within a plain Q is plain, or Q spans [-180, 180] and they all hold.
        conditions = [c for c in conditions if c[0] in (YMIN, YMAX)]
    file_bounds = table_file_bounds(table, schema)
    covering_column = covering_column_of(table)
    # A table without a stored covering is pruned here, on its geometry bounds, not by pyiceberg.
    spatial_filter = _manifest_filter(covering_column, conditions) if covering_column else AlwaysTrue()
    window = _time_window(table, time_from, time_to)
    partition_filter = And(_cell_filter(table, _plain_boxes(predicate)), _time_filter(window))
    deletes = None
    files: list[tuple[DataFile, int | None]]
    if has_delete_files(table, snapshot):
        # An upsert table: pyiceberg cannot plan it (equality deletes), so the files are planned
        # here, by the same bounds, and each file's rows lose the keys later batches replaced.
        planned = snapshot_files(table, snapshot)
        deletes = EqualityDeletes(table, planned.reaching_deletes())
        area = window_geometry(predicate.bounds)
        may_hold = _file_filter(table, And(spatial_filter, partition_filter))
        files = [
            (p.file, p.sequence_number)
            for p in planned.data
            if may_hold(p.file) and _file_may_touch(file_bounds(p.file), area)
        ]
    else:
        tasks = table.scan(row_filter=And(spatial_filter, partition_filter), snapshot_id=snapshot.snapshot_id)
        files = [(task.file, None) for task in tasks.plan_files()]
    if covering_column is None:
        boxes = [window_geometry(box) for box in _plain_boxes(predicate)]
        files = [(f, seq) for f, seq in files if any(_file_may_touch(file_bounds(f), box) for box in boxes)]
    if x_intervals is not None:
        files = [(file, seq) for file, seq in files if _file_x_may_touch(file_bounds(file), x_intervals)]
    shape = None
    if predicate.prunes_by_shape():
        shape = predicate.geometry
        shapely.prepare(shape)
        files = [(file, seq) for file, seq in files if _file_may_touch(file_bounds(file), shape)]

    covering_paths = [f"{covering_column}.{name}" for name in BBOX_FIELDS]
    field_ids = list(file_bounds.covering_ids or ())
    matches: list[pa.Table] = []
    files_scanned = row_groups_total = row_groups_scanned = rows_read = rows_matched = 0
    for data_file, sequence_number in files:
        if limit is not None and rows_matched >= limit:
            break
        files_scanned += 1
        with table.io.new_input(data_file.file_path).open() as stream:
            parquet = pq.ParquetFile(stream, pre_buffer=True)
            file_schema = parquet.schema_arrow
            row_groups_total += parquet.metadata.num_row_groups
            file_covering_paths = (
                projection.paths_in_file(file_schema, field_ids, covering_paths) if covering_column else None
            )
            wrapped_rows = None
            if x_intervals is not None and covering_column:
                footer = parquet.metadata.metadata or {}
                wrapped_rows = int(footer.get(WRAPPED_ROWS_KEY.encode(), b"0") or 0)
            minima, maxima = row_group_bounds(
                parquet.metadata, file_covering_paths, geometry_column, file_bounds.short_way
            )
            surviving = _row_groups_that_may_match(minima, maxima, conditions, shape, x_intervals, wrapped_rows)
            read_columns = projection.columns_to_read(file_schema)
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
                rows = projection(
                    parquet.read_row_groups(groups, columns=read_columns, use_threads=True), data_file.file_path
                )
                rows_read += rows.num_rows
                if deletes is not None and sequence_number is not None:
                    rows = deletes.live(rows, sequence_number)
                if window is not None:
                    rows = _in_window(rows, window)
                hits = _exact_matches(rows, geometry_column, covering_column, predicate, conditions, x_intervals)
                if limit is not None:
                    hits = hits.slice(0, limit - rows_matched)
                rows_matched += hits.num_rows
                if hits.num_rows:
                    matches.append(hits)

    result = pa.concat_tables(matches) if matches else result_schema.empty_table()
    stats = QueryStats(
        files_total, files_scanned, row_groups_total, row_groups_scanned, rows_read, rows_matched, snapshot.snapshot_id
    )
    return QueryResult(result, stats)


def table_file_bounds(table: Table, schema: Schema) -> FileBounds:
    """How the table bounds its files: by its stored covering, else by its geometry column's bounds."""
    geometry = schema.find_field(_property(table, PRIMARY_COLUMN_PROPERTY))
    covering = covering_column_of(table)
    ids = None if covering is None else tuple(schema.find_field(f"{covering}.{n}").field_id for n in BBOX_FIELDS)
    return FileBounds(
        cast(tuple[int, int, int, int] | None, ids), geometry.field_id, antimeridian_reading(table) == "short"
    )


def covering_column_of(table: Table) -> str | None:
    """The table's stored bbox covering column; None for a native-geometry table without one."""
    return table.properties.get(f"geo.column.{_property(table, PRIMARY_COLUMN_PROPERTY)}.covering")


def _property(table: Table, key: str) -> str:
    value = table.properties.get(key)
    if not value:
        raise QueryError(f"table property {key!r} is missing; is this a geoingest table?")
    return value


def _manifest_filter(covering_column: str, conditions: list[Condition]) -> BooleanExpression:
    # pyiceberg evaluates a row filter inclusively on the manifest bounds: "bbox.xmin <= v" drops
    # a file whose lower bound of bbox.xmin exceeds v, "bbox.xmax >= v" one whose upper bound is
    # below v. By keyword: mypy sees the fields pydantic declares, not the positional __init__ the
    # predicates inherit, and this is the form both accept.
    terms = [
        (LessThanOrEqual if op == "<=" else GreaterThanOrEqual)(
            term=Reference(f"{covering_column}.{BBOX_FIELDS[k]}"), value=literal(value)
        )
        for k, op, value in conditions
    ]
    return And(*terms)


def antimeridian_reading(table: Table) -> str:
    """How the table's contract reads longitudes across ±180: "short" or "planar" (tables without
    a readable contract are planar)."""
    raw = table.properties.get(CONTRACT_PROPERTY)
    if not raw:
        return "planar"
    try:
        return parse_contract(json.loads(raw)).geometry.antimeridian
    except (json.JSONDecodeError, ContractError):
        return "planar"


def _file_x_may_touch(bbox: BBox | None, intervals: list[tuple[float, float]]) -> bool:
    """Whether the file's x range, from its manifest bounds (wrapped when the least xmin exceeds
    the greatest xmax: then every row of the file is wrapped), meets one of `intervals`."""
    if bbox is None:
        return True
    return any(bool(x_overlaps(bbox[0], bbox[2], lo, hi)) for lo, hi in intervals)


# A time window: the event-time column, and its bounds in microseconds (None: open).
TimeWindow = tuple[str, int | None, int | None]


def _time_window(table: Table, time_from, time_to) -> TimeWindow | None:
    if time_from is None and time_to is None:
        return None
    column = event_time_column(table)
    if column is None:
        raise QueryError(
            f"table {'.'.join(table.name())} has no event-time column, so --from / --to cannot apply; "
            "its contract names one with 'event_time'"
        )
    lo = None if time_from is None else parse_as_of(time_from) * 1000
    hi = None if time_to is None else parse_as_of(time_to) * 1000
    if lo is not None and hi is not None and lo >= hi:
        raise ValueError(f"from {time_from!r} is not before to {time_to!r}")
    return column, lo, hi


def event_time_column(table: Table) -> str | None:
    """The column that holds an event's time: as the table records it, else as its contract names it."""
    column = table.properties.get(EVENT_TIME_PROPERTY)
    if column:
        return column
    raw = table.properties.get(CONTRACT_PROPERTY)
    if not raw:
        return None
    try:
        return parse_contract(json.loads(raw)).event_time
    except (json.JSONDecodeError, ContractError):
        return None


def _time_filter(window: TimeWindow | None) -> BooleanExpression:
    if window is None:
        return AlwaysTrue()
    column, lo, hi = window
    terms: list[BooleanExpression] = []
    if lo is not None:
        terms.append(GreaterThanOrEqual(term=Reference(column), value=literal(_iso_micros(lo))))
    if hi is not None:
        terms.append(LessThan(term=Reference(column), value=literal(_iso_micros(hi))))
    return And(*terms) if len(terms) > 1 else terms[0]


def _iso_micros(micros: int) -> str:
    return datetime.fromtimestamp(micros // 1_000_000, tz=UTC).replace(microsecond=micros % 1_000_000).isoformat()


def _in_window(rows: pa.Table, window: TimeWindow) -> pa.Table:
    column, lo, hi = window
    micros = rows.column(column).cast(pa.int64())
    keep = pc.is_valid(micros)
    if lo is not None:
        keep = pc.and_(keep, pc.greater_equal(micros, lo))
    if hi is not None:
        keep = pc.and_(keep, pc.less(micros, hi))
    return rows.filter(keep)


def _plain_boxes(predicate: Predicate) -> list[BBox]:
    """The query's window as boxes that do not wrap: one, or its two halves either side of ±180."""
    if predicate.wrapped_x is None:
        return [predicate.bounds]
    _, ymin, _, ymax = predicate.bounds
    return [(lo, ymin, hi, ymax) for lo, hi in window_intervals(*predicate.wrapped_x)]


def _cell_filter(table: Table, boxes: list[BBox]) -> BooleanExpression:
    """The cells whose rows a query of the window `boxes` may need, for every cell column the
    table records (`geoingest.partition.cell.<column>` = `geohash:<precision>:<geometry>`).

    A cell column a partition evolution added is null in the files written before it: those rows
    are let through it (IS NULL), and found by the cell column of their own spec. So each file is
    pruned by its own spec's cells, and by the bounds of the other cell columns it holds."""
    terms: list[BooleanExpression] = []
    for column, precision, optional in _cell_columns(table):
        cells = sorted({c for box in boxes for c in covering_cells(box, precision)})
        prefixes = sorted({p for box in boxes for p in prefix_cells(box, precision)})
        alternatives: list[BooleanExpression] = [In(term=Reference(column), values={literal(c) for c in cells})]
        alternatives += [StartsWith(term=Reference(column), value=literal(p)) for p in prefixes]
        if optional:
            alternatives.append(IsNull(term=Reference(column)))
        terms.append(Or(*alternatives) if len(alternatives) > 1 else alternatives[0])
    if not terms:
        return AlwaysTrue()
    return And(*terms) if len(terms) > 1 else terms[0]


def _cell_columns(table: Table) -> list[tuple[str, int, bool]]:
    """(column, geohash precision, optional) of every geohash cell column the table records."""
    fields = {f.name: f for f in table.schema().fields}
    found = []
    for key, meaning in sorted(table.properties.items()):
        column = key.removeprefix(CELL_PROPERTY_PREFIX)
        kind, _, rest = meaning.partition(":")
        if key.startswith(CELL_PROPERTY_PREFIX) and kind == "geohash" and column in fields:
            found.append((column, int(rest.split(":", 1)[0]), not fields[column].required))
    return found


def sql_where(
    table: Table,
    predicate: Predicate,
    time_from: str | int | datetime | None = None,
    time_to: str | int | datetime | None = None,
) -> str:
    """A SQL WHERE condition (Spark SQL, DuckDB, Trino) that lets an engine prune a query the way
    `query` does: the time window on the event-time column (pruned by its partition transform),
    the cells the window covers (pruned by the cell partition), the bbox conditions (pruned by
    the manifest and row group bounds). A superset of the rows: the exact predicate is the
    engine's own (ST_Intersects ...)."""
    terms: list[str] = []
    boxes = _plain_boxes(predicate)
    window = _time_window(table, time_from, time_to)
    if window is not None:
        column, lo, hi = window
        if lo is not None:
            terms.append(f"{column} >= TIMESTAMP '{_iso_micros(lo)}'")
        if hi is not None:
            terms.append(f"{column} < TIMESTAMP '{_iso_micros(hi)}'")
    for column, precision, optional in _cell_columns(table):
        cells = ", ".join(f"'{c}'" for c in sorted({c for b in boxes for c in covering_cells(b, precision)}))
        alternatives = [f"{column} IN ({cells})"]
        alternatives += [
            f"{column} LIKE '{p}%'" for p in sorted({p for b in boxes for p in prefix_cells(b, precision)})
        ]
        if optional:  # added by a partition evolution: null in the files written before it
            alternatives.append(f"{column} IS NULL")
        terms.append(alternatives[0] if len(alternatives) == 1 else "(" + " OR ".join(alternatives) + ")")
    covering = covering_column_of(table)
    if covering is None:
        # A native geometry column without a covering: the engine prunes on the manifests'
        # geometry bounds from its own spatial predicate.
        return " AND ".join(terms) if terms else "TRUE"
    if antimeridian_reading(table) == "short":
        # A wrapped row's box (xmin > xmax) fails every plain x condition: x is tested per half of
        # the window, and wrapped rows are kept for the engine's exact test.
        halves = [f"({covering}.xmin <= {xmax!r} AND {covering}.xmax >= {xmin!r})" for xmin, _, xmax, _ in boxes]
        terms.append("(" + " OR ".join([*halves, f"{covering}.xmin > {covering}.xmax"]) + ")")
        conditions = [c for c in predicate.bbox_conditions() if c[0] in (YMIN, YMAX)]
    else:
        conditions = predicate.bbox_conditions()
    for k, op, value in conditions:
        terms.append(f"{covering}.{BBOX_FIELDS[k]} {op} {value!r}")
    return " AND ".join(terms)


def _file_filter(table: Table, row_filter: BooleanExpression):
    """What pyiceberg's planning does for a file, for the files planned here: the filter projected
    on the file's partition (its own spec's), then on its column bounds."""
    schema = table.schema()
    specs = table.specs()
    partition_tests = {}
    for spec_id, spec in specs.items():
        projected = inclusive_projection(schema, spec, True)(row_filter)
        partition_schema = Schema(*spec.partition_type(schema).fields)
        partition_tests[spec_id] = expression_evaluator(partition_schema, projected, True)
    metrics = _InclusiveMetricsEvaluator(schema, row_filter, True, False).eval

    def may_hold(data_file: DataFile) -> bool:
        test = partition_tests.get(getattr(data_file, "spec_id", -1))
        if test is not None and not test(data_file.partition):
            return False
        return metrics(data_file)

    return may_hold


def _file_may_touch(bbox: BBox | None, shape: shapely.Geometry) -> bool:
    """Whether the file's MBR, from its manifest bounds, intersects Q (True without bounds)."""
    return True if bbox is None else _mbr_may_touch(*bbox, shape)


def _mbr_may_touch(xmin: float, ymin: float, xmax: float, ymax: float, shape: shapely.Geometry) -> bool:
    if not all(math.isfinite(v) for v in (xmin, ymin, xmax, ymax)) or xmin > xmax or ymin > ymax:
        return True
    return bool(shapely.intersects(shape, window_geometry((xmin, ymin, xmax, ymax))))


def _count_data_files(table: Table, snapshot: Snapshot) -> int:
    """Data files of the snapshot, from the manifest list's counts when it has them."""
    manifests = [m for m in snapshot.manifests(table.io) if m.content == ManifestContent.DATA]
    counts = [(m.added_files_count, m.existing_files_count) for m in manifests]
    known = [(added, existing) for added, existing in counts if added is not None and existing is not None]
    if len(known) == len(counts):
        return sum(added + existing for added, existing in known)
    # Old (v1) manifest lists may omit the counts; read the manifests instead.
    return sum(1 for _ in table.scan(snapshot_id=snapshot.snapshot_id).plan_files())


def _row_groups_that_may_match(
    minima: np.ndarray,
    maxima: np.ndarray,
    conditions: list[Condition],
    shape: shapely.Geometry | None = None,
    x_intervals: list[tuple[float, float]] | None = None,
    wrapped_rows: int | None = None,
) -> list[int]:
    """Indices of the row groups whose bounds (`row_group_bounds`: per group, the minima and
    maxima of the rows' xmin, ymin, xmax, ymax) do not rule out a match.

    A condition "xmin <= v" can hold for some row only if min(xmin) <= v, and "xmax >= v" only if
    max(xmax) >= v. With `shape`, the group's MBR (min xmin, min ymin, max xmax, max ymax) must
    also intersect it.

    With `x_intervals` (short-way tables), the group's x range must meet one of them: a group
    whose min(xmin) exceeds its max(xmax) holds only wrapped rows and covers [min xmin, 180] and
    [-180, max xmax]; in a file with `wrapped_rows`, any other group may span the world.
    """
    n = len(minima)
    if n == 0:
        return []
    minima, maxima = minima.copy(), maxima.copy()
    if x_intervals is not None and wrapped_rows:
        unknown = ~(minima[:, XMIN] > maxima[:, XMAX])
        minima[unknown, XMIN], maxima[unknown, XMAX] = -np.inf, np.inf
    may_match = np.ones(n, dtype=bool)
    for k, op, value in conditions:
        may_match &= (minima[:, k] <= value) if op == "<=" else (maxima[:, k] >= value)
    if x_intervals is not None:
        touches = np.zeros(n, dtype=bool)
        for lo, hi in x_intervals:
            touches |= x_overlaps(minima[:, XMIN], maxima[:, XMAX], lo, hi)
        may_match &= touches
    groups = np.flatnonzero(may_match).tolist()
    if shape is not None:
        groups = [
            g
            for g in groups
            if _mbr_may_touch(minima[g, XMIN], minima[g, YMIN], maxima[g, XMAX], maxima[g, YMAX], shape)
        ]
    return groups


def _exact_matches(
    rows: pa.Table,
    geometry_column: str,
    covering_column: str | None,
    predicate: Predicate,
    conditions: list[Condition],
    x_intervals: list[tuple[float, float]] | None = None,
) -> pa.Table:
    """The rows that meet the predicate; `covering_column` None: the table stores no covering."""
    if covering_column is None:
        return _geometry_matches(rows, geometry_column, predicate, x_intervals)
    # The bbox conditions are a cheap necessary test (exact for points and intersects with a
    # box), so GEOS only sees the rows they leave.
    covering = rows.column(covering_column)
    keep = None
    for k, op, value in conditions:
        field = pc.struct_field(covering, BBOX_FIELDS[k])
        test = pc.less_equal(field, value) if op == "<=" else pc.greater_equal(field, value)
        keep = test if keep is None else pc.and_(keep, test)
    if x_intervals is not None:
        xmin = pc.struct_field(covering, "xmin").to_numpy(zero_copy_only=False)
        xmax = pc.struct_field(covering, "xmax").to_numpy(zero_copy_only=False)
        touches = np.zeros(len(xmin), dtype=bool)
        for lo, hi in x_intervals:
            touches |= x_overlaps(xmin, xmax, lo, hi)
        test = pa.array(touches)
        keep = test if keep is None else pc.and_(keep, test)
    candidates = rows.filter(keep) if keep is not None else rows
    return _geometry_matches(candidates, geometry_column, predicate, x_intervals)


def _geometry_matches(
    candidates: pa.Table, geometry_column: str, predicate: Predicate, x_intervals: list[tuple[float, float]] | None
) -> pa.Table:
    """The rows whose geometry meets the predicate, by GEOS (read the short way with `x_intervals`)."""
    if candidates.num_rows == 0:
        return candidates
    geometries = shapely.from_wkb(wkb_storage(candidates.column(geometry_column)).to_numpy())
    q = predicate.geometry
    shapely.prepare(q)
    wide = np.zeros(0, dtype=np.int64)
    if x_intervals is not None:
        # Read the short way, only a geometry wider than 180 degrees can have an edge that long.
        bounds = shapely.bounds(geometries)
        wide = np.flatnonzero(bounds[:, 2] - bounds[:, 0] > 180.0)
    if wide.size and predicate.kind == "intersects":
        # Q against the unwrapped shapes, and Q moved a turn and two east: no cutting needed.
        plain = np.ones(len(geometries), dtype=bool)
        plain[wide] = False
        hits = np.zeros(len(geometries), dtype=bool)
        hits[plain] = shapely.intersects(q, geometries[plain])
        shapes, _ = unwrapped(geometries[wide])
        near = np.zeros(wide.size, dtype=bool)
        for turn in (0.0, 360.0, 720.0):
            moved = q if turn == 0.0 else shapely.transform(q, lambda c, t=turn: c + np.array([t, 0.0]))
            near |= shapely.intersects(moved, shapes)
        hits[wide] = near
        return candidates.filter(pa.array(hits))
    if wide.size:
        # within and contains: the geometry cut at ±180 into parts in [-180, 180]
        geometries[wide] = split_at_antimeridian(geometries[wide])
    if predicate.kind == "intersects":
        hits = shapely.intersects(q, geometries)
    elif predicate.kind == "within":
        hits = shapely.contains(q, geometries)  # g within Q <=> Q contains g; Q is the prepared one
    else:
        hits = shapely.contains(geometries, q)
    return candidates.filter(pa.array(hits))


# -- GeoParquet output ----------------------------------------------------------------------------
def table_contract(table: Table) -> Contract:
    """The contract the table holds: the one recorded in its `geoingest.contract` property, with
    the columns the table gained since (schema evolution at ingest)."""
    raw = _property(table, CONTRACT_PROPERTY)
    try:
        return contract_of_table(table, parse_contract(json.loads(raw)))
    except (json.JSONDecodeError, ContractError, TableMismatch) as exc:
        raise QueryError(f"table property {CONTRACT_PROPERTY!r} is not a usable contract ({exc})") from None
