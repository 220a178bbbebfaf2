"""Spatial window queries against a real Iceberg table (SQL catalog on SQLite, no Spark).

The table is built by the project's own pieces: events are decoded by `Decoder` from a batch
shaped like Spark's Kafka source, Hilbert-sorted, written by `GeoParquetWriter` in small files
and row groups, and committed with the writer's metrics, so the query sees the real layout.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import time as time_module
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import shapely
import shapely.affinity
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from streaming.contract import Contract, load_contract
from streaming.decode.decoder import HILBERT, REJECT_REASON, Decoder
from streaming.read.output import feature_id_column, to_geojson_lines, write_geoparquet
from streaming.read.predicate import Predicate, parse_bbox
from streaming.read.query import QueryResult, QueryStats, query, query_bbox, table_contract
from streaming.table.catalog import partition_layout
from streaming.table.commit import to_data_file
from streaming.write.data_files import DataFileRecord, GeoParquetWriter

CONTRACT_PATH = Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json"
EVENT_COUNT = 20_000
POLYGON_EVERY = 50  # one event in 50 is a WKB polygon, one in 50 a WKB line, the rest GeoJSON points
LINE_EVERY = 50
MAX_POLYGON_HALF_WIDTH = 2.0
UNIFORM_SHARE = 0.1  # sparse events anywhere on the globe, between the clusters
ROW_GROUP_ROWS = 200
TARGET_FILE_BYTES = 45_000  # about 800 rows, four row groups, per file
# A level-3 Hilbert cell is 1/8 of the extent on each side (45 x 22.5 degrees); every cell of
# the quadtree is one contiguous range of Hilbert keys. The Java cluster sits at the centre of
# the cell [90, 135] x [-22.5, 0], so all its rows are one run of the sorted table.
JAVA_CELL = (90.0, -22.5, 135.0, 0.0)
CLUSTERS = {  # centre (lon, lat), share of the clustered events
    "paris": ((2.35, 48.85), 0.35),
    "new_york": ((-74.0, 40.7), 0.25),
    "tokyo": ((139.7, 35.7), 0.20),
    "java": ((112.5, -11.25), 0.10),
    "johannesburg": ((28.0, -26.2), 0.10),
}
CLUSTER_SIGMA = (3.0, 2.0)  # degrees, lon and lat
KAFKA_TIMESTAMP_US = 1_700_000_000_000_000


@dataclass(frozen=True)
class Built:
    table: Table
    records: list[DataFileRecord]
    rows: pa.Table  # every stored row, read back from the data files
    root: Path  # the catalog (catalog.db) and warehouse folder


def _events(rng: np.random.Generator, count: int = EVENT_COUNT, first_id: int = 0) -> tuple[list[bytes], list[bytes]]:
    """Kafka keys and values at skewed random places: GeoJSON Point features, and WKB polygons
    (boxes, triangles, L shapes) and zigzag lines, each inside a box of half-width at most
    MAX_POLYGON_HALF_WIDTH (half that in y) around its place."""
    names = list(CLUSTERS)
    centres = np.array([CLUSTERS[n][0] for n in names])
    shares = np.array([CLUSTERS[n][1] for n in names])
    which = rng.choice(len(names), count, p=shares)
    x = centres[which, 0] + rng.normal(0.0, CLUSTER_SIGMA[0], count)
    y = centres[which, 1] + rng.normal(0.0, CLUSTER_SIGMA[1], count)
    uniform = rng.random(count) < UNIFORM_SHARE
    x[uniform] = rng.uniform(-180.0, 180.0, uniform.sum())
    y[uniform] = rng.uniform(-90.0, 90.0, uniform.sum())
    # Keep polygons inside the valid area of EPSG:4326, which the decoder enforces.
    margin = MAX_POLYGON_HALF_WIDTH + 0.1
    x = np.clip(x, -180.0 + margin, 180.0 - margin)
    y = np.clip(y, -90.0 + margin, 90.0 - margin)
    half_widths = rng.uniform(0.05, MAX_POLYGON_HALF_WIDTH, count)
    jitter = rng.uniform(-1.0, 1.0, (count, 4))

    keys: list[bytes] = []
    values: list[bytes] = []
    for n in range(count):
        i = first_id + n
        w, h, j = half_widths[n], half_widths[n] / 2, jitter[n]
        if i % POLYGON_EVERY == 0:
            shape = (i // POLYGON_EVERY) % 3
            if shape == 0:
                polygon = shapely.box(x[n] - w, y[n] - h, x[n] + w, y[n] + h)
            elif shape == 1:
                polygon = shapely.Polygon(
                    [(x[n] - w, y[n] - h), (x[n] + w, y[n] - h * abs(j[0])), (x[n] + w * j[1], y[n] + h)]
                )
            else:
                cx, cy = x[n] + w * j[2] * 0.8, y[n] + h * j[3] * 0.8
                polygon = shapely.Polygon(
                    [
                        (x[n] - w, y[n] - h),
                        (x[n] + w, y[n] - h),
                        (x[n] + w, cy),
                        (cx, cy),
                        (cx, y[n] + h),
                        (x[n] - w, y[n] + h),
                    ]
                )
            keys.append(f"poly-{i}".encode())  # WKB has no id: event_id comes from the key
            values.append(shapely.to_wkb(polygon))
        elif i % LINE_EVERY == LINE_EVERY // 2:
            line = shapely.LineString(
                [
                    (x[n] - w, y[n] + h * j[0]),
                    (x[n] - w / 3, y[n] + h * j[1]),
                    (x[n] + w / 3, y[n] + h * j[2]),
                    (x[n] + w, y[n] + h * j[3]),
                ]
            )
            keys.append(f"line-{i}".encode())
            values.append(shapely.to_wkb(line))
        else:
            feature = {
                "type": "Feature",
                "id": f"pt-{i}",
                "geometry": {"type": "Point", "coordinates": [x[n], y[n]]},
                "properties": {"kind": "probe", "speed": float(i % 37)},
            }
            keys.append(f"key-{i}".encode())
            values.append(json.dumps(feature).encode())
    return keys, values


def _kafka_batch(keys: list[bytes], values: list[bytes]) -> pa.RecordBatch:
    """A batch shaped like Spark's Kafka source."""
    n = len(values)
    return pa.record_batch(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array(["demo-events"] * n, pa.string()),
            "partition": pa.array(np.arange(n) % 3, pa.int32()),
            "offset": pa.array(np.arange(n), pa.int64()),
            "timestamp": pa.array(KAFKA_TIMESTAMP_US + np.arange(n) * 1000, pa.timestamp("us")),
        }
    )


