"""The ingest path end to end: a real broker, real Spark, a real SQLite-backed Iceberg catalog."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import shapely
from pyiceberg.conversions import from_bytes
from pyiceberg.types import DoubleType
from pyproj import Transformer

from streaming.contract import BBOX_FIELDS, load_contract
from streaming.job.config import JobConfig
from streaming.job.processor import BatchProcessor
from streaming.job.stream import start_query
from streaming.kernels.hilbert import hilbert_keys_of_bounds
from streaming.read.query import query_bbox
from streaming.table.catalog import create_table
from streaming.table.commit import BATCH_ID, KAFKA_OFFSETS, WRITER_ID
from tests.conftest import duckdb_connection, produce_records

pytestmark = pytest.mark.integration

CONTRACT = Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json"
CITIES = np.array(
    [
        (2.35, 48.86),
        (-0.13, 51.51),
        (13.40, 52.52),
        (-74.0, 40.71),
        (139.69, 35.69),
        (-46.63, -23.55),
        (77.21, 28.61),
        (31.24, 30.04),
        (151.21, -33.87),
    ]
)
TO_3857 = Transformer.from_crs("EPSG:4326", "EPSG:3857", always_xy=True)
FROM_3857 = Transformer.from_crs("EPSG:3857", "EPSG:4326", always_xy=True)


def small_file_contract():
    """The demo contract with files and row groups small enough for many of both in a test."""
    contract = load_contract(CONTRACT)
    clustering = dataclasses.replace(contract.clustering, target_file_bytes=12 * 1024, row_group_rows=100)
    return dataclasses.replace(contract, clustering=clustering)


def skewed_points(rng: np.random.Generator, n: int) -> np.ndarray:
    """Points around a few cities, most around the first ones: the skew real feeds have."""
    weights = 1.0 / np.arange(1, len(CITIES) + 1)
    centre = CITIES[rng.choice(len(CITIES), size=n, p=weights / weights.sum())]
    return centre + rng.normal(scale=0.3, size=(n, 2))


def feature(event_id: str, geometry: dict, **properties) -> bytes:
    return json.dumps({"type": "Feature", "id": event_id, "geometry": geometry, "properties": properties}).encode()


def build_mix(seed: int = 3):
    """(records, expected valid ids, expected rejects by reason, EWKB originals in EPSG:3857)."""
    rng = np.random.default_rng(seed)
    records, valid = [], set()
    ewkb_sources: dict[str, shapely.Geometry] = {}

    def add(event_id: str, value: bytes | None, headers=(), ok=True):
        records.append((event_id.encode(), value, list(headers)))
        if ok:
            valid.add(event_id)

    for i, (x, y) in enumerate(skewed_points(rng, 6000)):
        add(
            f"pt-{i}",
            feature(
                f"pt-{i}",
                {"type": "Point", "coordinates": [x, y]},
                kind="ping",
                speed=float(i % 90),
                population=1000 + i,
            ),
        )
    for i, (x, y) in enumerate(skewed_points(rng, 150)):
        add(f"z-{i}", feature(f"z-{i}", {"type": "Point", "coordinates": [x, y, 100.0 + i]}, kind="drone"))
    for i, (x, y) in enumerate(skewed_points(rng, 100)):
        line = [[x + k * 0.01, y + k * 0.005] for k in range(6)]
        add(f"ln-{i}", feature(f"ln-{i}", {"type": "LineString", "coordinates": line}, kind="track"))
    for i, (x, y) in enumerate(skewed_points(rng, 100)):
        shell = [[x, y], [x + 0.1, y], [x + 0.1, y + 0.1], [x, y + 0.1], [x, y]]
        hole = [
            [x + 0.02, y + 0.02],
            [x + 0.04, y + 0.02],
            [x + 0.04, y + 0.04],
            [x + 0.02, y + 0.04],
            [x + 0.02, y + 0.02],
        ]
        add(f"pg-{i}", feature(f"pg-{i}", {"type": "Polygon", "coordinates": [shell, hole]}, name=f"zone {i}"))
    for i, (x, y) in enumerate(skewed_points(rng, 200)):
        add(f"wkb-{i}", shapely.to_wkb(shapely.Point(x, y)), headers=[("kind", b"site")])
    for i, (x, y) in enumerate(skewed_points(rng, 200)):
        mx, my = TO_3857.transform(x, y)
        geom = shapely.box(mx, my, mx + 500.0, my + 300.0) if i % 2 else shapely.Point(mx, my)
        ewkb_sources[f"ewkb-{i}"] = geom
        add(f"ewkb-{i}", shapely.to_wkb(shapely.set_srid(geom, 3857), include_srid=True), headers=[("kind", b"zone")])

    rejects = {
        "unknown_format": [b"garbage bytes"],
        "malformed_json": [b'{"type": "Feature", "id": "cut", "geometry": {"type": "Po'],
        "null_value": [None],
        "missing_geometry": [feature("nogeom", None)],
        "outside_crs_area": [feature("lat123", {"type": "Point", "coordinates": [10.0, 123.0]})],
        "geometry_type_not_allowed": [shapely.to_wkb(shapely.from_wkt("GEOMETRYCOLLECTION (POINT (1 2))"))],
        "unknown_srid": [shapely.to_wkb(shapely.set_srid(shapely.Point(1, 2), 999999), include_srid=True)],
        "property_type_mismatch": [feature("badspeed", {"type": "Point", "coordinates": [1, 2]}, speed="fast")],
        "bad_wkb": [b"\x01\x01\x00\x00\x00\x00\x00"],
    }
    for reason, values in rejects.items():
        for j, value in enumerate(values):
            records.insert(int(rng.integers(len(records))), (f"bad-{reason}-{j}".encode(), value, []))
    expected_rejects = {reason: len(values) for reason, values in rejects.items()}
    return records, valid, expected_rejects, ewkb_sources


@pytest.fixture(scope="module")
def ingested(kafka, spark, tmp_path_factory):
    """One ingest of the mix, shared by the checks below."""
    from kafka.admin import KafkaAdminClient, NewTopic

    from streaming.table.catalog import open_catalog

    home = tmp_path_factory.mktemp("ingest")
    topic = "mix"
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    admin.close()
    records, valid, expected_rejects, ewkb_sources = build_mix()
    assert produce_records(kafka.bootstrap, topic, records) == len(records)

    contract = small_file_contract()
    catalog = open_catalog(
        "test", {"type": "sql", "uri": f"sqlite:///{home / 'catalog.db'}", "warehouse": f"file://{home / 'warehouse'}"}
    )
    table, _ = create_table(catalog, contract)
    reports = []
    config = JobConfig(kafka.bootstrap, topic, str(home / "checkpoint"), writer_id="test-writer")
    processor = BatchProcessor(spark, table, contract, config, observers=(reports.append,))
    query = start_query(spark, processor, until_idle=True)
    query.awaitTermination()
    assert query.exception() is None
    table.refresh()
    return {
        "table": table,
        "contract": contract,
        "reports": reports,
        "valid": valid,
        "records": records,
        "expected_rejects": expected_rejects,
        "ewkb_sources": ewkb_sources,
        "topic": topic,
    }


def all_rows(table):
    return table.scan().to_arrow()


def test_table_holds_exactly_the_valid_events(ingested):
    rows = all_rows(ingested["table"])
    ids = rows.column("event_id").to_pylist()
    assert len(ids) == len(set(ids)), "no event twice"
    assert set(ids) == ingested["valid"]


def test_rejects_are_counted_with_their_reason_and_the_rest_lands(ingested):
    rejected: dict[str, int] = {}
    for report in ingested["reports"]:
        for reason, n in report.rejected.items():
            rejected[reason] = rejected.get(reason, 0) + n
    assert rejected == ingested["expected_rejects"]
    consumed = sum(r.consumed for r in ingested["reports"])
    assert consumed == len(ingested["records"])
    assert consumed == len(ingested["valid"]) + sum(rejected.values())


def test_geojson_features_keep_properties_z_and_holes(ingested):
    rows = all_rows(ingested["table"]).to_pylist()
    by_id = {r["event_id"]: r for r in rows}
    assert by_id["pt-5"]["kind"] == "ping" and by_id["pt-5"]["speed"] == 5.0 and by_id["pt-5"]["population"] == 1005
    z = shapely.from_wkb(by_id["z-3"]["geometry"])
    assert shapely.has_z(z) and z.z == 103.0
    polygon = shapely.from_wkb(by_id["pg-7"]["geometry"])
    assert polygon.geom_type == "Polygon" and len(polygon.interiors) == 1
    assert by_id["wkb-1"]["kind"] == "site", "header mapped to a column"


def test_ewkb_in_web_mercator_is_reprojected_like_pyproj_does(ingested):
    rows = {r["event_id"]: r for r in all_rows(ingested["table"]).to_pylist()}
    for event_id, source in ingested["ewkb_sources"].items():
        stored = shapely.from_wkb(rows[event_id]["geometry"])
        src = shapely.get_coordinates(source)
        lon, lat = FROM_3857.transform(src[:, 0], src[:, 1])
        np.testing.assert_allclose(shapely.get_coordinates(stored), np.column_stack([lon, lat]), rtol=0, atol=1e-9)


def test_every_file_carries_its_bounds_geoparquet_metadata_and_hilbert_order(ingested):
    table, contract = ingested["table"], ingested["contract"]
    ids = contract.bbox_field_ids
    tasks = list(table.scan().plan_files())
    assert len(tasks) >= 20
    for task in tasks:
        path = task.file.file_path.removeprefix("file://")
        data = pq.read_table(path)
        bbox = data.column("bbox").combine_chunks()
        mins = {name: pc.min(bbox.field(name)).as_py() for name in BBOX_FIELDS}
        maxs = {name: pc.max(bbox.field(name)).as_py() for name in BBOX_FIELDS}
        for name in BBOX_FIELDS:
            assert from_bytes(DoubleType(), task.file.lower_bounds[ids[name]]) == mins[name]
            assert from_bytes(DoubleType(), task.file.upper_bounds[ids[name]]) == maxs[name]

        metadata = pq.read_metadata(path)
        geo = json.loads(metadata.metadata[b"geo"])
        column = geo["columns"]["geometry"]
        assert geo["version"] == "1.1.0" and geo["primary_column"] == "geometry"
        assert column["encoding"] == "WKB"
        assert column["bbox"] == [mins["xmin"], mins["ymin"], maxs["xmax"], maxs["ymax"]]
        assert column["covering"]["bbox"]["xmin"] == ["bbox", "xmin"]
        assert column["crs"]["id"] == {"authority": "EPSG", "code": 4326}
        geoms = shapely.from_wkb(data.column("geometry").to_numpy(zero_copy_only=False))
        expected_types = {g.geom_type + (" Z" if shapely.has_z(g) else "") for g in geoms}
        assert set(column["geometry_types"]) == expected_types
        assert metadata.row_group(0).column(0).compression == "ZSTD"
        assert pq.read_schema(path).field("event_id").metadata[b"PARQUET:field_id"] == b"1"

        b = np.column_stack([bbox.field(n).to_numpy() for n in BBOX_FIELDS])
        keys = hilbert_keys_of_bounds(
            b[:, 0], b[:, 1], b[:, 2], b[:, 3], contract.clustering.extent, contract.clustering.hilbert_bits
        )
        assert np.all(np.diff(keys) >= 0), f"{path}: rows are not in Hilbert order"


def test_files_are_spatially_compact(ingested):
    """Hilbert-clustered files cover little of the data extent each.

    Unsorted files each span about the whole extent, so their MBR areas add up to about
    files x extent. With clustering, files tile the data, and a file straddling two cities
    is the exception. Measured here: well under 1 x extent; the bound of 2 x extent leaves room
    for skew while still failing for any ordering that is not spatial (>= 20 x).
    """
    tasks = list(ingested["table"].scan().plan_files())
    ids = ingested["contract"].bbox_field_ids

    def bound(task, name, upper):
        raw = (task.file.upper_bounds if upper else task.file.lower_bounds)[ids[name]]
        return from_bytes(DoubleType(), raw)

    boxes = np.array(
        [
            [bound(t, "xmin", False), bound(t, "ymin", False), bound(t, "xmax", True), bound(t, "ymax", True)]
            for t in tasks
        ]
    )
    file_area = np.sum((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))
    extent_area = (boxes[:, 2].max() - boxes[:, 0].min()) * (boxes[:, 3].max() - boxes[:, 1].min())
    assert len(tasks) >= 20
    assert file_area / extent_area < 2.0, f"{len(tasks)} files cover {file_area / extent_area:.2f} x the extent"


def test_snapshot_summary_records_writer_batch_and_offsets(ingested):
    table = ingested["table"]
    produced = len(ingested["records"])
    covered = 0
    for snapshot in table.metadata.snapshots:
        props = snapshot.summary.additional_properties
        assert props[WRITER_ID] == "test-writer"
        assert int(props[BATCH_ID]) >= 0
        offsets = json.loads(props[KAFKA_OFFSETS])
        for first, last in offsets[ingested["topic"]].values():
            covered += last - first + 1
    assert covered == produced, "the offset ranges account for every record consumed"


def test_query_matches_brute_force_on_random_windows(ingested):
    table = ingested["table"]
    rows = all_rows(table)
    geoms = shapely.from_wkb(rows.column("geometry").to_numpy(zero_copy_only=False))
    ids = np.array(rows.column("event_id").to_pylist())
    rng = np.random.default_rng(11)
    centres = shapely.get_coordinates(shapely.centroid(geoms))[rng.choice(len(geoms), 25)]
    for cx, cy in centres:
        half = rng.uniform(0.05, 2.0)
        window = (cx - half, cy - half, cx + half, cy + half)
        expected = set(ids[shapely.intersects(geoms, shapely.box(*window))])
        result = query_bbox(table, window)
        assert set(result.table.column("event_id").to_pylist()) == expected


def test_small_window_scans_few_files(ingested):
    table = ingested["table"]
    # 3.6 x 1.8 degrees around Sydney, 0.01 % of the world extent and under 1 % of the data's
    # extent, holding ~4 % of the rows: those fit in one or two files of ~250 rows, plus one more
    # where the cluster straddles a file boundary.
    result = query_bbox(table, (149.41, -34.77, 153.01, -32.97))
    stats = result.stats
    assert stats.rows_matched > 100
    assert stats.files_scanned <= 3, stats
    assert stats.files_scanned < stats.files_total / 10


def test_pyarrow_pyiceberg_and_duckdb_read_the_table(ingested):
    table = ingested["table"]
    expected = len(ingested["valid"])
    assert table.scan().to_arrow().num_rows == expected
    files = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    assert pq.ParquetDataset(files).read().num_rows == expected

    con = duckdb_connection()
    scan = f"iceberg_scan('{table.metadata_location.removeprefix('file://')}')"
    assert con.execute(f"SELECT count(*) FROM {scan}").fetchone()[0] == expected
    window = (0.55, 47.96, 4.15, 49.76)
    # The Iceberg schema says binary; DuckDB's GeoParquet conversion would make it a GEOMETRY
    # underneath, which the Iceberg scan cannot cast back. Read it as the WKB it is.
    con.execute("SET enable_geoparquet_conversion = false")
    duck_count = con.execute(
        f"SELECT count(*) FROM {scan} WHERE ST_Intersects(ST_GeomFromWKB(geometry), "
        f"ST_MakeEnvelope({window[0]}, {window[1]}, {window[2]}, {window[3]}))"
    ).fetchone()[0]
    assert duck_count == query_bbox(table, window).stats.rows_matched


@pytest.mark.parametrize(
    "clustering, merge_in_task_max_rows",
    [
        ("batch", 250_000),  # small batches: merged by their last task
        ("batch", 0),  # a merge job per batch, as large batches are
        ("task", 0),
        ("shuffle", 0),
    ],
    ids=["batch-last-task-merges", "batch-merge-job", "task", "shuffle"],
)
def test_every_clustering_mode_lands_each_event_once_in_sorted_files(
    kafka, spark, topic, catalog, tmp_path, clustering, merge_in_task_max_rows
):
    rng = np.random.default_rng(21)
    records = [
        (f"pt-{i}".encode(), feature(f"pt-{i}", {"type": "Point", "coordinates": [float(x), float(y)]}), [])
        for i, (x, y) in enumerate(skewed_points(rng, 3000))
    ]
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    contract = small_file_contract()
    table, _ = create_table(catalog, contract)
    config = JobConfig(
        kafka.bootstrap,
        topic,
        str(tmp_path / "checkpoint"),
        writer_id=f"w-{clustering}",
        max_offsets_per_trigger=1500,
        clustering=clustering,
        merge_in_task_max_rows=merge_in_task_max_rows,
    )
    reports = []
    query = start_query(
        spark, BatchProcessor(spark, table, contract, config, observers=(reports.append,)), until_idle=True
    )
    query.awaitTermination()
    assert query.exception() is None and len(reports) == 2
    table.refresh()
    ids = all_rows(table).column("event_id").to_pylist()
    assert sorted(ids) == sorted(f"pt-{i}" for i in range(3000))
    for report in reports:
        spans = []
        for record in report.files:
            bbox = pq.read_table(record.path.removeprefix("file://"), columns=["bbox"]).column("bbox").combine_chunks()
            keys = hilbert_keys_of_bounds(
                *(bbox.field(n).to_numpy() for n in BBOX_FIELDS),
                contract.clustering.extent,
                contract.clustering.hilbert_bits,
            )
            assert np.all(np.diff(keys) >= 0)
            spans.append((keys[0], keys[-1]))
        overlaps = sum(hi > next_lo for (_, hi), (next_lo, _) in zip(sorted(spans), sorted(spans)[1:]))
        if clustering == "task":
            assert overlaps > 0, "each task's files cover the whole key range of its rows"
        else:
            assert overlaps == 0, "the batch's files follow each other along the curve"
    location = Path(table.location().removeprefix("file://"))
    assert not [p for p in location.glob("staging/**/*") if p.is_file()], "no staged run or marker left behind"
    referenced = {task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()}
    assert {str(p) for p in location.glob("data/**/*.parquet")} == referenced, "every file written is in the table"


def test_files_follow_the_tables_compression_and_a_codec_it_cannot_write_stops_the_start(
    kafka, spark, topic, catalog, tmp_path
):
    records = [
        (f"pt-{i}".encode(), feature(f"pt-{i}", {"type": "Point", "coordinates": [i * 0.01, 45.0]}), [])
        for i in range(500)
    ]
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    contract = small_file_contract()
    table, _ = create_table(catalog, contract)
    config = JobConfig(kafka.bootstrap, topic, str(tmp_path / "checkpoint"), writer_id="w-codec")

    with table.transaction() as tx:
        tx.set_properties({"write.parquet.compression-codec": "lzo"})
    with pytest.raises(ValueError, match=r"write\.parquet\.compression-codec='lzo'"):
        BatchProcessor(spark, table, contract, config)

    with table.transaction() as tx:
        tx.set_properties({"write.parquet.compression-codec": "snappy"})
    query = start_query(spark, BatchProcessor(spark, table, contract, config), until_idle=True)
    query.awaitTermination()
    assert query.exception() is None
    table.refresh()
    assert all_rows(table).num_rows == len(records)
    for task in table.scan().plan_files():
        metadata = pq.ParquetFile(task.file.file_path.removeprefix("file://")).metadata
        assert {
            metadata.row_group(g).column(c).compression
            for g in range(metadata.num_row_groups)
            for c in range(metadata.num_columns)
        } == {"SNAPPY"}
