"""Spatial window queries against a real Iceberg table (SQL catalog on SQLite, no Spark).

The table is built by the project's own pieces: events are decoded by `Decoder` from a batch
shaped like Spark's Kafka source, Hilbert-sorted, written by `GeoParquetWriter` in small files
and row groups, and committed with the writer's metrics, so the query sees the real layout.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import shapely
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import FileScanTask, Table
from pyiceberg.typedef import Record

from streaming.contract import Contract, load_contract
from streaming.decode import HILBERT, REJECT_REASON, Decoder
from streaming.query import (
    QueryError,
    QueryResult,
    QueryStats,
    _refuse_deletes,
    parse_bbox,
    query_bbox,
    to_geojson_lines,
)
from streaming.writer import DataFileRecord, GeoParquetWriter

CONTRACT_PATH = Path(__file__).resolve().parents[2] / "schemas" / "demo_events.json"
EVENT_COUNT = 20_000
POLYGON_EVERY = 50  # one event in 50 is a WKB polygon, the rest GeoJSON points
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


def _events(rng: np.random.Generator) -> tuple[list[bytes], list[bytes]]:
    """Kafka keys and values: GeoJSON Point features and WKB polygons at skewed random places."""
    names = list(CLUSTERS)
    centres = np.array([CLUSTERS[n][0] for n in names])
    shares = np.array([CLUSTERS[n][1] for n in names])
    which = rng.choice(len(names), EVENT_COUNT, p=shares)
    x = centres[which, 0] + rng.normal(0.0, CLUSTER_SIGMA[0], EVENT_COUNT)
    y = centres[which, 1] + rng.normal(0.0, CLUSTER_SIGMA[1], EVENT_COUNT)
    uniform = rng.random(EVENT_COUNT) < UNIFORM_SHARE
    x[uniform] = rng.uniform(-180.0, 180.0, uniform.sum())
    y[uniform] = rng.uniform(-90.0, 90.0, uniform.sum())
    # Keep polygons inside the valid area of EPSG:4326, which the decoder enforces.
    margin = MAX_POLYGON_HALF_WIDTH + 0.1
    x = np.clip(x, -180.0 + margin, 180.0 - margin)
    y = np.clip(y, -90.0 + margin, 90.0 - margin)
    half_widths = rng.uniform(0.05, MAX_POLYGON_HALF_WIDTH, EVENT_COUNT)

    keys: list[bytes] = []
    values: list[bytes] = []
    for i in range(EVENT_COUNT):
        if i % POLYGON_EVERY == 0:
            w = half_widths[i]
            polygon = shapely.box(x[i] - w, y[i] - w / 2, x[i] + w, y[i] + w / 2)
            keys.append(f"poly-{i}".encode())  # WKB has no id: event_id comes from the key
            values.append(shapely.to_wkb(polygon))
        else:
            feature = {
                "type": "Feature",
                "id": f"pt-{i}",
                "geometry": {"type": "Point", "coordinates": [x[i], y[i]]},
                "properties": {"kind": "probe", "speed": float(i % 37)},
            }
            keys.append(f"key-{i}".encode())
            values.append(json.dumps(feature).encode())
    return keys, values


def _kafka_batch(keys: list[bytes], values: list[bytes]) -> pa.RecordBatch:
    """A batch shaped like Spark's Kafka source."""
    n = len(values)
    return pa.record_batch({
        "key": pa.array(keys, pa.binary()),
        "value": pa.array(values, pa.binary()),
        "topic": pa.array(["demo-events"] * n, pa.string()),
        "partition": pa.array(np.arange(n) % 3, pa.int32()),
        "offset": pa.array(np.arange(n), pa.int64()),
        "timestamp": pa.array(KAFKA_TIMESTAMP_US + np.arange(n) * 1000, pa.timestamp("us")),
    })


def _catalog(root: Path) -> SqlCatalog:
    return SqlCatalog("test", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")


def _create_table(catalog: SqlCatalog, contract: Contract) -> Table:
    catalog.create_namespace_if_not_exists(contract.namespace)
    return catalog.create_table(contract.table, contract.iceberg_schema(), properties=contract.table_properties())


def _data_file(table: Table, record: DataFileRecord) -> DataFile:
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=record.path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        file_size_in_bytes=record.file_size_in_bytes,
        record_count=record.record_count,
        sort_order_id=None,
        spec_id=table.metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **record.statistics(),
    )


def _read_all_rows(table: Table, records: list[DataFileRecord]) -> pa.Table:
    pieces = []
    for record in records:
        with table.io.new_input(record.path).open() as stream:
            pieces.append(pq.read_table(stream))
    return pa.concat_tables(pieces)


@pytest.fixture(scope="module")
def contract() -> Contract:
    return load_contract(CONTRACT_PATH)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, contract: Contract) -> Built:
    catalog = _catalog(tmp_path_factory.mktemp("iceberg"))
    table = _create_table(catalog, contract)

    decoded = Decoder(contract).decode(_kafka_batch(*_events(np.random.default_rng(20240611))))
    valid = pa.Table.from_batches([decoded]).filter(pc.is_null(decoded.column(REJECT_REASON)))
    assert valid.num_rows == EVENT_COUNT, "every generated event should decode"
    sorted_rows = valid.sort_by(HILBERT)

    small_files = dataclasses.replace(
        contract,
        clustering=dataclasses.replace(
            contract.clustering, target_file_bytes=TARGET_FILE_BYTES, row_group_rows=ROW_GROUP_ROWS
        ),
    )
    writer = GeoParquetWriter(small_files, table.properties, table.io.properties,
                              table.location() + "/data", "test")
    records = list(writer.write(sorted_rows.to_batches(max_chunksize=1000)))
    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as append:
            for record in records:
                append.append_data_file(_data_file(table, record))

    table = catalog.load_table(contract.table)
    rows = _read_all_rows(table, records)
    assert len(records) >= 20 and rows.num_rows == EVENT_COUNT
    return Built(table, records, rows)


def _brute_force_ids(rows: pa.Table, bbox: tuple[float, float, float, float]) -> set[str]:
    geometries = shapely.from_wkb(rows.column("geometry").to_numpy(zero_copy_only=False))
    hits = shapely.intersects(geometries, shapely.box(*bbox))
    return set(rows.column("event_id").filter(pa.array(hits)).to_pylist())


def _ids(result: QueryResult) -> set[str]:
    ids = result.table.column("event_id").to_pylist()
    assert len(ids) == len(set(ids)), "a row must not be returned twice"
    return set(ids)


def _random_windows(rng: np.random.Generator, rows: pa.Table,
                    count: int) -> list[tuple[float, float, float, float]]:
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
    in_cell = pc.and_(pc.and_(pc.greater_equal(centre_x, cxmin), pc.less(centre_x, cxmax)),
                      pc.and_(pc.greater_equal(centre_y, cymin), pc.less(centre_y, cymax)))
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
            1 for r in built.records
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


def test_delete_files_are_refused(built: Built) -> None:
    data_file = _data_file(built.table, built.records[0])
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=built.table.location() + "/data/deletes.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(),
        file_size_in_bytes=100,
        record_count=1,
    )
    with pytest.raises(QueryError, match="delete file"):
        _refuse_deletes(FileScanTask(data_file, delete_files={delete_file}))


@pytest.mark.parametrize(
    "text",
    ["1,2,3", "1,2,3,4,5", "", "a,b,c,d", "1,2,,4", "3,0,1,1", "0,3,1,1", "nan,0,1,1", "0,0,inf,1"],
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
    lines = list(to_geojson_lines(result, "geometry"))
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