def _catalog(root: Path) -> SqlCatalog:
    return SqlCatalog("test", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")


def _create_table(catalog: SqlCatalog, contract: Contract) -> Table:
    catalog.create_namespace_if_not_exists(contract.namespace)
    return catalog.create_table(contract.table, contract.iceberg_schema, properties=contract.table_properties())


def _read_all_rows(table: Table, records: list[DataFileRecord]) -> pa.Table:
    pieces = []
    for record in records:
        with table.io.new_input(record.path).open() as stream:
            pieces.append(pq.read_table(stream))
    return pa.concat_tables(pieces)


def _decoded_rows(
    contract: Contract, rng: np.random.Generator, count: int = EVENT_COUNT, first_id: int = 0
) -> pa.Table:
    decoded = Decoder(contract).decode(_kafka_batch(*_events(rng, count, first_id)))
    valid = pa.Table.from_batches([decoded]).filter(pc.is_null(decoded.column(REJECT_REASON)))
    assert valid.num_rows == count, "every generated event should decode"
    return valid


def _append(table: Table, contract: Contract, rows: pa.Table, prefix: str = "test") -> list[DataFileRecord]:
    """Hilbert-sort the rows, write them in small files and row groups, and commit one fast append."""
    small_files = dataclasses.replace(
        contract,
        clustering=dataclasses.replace(
            contract.clustering, target_file_bytes=TARGET_FILE_BYTES, row_group_rows=ROW_GROUP_ROWS
        ),
    )
    writer = GeoParquetWriter(
        small_files, table.properties, table.io.properties, table.location() + "/data", prefix, partition_layout(table)
    )
    records = list(writer.write(rows.sort_by(HILBERT).to_batches(max_chunksize=1000)))
    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as append:
            for record in records:
                append.append_data_file(to_data_file(record, table.metadata.default_spec_id))
    return records


@pytest.fixture(scope="module")
def contract() -> Contract:
    return load_contract(CONTRACT_PATH)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, contract: Contract) -> Built:
    root = tmp_path_factory.mktemp("iceberg")
    catalog = _catalog(root)
    table = _create_table(catalog, contract)
    records = _append(table, contract, _decoded_rows(contract, np.random.default_rng(20240611)))
    table = catalog.load_table(contract.table)
    rows = _read_all_rows(table, records)
    assert len(records) >= 20 and rows.num_rows == EVENT_COUNT
    return Built(table, records, rows, root)


def _brute_force_ids(rows: pa.Table, bbox: tuple[float, float, float, float]) -> set[str]:
    geometries = shapely.from_wkb(rows.column("geometry").to_numpy(zero_copy_only=False))
    hits = shapely.intersects(geometries, shapely.box(*bbox))
    return set(rows.column("event_id").filter(pa.array(hits)).to_pylist())


def _ids(result: QueryResult) -> set[str]:
    ids = result.table.column("event_id").to_pylist()
    assert len(ids) == len(set(ids)), "a row must not be returned twice"
    return set(ids)


def _random_windows(rng: np.random.Generator, rows: pa.Table, count: int) -> list[tuple[float, float, float, float]]:
    """Windows of many sizes, half centred on stored geometries (where the data is dense),
    half anywhere (mostly sparse or empty)."""
    bbox = rows.column("bbox").combine_chunks()
    windows = []
    for i in range(count):
        width = float(np.exp(rng.uniform(np.log(0.05), np.log(120.0))))
        height = width * float(rng.uniform(0.3, 1.0))
        if i % 2 == 0:
            row = int(rng.integers(rows.num_rows))
            cx, cy = bbox.field("xmin")[row].as_py(), bbox.field("ymin")[row].as_py()
        else:
            cx, cy = float(rng.uniform(-180, 180)), float(rng.uniform(-90, 90))
        windows.append((cx - width / 2, cy - height / 2, cx + width / 2, cy + height / 2))
    return windows


# -- results ------------------------------------------------------------------------------------
def test_query_matches_brute_force_on_random_windows(built: Built) -> None:
    rng = np.random.default_rng(7)
    windows = _random_windows(rng, built.rows, 30) + [(-180.0, -90.0, 180.0, 90.0)]
    matched_somewhere = 0
    for window in windows:
        result = query_bbox(built.table, window)
        expected = _brute_force_ids(built.rows, window)
        assert _ids(result) == expected, f"window {window}"
        assert result.stats.rows_matched == len(expected)
        assert result.stats.rows_read >= result.stats.rows_matched
        matched_somewhere += bool(expected)
    assert matched_somewhere >= 20, "most windows should hold rows, or the comparison proves little"


def test_result_has_the_table_columns_with_wkb_geometry(built: Built) -> None:
    result = query_bbox(built.table, (100.0, -20.0, 125.0, -5.0))
    assert result.table.column_names == [f.name for f in built.table.schema().fields]
    assert pa.types.is_binary(result.table.schema.field("geometry").type)
    assert result.table.num_rows > 0
    geometries = shapely.from_wkb(result.table.column("geometry").to_numpy(zero_copy_only=False))
    assert not np.equal(geometries, None).any()


def test_polygons_are_found_by_their_shape_not_only_their_centre(built: Built) -> None:
    polygons = built.rows.filter(pc.starts_with(built.rows.column("event_id"), "poly-"))
    polygon = shapely.from_wkb(polygons.column("geometry")[0].as_py())
    xmin, ymin, xmax, ymax = polygon.bounds
    # A thin window over the polygon's right edge only: far from its centre, inside its bbox.
    window = (xmax - 0.01, ymin, xmax + 0.5, ymax)
    assert polygons.column("event_id")[0].as_py() in _ids(query_bbox(built.table, window))


def test_window_edges_are_inclusive_and_degenerate_windows_work(built: Built) -> None:
    points = built.rows.filter(pc.starts_with(built.rows.column("event_id"), "pt-"))
    point = shapely.from_wkb(points.column("geometry")[123].as_py())
    point_id = points.column("event_id")[123].as_py()
    assert point_id in _ids(query_bbox(built.table, (point.x, point.y, point.x, point.y)))
    assert point_id in _ids(query_bbox(built.table, (point.x, point.y - 1.0, point.x, point.y + 1.0)))
    assert point_id in _ids(query_bbox(built.table, (point.x - 1.0, point.y, point.x, point.y + 1.0)))
    assert point_id not in _ids(query_bbox(built.table, (point.x + 1e-9, point.y, point.x + 1.0, point.y)))


# -- pruning ------------------------------------------------------------------------------------
def test_small_window_reads_few_files_and_row_groups(built: Built) -> None:
    # 1 % of the extent's area (36 x 18 degrees), centred on the Java cluster's level-3 Hilbert
    # cell and 4.5 / 2.25 degrees inside its edges: no polygon centred outside the cell reaches in.
    cxmin, cymin, cxmax, cymax = JAVA_CELL
    cx, cy = (cxmin + cxmax) / 2, (cymin + cymax) / 2
    window = (cx - 18.0, cy - 9.0, cx + 18.0, cy + 9.0)
    assert (window[2] - window[0]) * (window[3] - window[1]) <= 0.01 * 360 * 180
    assert MAX_POLYGON_HALF_WIDTH < min(window[0] - cxmin, window[1] - cymin)

    result = query_bbox(built.table, window)
    stats = result.stats

    # Every matching row has its bbox centre in the cell, and the cell's rows are one run of
    # the Hilbert-sorted table, cut into files of at least `rows_per_file` rows: the run spans
    # at most ceil(run / rows_per_file) + 1 files. One more is allowed for a file of sparse rows
    # outside the cell whose bbox happens to stretch across the window.
    bbox = built.rows.column("bbox").combine_chunks()
    centre_x = pc.divide(pc.add(bbox.field("xmin"), bbox.field("xmax")), 2.0)
    centre_y = pc.divide(pc.add(bbox.field("ymin"), bbox.field("ymax")), 2.0)
    in_cell = pc.and_(
        pc.and_(pc.greater_equal(centre_x, cxmin), pc.less(centre_x, cxmax)),
        pc.and_(pc.greater_equal(centre_y, cymin), pc.less(centre_y, cymax)),
    )
    cell_rows = pc.sum(in_cell.cast(pa.int64())).as_py()
    rows_per_file = min(r.record_count for r in built.records[:-1])  # the last file may be short
    bound = math.ceil(cell_rows / rows_per_file) + 2

    assert stats.files_total == len(built.records)
    assert stats.rows_matched == len(_brute_force_ids(built.rows, window)) > 0
    assert stats.files_scanned <= bound, (stats, cell_rows, rows_per_file)
    assert stats.files_scanned <= stats.files_total // 4, stats
    assert stats.row_groups_scanned < stats.row_groups_total, stats
    assert stats.rows_read <= stats.row_groups_scanned * ROW_GROUP_ROWS


def test_file_pruning_is_as_tight_as_the_manifest_bounds(built: Built) -> None:
    # A file is read exactly when the bbox it was written with overlaps the window.
    for window in _random_windows(np.random.default_rng(11), built.rows, 10):
        qxmin, qymin, qxmax, qymax = window
        overlapping = sum(
            1
            for r in built.records
            if r.bbox[0] <= qxmax and r.bbox[2] >= qxmin and r.bbox[1] <= qymax and r.bbox[3] >= qymin
        )
        assert query_bbox(built.table, window).stats.files_scanned == overlapping, window


def test_empty_window_reads_no_rows(built: Built) -> None:
    # Below every stored geometry (the decoder keeps them inside [-90, 90] with our margin).
    stats = query_bbox(built.table, (-10.0, -89.99, 10.0, -89.98)).stats
    assert stats.rows_matched == 0
    assert stats.files_total == len(built.records)


# -- limit --------------------------------------------------------------------------------------
def test_limit_is_honoured_and_stops_reading(built: Built) -> None:
    world = (-180.0, -90.0, 180.0, 90.0)
    everything = query_bbox(built.table, world)
    limited = query_bbox(built.table, world, limit=7)
    assert limited.table.num_rows == limited.stats.rows_matched == 7
    assert _ids(limited) <= _ids(everything)
    assert limited.stats.files_scanned == 1 and limited.stats.rows_read == ROW_GROUP_ROWS

    window = (100.0, -20.0, 125.0, -5.0)
    all_in_window = _ids(query_bbox(built.table, window))
    big = query_bbox(built.table, window, limit=len(all_in_window) + 100)
    assert _ids(big) == all_in_window
    assert query_bbox(built.table, window, limit=0).table.num_rows == 0


def test_negative_limit_is_refused(built: Built) -> None:
    with pytest.raises(ValueError, match="limit"):
        query_bbox(built.table, (0.0, 0.0, 1.0, 1.0), limit=-1)


# -- edge cases ---------------------------------------------------------------------------------
def test_empty_table_gives_an_empty_result(tmp_path: Path, contract: Contract) -> None:
    table = _create_table(_catalog(tmp_path), contract)
    result = query_bbox(table, (-180.0, -90.0, 180.0, 90.0))
    assert result.stats == QueryStats(0, 0, 0, 0, 0, 0)
    assert result.table.num_rows == 0
    assert result.table.column_names == [f.name for f in table.schema().fields]
    assert list(to_geojson_lines(result, "geometry")) == []


@pytest.mark.parametrize(
    "text",
    ["1,2,3", "1,2,3,4,5", "", "a,b,c,d", "1,2,,4", "300,0,1,1", "0,3,1,1", "nan,0,1,1", "0,0,inf,1"],
)
def test_parse_bbox_errors_name_the_text(text: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_bbox(text)
    assert repr(text) in str(error.value)


def test_parse_bbox_reads_four_numbers() -> None:
    assert parse_bbox("-10.5, 20,30 ,40.25") == (-10.5, 20.0, 30.0, 40.25)
    assert parse_bbox("1,2,1,2") == (1.0, 2.0, 1.0, 2.0)


# -- GeoJSON ------------------------------------------------------------------------------------
def test_geojson_lines_are_features_with_ids_and_properties(built: Built) -> None:
    result = query_bbox(built.table, (100.0, -20.0, 125.0, -5.0))
    id_column = feature_id_column(table_contract(built.table))
    assert id_column == "event_id", "the demo contract's event id comes from the event's own id"
    lines = list(to_geojson_lines(result, "geometry", id_column))
    assert len(lines) == result.table.num_rows > 0

    features = [json.loads(line) for line in lines]
    assert all(f["type"] == "Feature" for f in features)
    assert {f["id"] for f in features} == _ids(result)
    wkb = shapely.from_wkb(result.table.column("geometry").to_numpy(zero_copy_only=False))
    decoded = np.array([shapely.from_geojson(json.dumps(f["geometry"])) for f in features])
    assert shapely.equals_exact(decoded, wkb, tolerance=1e-9).all()

    properties = features[0]["properties"]
    assert "geometry" not in properties
    assert set(properties) == set(result.table.column_names) - {"geometry"}
    event_time = datetime.fromisoformat(properties["event_time"])
    assert event_time.utcoffset() is not None and event_time.year == 2023
    kinds = {f["properties"]["kind"] for f in features if f["id"].startswith("pt-")}
    assert kinds == {"probe"}


# -- predicates -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def geometries(built: Built) -> np.ndarray:
    return shapely.from_wkb(built.rows.column("geometry").to_numpy(zero_copy_only=False))


def _brute_force(built: Built, geometries: np.ndarray, predicate: Predicate) -> set[str]:
    """The ids of every stored row meeting the predicate, by shapely over all rows."""
    test = {"intersects": shapely.intersects, "within": shapely.within, "contains": shapely.contains}[predicate.kind]
    hits = test(geometries, predicate.geometry)
    return set(built.rows.column("event_id").filter(pa.array(hits)).to_pylist())


def _of_kind(built: Built, geometries: np.ndarray, prefix: str) -> list[shapely.Geometry]:
    mask = pc.starts_with(built.rows.column("event_id"), prefix).to_numpy(zero_copy_only=False)
    return list(geometries[mask])


def _star(cx: float, cy: float, radius: float, rng: np.random.Generator) -> shapely.Polygon:
    """A concave star with 5..9 points, randomly rotated."""
    points = int(rng.integers(5, 10))
    angles = np.linspace(0.0, 2 * np.pi, 2 * points, endpoint=False) + rng.uniform(0, np.pi)
    radii = np.where(np.arange(2 * points) % 2 == 0, radius, radius * rng.uniform(0.3, 0.6))
    return shapely.Polygon(np.column_stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)]))


def _rotated_rectangle(cx: float, cy: float, width: float, height: float, angle: float) -> shapely.Polygon:
    return shapely.affinity.rotate(
        shapely.box(cx - width / 2, cy - height / 2, cx + width / 2, cy + height / 2), angle, origin=(cx, cy)
    )


def _windows_and_shapes(
    built: Built, geometries: np.ndarray, rng: np.random.Generator, count: int
) -> list[shapely.Geometry]:
    """Query geometries for intersects and within: boxes, rotated rectangles, triangles and stars
    of many sizes, centred on stored geometries or anywhere; and shapes around stored lines and
    polygons, sized so that they sometimes hold them whole."""
    shapes: list[shapely.Geometry] = []
    boxes = _random_windows(rng, built.rows, count)
    lines, polygons = _of_kind(built, geometries, "line-"), _of_kind(built, geometries, "poly-")
    for i in range(count):
        xmin, ymin, xmax, ymax = boxes[i]
        cx, cy, size = (xmin + xmax) / 2, (ymin + ymax) / 2, xmax - xmin
        kind = i % 5
        if kind == 0:
            shapes.append(shapely.box(*boxes[i]))
        elif kind == 1:
            shapes.append(_rotated_rectangle(cx, cy, size, size * rng.uniform(0.2, 1.0), rng.uniform(0, 90)))
        elif kind == 2:
            shapes.append(
                shapely.Polygon(
                    [
                        (cx - size / 2, cy - size / 3),
                        (cx + size / 2, cy - size / 4),
                        (cx + rng.uniform(-0.5, 0.5) * size, cy + size / 2),
                    ]
                )
            )
        elif kind == 3:
            shapes.append(_star(cx, cy, size / 2, rng))
        else:
            stored = (lines if i % 2 else polygons)[int(rng.integers(len(lines)))]
            c = stored.envelope.centroid
            reach = max(stored.bounds[2] - stored.bounds[0], stored.bounds[3] - stored.bounds[1])
            shapes.append(_star(c.x, c.y, reach * rng.uniform(0.6, 3.0), rng))
    # A stored polygon is within itself; its envelope holds it; a stored line's buffer holds it.
    shapes += [polygons[3], polygons[4].envelope, lines[5].buffer(0.01)]
    return shapes


def _contained_shapes(
    built: Built, geometries: np.ndarray, rng: np.random.Generator, count: int
) -> list[shapely.Geometry]:
    """Query geometries for contains: points (stored points, points inside and on the boundary of
    stored polygons, line vertices), small boxes and triangles inside or across stored polygons,
    pieces of stored lines, and shapes anywhere."""
    points, lines = _of_kind(built, geometries, "pt-"), _of_kind(built, geometries, "line-")
    polygons = _of_kind(built, geometries, "poly-")
    shapes: list[shapely.Geometry] = []
    for i in range(count):
        polygon = polygons[int(rng.integers(len(polygons)))]
        line = lines[int(rng.integers(len(lines)))]
        kind = i % 8
        if kind == 0:
            shapes.append(points[int(rng.integers(len(points)))])  # a point contains itself
        elif kind == 1:
            # An inner vertex lies in the line's interior; an end is its boundary, not contained.
            shapes.append(shapely.Point(shapely.get_coordinates(line)[(i // 8) % 4]))
        elif kind == 2:
            shapes.append(shapely.Point(shapely.get_coordinates(polygon)[0]))  # on the boundary: no
        elif kind == 3:
            inside = shapely.Point(*polygon.representative_point().coords[0])
            shapes.append(inside)
        elif kind in (4, 5):
            p = polygon.representative_point()
            side = (polygon.bounds[2] - polygon.bounds[0]) * float(np.exp(rng.uniform(np.log(0.01), np.log(0.8))))
            if kind == 4:
                shapes.append(shapely.box(p.x - side / 2, p.y - side / 4, p.x + side / 2, p.y + side / 4))
            else:
                shapes.append(
                    shapely.Polygon([(p.x - side / 2, p.y - side / 3), (p.x + side / 2, p.y), (p.x, p.y + side / 2)])
                )
        elif kind == 6:
            # Pieces of the line made of its own vertices (interpolated points would miss it by
            # rounding), or the whole line.
            vertices = shapely.get_coordinates(line)
            first = (i // 8) % 3
            shapes.append(shapely.LineString(vertices[first : first + 2]) if first < 2 else line)
        else:
            cx, cy = float(rng.uniform(-180, 180)), float(rng.uniform(-90, 90))
            shapes.append(_star(cx, cy, float(rng.uniform(0.01, 5.0)), rng))
    shapes += [polygons[7], polygon.envelope]  # a polygon contains itself, not (mostly) its envelope
    return shapes


def _check_against_brute_force(
    built: Built, geometries: np.ndarray, kind: str, shapes: list[shapely.Geometry]
) -> tuple[int, set[str]]:
    matched_somewhere, found = 0, set()
    for q in shapes:
        predicate = Predicate(kind, q)
        result = query(built.table, predicate)
        expected = _brute_force(built, geometries, predicate)
        assert _ids(result) == expected, f"{kind} {q.wkt}"
        assert result.stats.rows_matched == len(expected) <= result.stats.rows_read
        matched_somewhere += bool(expected)
        found |= expected
    return matched_somewhere, found


def test_intersects_matches_brute_force(built: Built, geometries: np.ndarray) -> None:
    rng = np.random.default_rng(101)
    shapes = _windows_and_shapes(built, geometries, rng, 30)
    points = _of_kind(built, geometries, "pt-")
    lines = _of_kind(built, geometries, "line-")
    # Lines and points as Q too: a path across Europe, a stored point, a stored line.
    shapes += [shapely.LineString([(-10, 40), (5, 50), (20, 45)]), points[10], lines[11]]
    matched, found = _check_against_brute_force(built, geometries, "intersects", shapes)
    assert matched >= 25
    assert {i.split("-")[0] for i in found} == {"pt", "line", "poly"}


def test_within_matches_brute_force(built: Built, geometries: np.ndarray) -> None:
    shapes = _windows_and_shapes(built, geometries, np.random.default_rng(202), 30)
    matched, found = _check_against_brute_force(built, geometries, "within", shapes)
    assert matched >= 20
    assert {i.split("-")[0] for i in found} == {"pt", "line", "poly"}


def test_contains_matches_brute_force(built: Built, geometries: np.ndarray) -> None:
    shapes = _contained_shapes(built, geometries, np.random.default_rng(303), 40)
    matched, found = _check_against_brute_force(built, geometries, "contains", shapes)
    assert matched >= 20
    # Points contain points, lines contain points and pieces of themselves, polygons contain the rest.
    assert {i.split("-")[0] for i in found} == {"pt", "line", "poly"}


def test_boundary_cases_follow_the_predicates(built: Built, geometries: np.ndarray) -> None:
    ids = built.rows.column("event_id").to_pylist()
    index = {event_id: i for i, event_id in enumerate(ids)}
    line_id = next(i for i in ids if i.startswith("line-"))
    line = geometries[index[line_id]]
    start, inner = (shapely.Point(c) for c in shapely.get_coordinates(line)[:2])
    assert line_id in _ids(query(built.table, Predicate("contains", inner)))
    assert line_id not in _ids(query(built.table, Predicate("contains", start)))  # the boundary
    assert line_id in _ids(query(built.table, Predicate("intersects", start)))
    polygon_id = next(i for i in ids if i.startswith("poly-"))
    polygon = geometries[index[polygon_id]]
    assert polygon_id in _ids(query(built.table, Predicate("within", polygon)))
    assert polygon_id in _ids(query(built.table, Predicate("contains", polygon)))
    assert polygon_id not in _ids(query(built.table, Predicate("within", polygon.buffer(-0.01))))


def test_query_bbox_is_query_intersects_a_box(built: Built) -> None:
    for window in _random_windows(np.random.default_rng(5), built.rows, 8):
        old = query_bbox(built.table, window)
        new = query(built.table, Predicate("intersects", shapely.box(*window)))
        assert old.stats == new.stats and _ids(old) == _ids(new)
    assert Predicate.from_bbox((1.0, 2.0, 1.0, 2.0)).geometry.geom_type == "Point"
    assert Predicate.from_bbox((1.0, 2.0, 1.0, 5.0)).geometry.geom_type == "LineString"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("POLYGON((0 0, 1 1", "not well-known text"),
        ("not wkt at all", "not well-known text"),
        ("", "not well-known text"),
        ("POLYGON EMPTY", "empty"),
        ("POLYGON((0 0, 2 2, 2 0, 0 2, 0 0))", "not a valid geometry"),
        ("POINT(nan 1)", "finite"),
    ],
)
def test_wkt_errors_name_the_text(text: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        Predicate.from_wkt("within", text)
    assert repr(text) in str(error.value) and message in str(error.value)
    assert str(error.value).startswith("within WKT")


def test_unknown_predicate_is_refused() -> None:
    with pytest.raises(ValueError, match="'overlaps'"):
        Predicate("overlaps", shapely.Point(0, 0))
    with pytest.raises(ValueError, match="'touches'"):
        Predicate.from_wkt("touches", "POINT(0 0)")


# -- pruning by predicate ---------------------------------------------------------------------------
def _manifest_bounds(record: DataFileRecord, contract: Contract) -> tuple[np.ndarray, np.ndarray]:
    """The lower and upper bounds of bbox.xmin, .ymin, .xmax, .ymax the manifest holds for a file."""
    ids = [contract.bbox_field_ids[name] for name in ("xmin", "ymin", "xmax", "ymax")]
    lower = [struct.unpack("<d", bytes.fromhex(record.metrics["lower_bounds"][str(i)]))[0] for i in ids]
    upper = [struct.unpack("<d", bytes.fromhex(record.metrics["upper_bounds"][str(i)]))[0] for i in ids]
    return np.array(lower), np.array(upper)


def _files_that_may_match(built: Built, contract: Contract, predicate: Predicate) -> int:
    """The files a query must open, by the rules written out: Havasu's inclusive projections on
    the manifest bounds of the four bbox columns."""
    qxmin, qymin, qxmax, qymax = predicate.geometry.bounds
    count = 0
    for record in built.records:
        (lo_xmin, lo_ymin, lo_xmax, lo_ymax), (hi_xmin, hi_ymin, hi_xmax, hi_ymax) = _manifest_bounds(record, contract)
        mbr_overlaps_q_bbox = lo_xmin <= qxmax and hi_xmax >= qxmin and lo_ymin <= qymax and hi_ymax >= qymin
        mbr = shapely.box(lo_xmin, lo_ymin, hi_xmax, hi_ymax)
        if predicate.kind == "intersects":
            may = mbr_overlaps_q_bbox and mbr.intersects(predicate.geometry)
        elif predicate.kind == "within":
            # Some row must have xmin >= qxmin (so max(xmin) >= qxmin), xmax <= qxmax, ...
            fits = hi_xmin >= qxmin and lo_xmax <= qxmax and hi_ymin >= qymin and lo_ymax <= qymax
            may = mbr_overlaps_q_bbox and fits and mbr.intersects(predicate.geometry)
        else:
            may = lo_xmin <= qxmin and hi_xmax >= qxmax and lo_ymin <= qymin and hi_ymax >= qymax
        count += may
    return count


def test_file_pruning_follows_the_inclusive_projections(
    built: Built, contract: Contract, geometries: np.ndarray
) -> None:
    rng = np.random.default_rng(404)
    cases = [("intersects", q) for q in _windows_and_shapes(built, geometries, rng, 10)]
    cases += [("within", q) for q in _windows_and_shapes(built, geometries, rng, 10)]
    cases += [("contains", q) for q in _contained_shapes(built, geometries, rng, 16)]
    for kind, q in cases:
        predicate = Predicate(kind, q)
        stats = query(built.table, predicate).stats
        assert stats.files_scanned == _files_that_may_match(built, contract, predicate), (kind, q.wkt, stats)


def test_within_and_intersects_prune_like_bbox(built: Built) -> None:
    for window in _random_windows(np.random.default_rng(13), built.rows, 10):
        bbox_stats = query_bbox(built.table, window).stats
        intersects = query(built.table, Predicate("intersects", shapely.box(*window))).stats
        within = query(built.table, Predicate("within", shapely.box(*window))).stats
        assert intersects == bbox_stats
        # A row within the window overlaps it: within never reads more than intersects.
        assert within.files_scanned <= intersects.files_scanned
        assert within.row_groups_scanned <= intersects.row_groups_scanned
        assert within.rows_read <= intersects.rows_read


def test_contains_with_a_small_geometry_scans_few_files(built: Built, geometries: np.ndarray) -> None:
    # A small box inside a polygon of the Java cluster.
    ids = built.rows.column("event_id").to_pylist()
    cxmin, cymin, cxmax, cymax = JAVA_CELL
    inside = [
        i
        for i, g in enumerate(geometries)
        if ids[i].startswith("poly-") and cxmin + 5 < g.centroid.x < cxmax - 5 and cymin + 5 < g.centroid.y < cymax - 5
    ]
    polygon = geometries[inside[0]]
    p = polygon.representative_point()
    q = shapely.box(p.x - 0.01, p.y - 0.01, p.x + 0.01, p.y + 0.01)
    result = query(built.table, Predicate("contains", q))
    stats = result.stats
    assert ids[inside[0]] in _ids(result)
    assert stats.files_scanned <= 3 and stats.files_scanned <= stats.files_total // 8, stats
    assert stats.row_groups_scanned < stats.row_groups_total, stats
    # A geometry larger than any stored one: no row can contain it, and no file's MBR does; the
    # same geometry opens many files for intersects.
    big = shapely.box(cxmin + 4.5, cymin + 2.25, cxmax - 4.5, cymax - 2.25)
    contains = query(built.table, Predicate("contains", big)).stats
    intersects = query(built.table, Predicate("intersects", big)).stats
    assert contains.rows_matched == 0 and contains.files_scanned <= 2, contains
    assert intersects.files_scanned >= 3 * max(contains.files_scanned, 1), (contains, intersects)


def test_a_thin_diagonal_opens_only_the_files_it_crosses(built: Built, geometries: np.ndarray) -> None:
    # Its bbox is the whole world, so the bbox conditions keep every file; the MBR test on the
    # shape itself keeps only the files it crosses.
    diagonal = shapely.Polygon([(-170, -80), (-169, -80), (170, 80), (169, 80)])
    predicate = Predicate("intersects", diagonal)
    result = query(built.table, predicate)
    assert _ids(result) == _brute_force(built, geometries, predicate)
    stats = result.stats
    assert stats.files_scanned < stats.files_total // 2, stats
    assert query(built.table, Predicate("intersects", diagonal.envelope)).stats.files_scanned == stats.files_total


# -- time travel ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TwoCommits:
    table: Table
    first: int  # snapshot ids
    second: int
    first_rows: int
    all_rows: int
    root: Path


@pytest.fixture(scope="module")
def two_commits(tmp_path_factory: pytest.TempPathFactory, contract: Contract) -> TwoCommits:
    root = tmp_path_factory.mktemp("two-commits")
    catalog = _catalog(root)
    table = _create_table(catalog, contract)
    _append(table, contract, _decoded_rows(contract, np.random.default_rng(1), 3000))
    table = catalog.load_table(contract.table)
    first = table.current_snapshot()
    while time_module.time() * 1000 < first.timestamp_ms + 5:  # distinct commit times
        time_module.sleep(0.002)
    _append(table, contract, _decoded_rows(contract, np.random.default_rng(2), 1500, first_id=3000))
    table = catalog.load_table(contract.table)
    second = table.current_snapshot()
    assert second.snapshot_id != first.snapshot_id and second.timestamp_ms > first.timestamp_ms
    return TwoCommits(table, first.snapshot_id, second.snapshot_id, 3000, 4500, root)


WORLD = (-180.0, -90.0, 180.0, 90.0)


def test_snapshot_id_reads_the_older_rows(two_commits: TwoCommits) -> None:
    t = two_commits
    now = query_bbox(t.table, WORLD)
    then = query_bbox(t.table, WORLD, snapshot_id=t.first)
    assert now.stats.rows_matched == t.all_rows and now.stats.snapshot_id == t.second
    assert then.stats.rows_matched == t.first_rows and then.stats.snapshot_id == t.first
    assert then.stats.files_total < now.stats.files_total
    assert _ids(then) < _ids(now)
    within = query(t.table, Predicate("within", shapely.box(0, 30, 30, 60)), snapshot_id=t.first)
    assert _ids(within) <= _ids(then) and within.stats.rows_matched > 0


def test_as_of_reads_the_snapshot_current_at_that_time(two_commits: TwoCommits) -> None:
    t = two_commits
    first_ms = t.table.snapshot_by_id(t.first).timestamp_ms
    second_ms = t.table.snapshot_by_id(t.second).timestamp_ms
    iso = datetime.fromtimestamp(first_ms / 1000, tz=UTC).isoformat()
    for as_of, snapshot, rows in [
        (first_ms, t.first, t.first_rows),
        (str(second_ms - 1), t.first, t.first_rows),
        (iso, t.first, t.first_rows),
        (iso.replace("+00:00", "Z"), t.first, t.first_rows),
        (iso.replace("+00:00", ""), t.first, t.first_rows),  # no zone: UTC
        (datetime.fromtimestamp(second_ms / 1000, tz=UTC), t.second, t.all_rows),
        ("2999-01-01T00:00:00Z", t.second, t.all_rows),
    ]:
        stats = query_bbox(t.table, WORLD, as_of=as_of).stats
        assert (stats.snapshot_id, stats.rows_matched) == (snapshot, rows), as_of


def test_time_travel_errors_name_the_value(two_commits: TwoCommits) -> None:
    t = two_commits
    with pytest.raises(ValueError, match=r"as-of '2001-02-03T04:05:06Z'.*no snapshot at or before"):
        query_bbox(t.table, WORLD, as_of="2001-02-03T04:05:06Z")
    with pytest.raises(ValueError, match="as-of 'yesterday'"):
        query_bbox(t.table, WORLD, as_of="yesterday")
    with pytest.raises(ValueError, match="snapshot 12345: .*no such snapshot"):
        query_bbox(t.table, WORLD, snapshot_id=12345)
    with pytest.raises(ValueError, match="not both"):
        query_bbox(t.table, WORLD, snapshot_id=t.first, as_of=0)


# -- GeoParquet output ------------------------------------------------------------------------------
def test_geoparquet_output_reads_back_with_its_geo_metadata(built: Built, contract: Contract, tmp_path: Path) -> None:
    result = query(built.table, Predicate("intersects", _star(112.5, -11.25, 6.0, np.random.default_rng(3))))
    assert result.table.num_rows > 0
    path = tmp_path / "java.parquet"
    written = write_geoparquet(result, table_contract(built.table), path)

    back = pq.read_table(path)
    assert back.num_rows == result.table.num_rows
    assert back.column("event_id").to_pylist() == result.table.column("event_id").to_pylist()
    assert back.column("geometry").to_pylist() == result.table.column("geometry").to_pylist()
    geo = json.loads(pq.read_schema(path).metadata[b"geo"])
    assert geo == written
    assert geo["version"] == "1.1.0" and geo["primary_column"] == "geometry"
    column = geo["columns"]["geometry"]
    shapes = shapely.from_wkb(back.column("geometry").to_numpy(zero_copy_only=False))
    assert column["bbox"] == pytest.approx(list(shapely.total_bounds(shapes)), abs=0)
    assert set(column["geometry_types"]) == {g.geom_type for g in shapes} == {"Point", "LineString", "Polygon"}
    assert column["encoding"] == "WKB"
    assert column["covering"]["bbox"]["xmin"] == ["bbox", "xmin"]
    assert column["crs"]["id"] == {"authority": "EPSG", "code": 4326}

    # A GeoParquet reader takes the column for a geometry in the table CRS.
    from tests.conftest import duckdb_connection

    count, kind, xmin = (
        duckdb_connection()
        .execute(
            "select count(*), any_value(typeof(geometry)), min(ST_XMin(geometry)) from read_parquet(?)", [str(path)]
        )
        .fetchone()
    )
    assert (count, kind, xmin) == (back.num_rows, "GEOMETRY('EPSG:4326')", column["bbox"][0])


def test_geoparquet_of_an_empty_result_has_no_bbox(built: Built, tmp_path: Path) -> None:
    result = query(built.table, Predicate("contains", shapely.box(-179, -89, 179, 89)))
    assert result.table.num_rows == 0
    geo = write_geoparquet(result, table_contract(built.table), tmp_path / "empty.parquet")
    assert "bbox" not in geo["columns"]["geometry"] and geo["columns"]["geometry"]["geometry_types"] == []
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0


# -- the command ------------------------------------------------------------------------------------
def _cli(monkeypatch: pytest.MonkeyPatch, root: Path, *args: str) -> int:
    from app.cli import main

    monkeypatch.delenv("GEOINGEST_CONFIG", raising=False)
    monkeypatch.setenv("GEOINGEST_CATALOG_NAME", "test")
    monkeypatch.setenv("GEOINGEST_CATALOG__URI", f"sqlite:///{root}/catalog.db")
    monkeypatch.setenv("GEOINGEST_CATALOG__WAREHOUSE", f"file://{root}/warehouse")
    return main(list(args))


JAVA_STAR = "POLYGON((105 -11, 110 -13, 112 -18, 114 -13, 120 -11, 114 -9, 112 -4, 110 -9, 105 -11))"


def test_cli_predicates_and_formats(
    built: Built, geometries: np.ndarray, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    table = "demo.events"
    expected = {
        kind: _brute_force(built, geometries, Predicate.from_wkt(kind, JAVA_STAR)) for kind in ("intersects", "within")
    }
    assert _cli(monkeypatch, built.root, "query", "--table", table, "--within", JAVA_STAR, "--format", "count") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["count"] == len(expected["within"]) > 0 and out["files_scanned"] < out["files_total"]

    assert _cli(monkeypatch, built.root, "query", "--table", table, "--intersects", JAVA_STAR) == 0
    captured = capsys.readouterr()
    assert {json.loads(line)["id"] for line in captured.out.splitlines()} == expected["intersects"]
    assert json.loads(captured.err)["rows_matched"] == len(expected["intersects"])

    polygon = next(g for g, i in zip(geometries, built.rows.column("event_id").to_pylist()) if i.startswith("poly-"))
    point = polygon.representative_point().wkt
    assert _cli(monkeypatch, built.root, "query", "--table", table, "--contains", point, "--limit", "1") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["id"].startswith("poly-")

    out_file = tmp_path / "out.parquet"
    assert (
        _cli(
            monkeypatch,
            built.root,
            "query",
            "--table",
            table,
            "--bbox",
            "100,-20,125,-5",
            "--format",
            "geoparquet",
            "--output",
            str(out_file),
        )
        == 0
    )
    stats = json.loads(capsys.readouterr().err)
    assert pq.read_table(out_file).num_rows == stats["rows_matched"] > 0
    assert json.loads(pq.read_schema(out_file).metadata[b"geo"])["columns"]["geometry"]["bbox"][0] >= 100 - 2

    lines_file = tmp_path / "out.geojsonl"
    assert (
        _cli(monkeypatch, built.root, "query", "--table", table, "--within", JAVA_STAR, "--output", str(lines_file))
        == 0
    )
    assert capsys.readouterr().out == ""
    assert {json.loads(line)["id"] for line in lines_file.read_text().splitlines()} == expected["within"]


def test_cli_time_travel(
    two_commits: TwoCommits, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    t = two_commits
    args = ("query", "--table", "demo.events", "--bbox=-180,-90,180,90", "--format", "count")
    assert _cli(monkeypatch, t.root, *args, "--snapshot", str(t.first)) == 0
    assert json.loads(capsys.readouterr().out)["count"] == t.first_rows
    second_ms = t.table.snapshot_by_id(t.second).timestamp_ms
    assert _cli(monkeypatch, t.root, *args, "--as-of", str(second_ms - 1)) == 0
    assert json.loads(capsys.readouterr().out)["snapshot_id"] == t.first
    assert _cli(monkeypatch, t.root, *args) == 0
    assert json.loads(capsys.readouterr().out)["count"] == t.all_rows
    assert _cli(monkeypatch, t.root, *args, "--as-of", "1999-12-31") == 2
    assert "'1999-12-31'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--within", "POLYGON((0 0, 1 1"), "'POLYGON((0 0, 1 1'"),
        (("--contains", "POLYGON((0 0, 2 2, 2 0, 0 2, 0 0))"), "not a valid geometry"),
        (("--bbox", "1,2,3"), "'1,2,3'"),
        (("--bbox", "0,0,1,1", "--format", "geoparquet"), "--output"),
        (("--bbox", "0,0,1,1", "--snapshot", "99"), "snapshot 99"),
    ],
)
def test_cli_errors_name_their_input(
    built: Built, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, args: tuple, message: str
) -> None:
    assert _cli(monkeypatch, built.root, "query", "--table", "demo.events", *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("geoingest: ") and message in err


@pytest.mark.parametrize(
    "args",
    [
        (),  # no predicate
        ("--bbox", "0,0,1,1", "--within", "POINT(0 0)"),  # two predicates
        ("--bbox", "0,0,1,1", "--snapshot", "1", "--as-of", "2020-01-01"),
        ("--bbox", "0,0,1,1", "--snapshot", "latest"),
        ("--bbox", "0,0,1,1", "--format", "shapefile"),
    ],
)
def test_cli_bad_flags_exit_2(
    built: Built, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, args: tuple
) -> None:
    with pytest.raises(SystemExit) as exit_:
        _cli(monkeypatch, built.root, "query", "--table", "demo.events", *args)
    assert exit_.value.code == 2
    assert "usage:" in capsys.readouterr().err
