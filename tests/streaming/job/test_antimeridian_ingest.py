"""Tracks across the anti-meridian end to end: a real broker, real Spark, a SQLite-backed
Iceberg catalog. Stored boxes are wrapped in rows, file metadata and manifests; windows east of,
west of and across ±180 (and the Gulf of Guinea) answer as the brute force on geometries cut at
180 does, before and after compaction."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.conversions import from_bytes
from pyiceberg.types import DoubleType

from streaming.job.config import JobConfig
from streaming.job.processor import BatchProcessor
from streaming.job.stream import start_query
from streaming.maintenance.compaction import compact
from streaming.maintenance.plan import MaintenancePolicy
from streaming.read.query import query_bbox
from streaming.table.catalog import create_table, open_catalog
from streaming.write.data_files import WRAPPED_ROWS_KEY
from tests.antimeridian_data import events, expected_ids, feature_json, windows
from tests.conftest import produce_records
from tests.streaming.job.test_processor import small_file_contract

pytestmark = pytest.mark.integration

DATA = events(np.random.default_rng(180), crossing=300, plain=200, points=400)
# the case: lines from (179.5, y) to (-179.5, y)
DATA += [
    (f"t{i}", {"type": "LineString", "coordinates": [[179.5, y], [-179.5, y]]}, True)
    for i, y in enumerate(np.linspace(-50, 50, 100).tolist())
]


@pytest.fixture(scope="module")
def ingested(kafka, spark, tmp_path_factory):
    from kafka.admin import KafkaAdminClient, NewTopic

    home = tmp_path_factory.mktemp("antimeridian")
    topic = "pacific"
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    admin.close()
    records = [(e.encode(), feature_json(e, g), []) for e, g, _ in DATA]
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    contract = small_file_contract()
    catalog = open_catalog(
        "test", {"type": "sql", "uri": f"sqlite:///{home / 'catalog.db'}", "warehouse": f"file://{home / 'warehouse'}"}
    )
    table, _ = create_table(catalog, contract)
    config = JobConfig(kafka.bootstrap, topic, str(home / "checkpoint"), writer_id="antimeridian")
    query = start_query(spark, BatchProcessor(spark, table, contract, config), until_idle=True)
    query.awaitTermination()
    assert query.exception() is None
    table.refresh()
    return table, contract


def _check_windows(table) -> None:
    for window in windows(np.random.default_rng(11), 24):
        result = query_bbox(table, window)
        ids = result.table.column("event_id").to_pylist()
        assert len(ids) == len(set(ids)) and set(ids) == expected_ids(DATA, window), window


def test_crossing_rows_files_and_manifests_hold_wrapped_boxes(ingested):
    table, contract = ingested
    rows = table.scan().to_arrow()
    assert rows.num_rows == len(DATA)
    bbox = rows.column("bbox").combine_chunks()
    wrapped = pc.greater(bbox.field("xmin"), bbox.field("xmax"))
    assert set(rows.filter(wrapped).column("event_id").to_pylist()) == {e for e, _, c in DATA if c}
    ids = contract.bbox_field_ids
    wrapped_files = 0
    for task in table.scan().plan_files():
        f = task.file
        lo = from_bytes(DoubleType(), f.lower_bounds[ids["xmin"]])
        hi = from_bytes(DoubleType(), f.upper_bounds[ids["xmax"]])
        metadata = pq.ParquetFile(f.file_path.removeprefix("file://")).metadata.metadata
        count = int(metadata[WRAPPED_ROWS_KEY.encode()])
        geo_bbox = json.loads(metadata[b"geo"])["columns"]["geometry"]["bbox"]
        if count:
            wrapped_files += 1
            assert count == f.record_count, "wrapped rows are kept in files of their own"
            assert lo > hi and geo_bbox[0] == lo and geo_bbox[2] == hi
        else:
            assert lo <= hi and geo_bbox[0] == lo and geo_bbox[2] == hi
    assert wrapped_files >= 2


def test_windows_east_west_and_across_match_the_brute_force(ingested):
    table, _ = ingested
    _check_windows(table)
    guinea = query_bbox(table, (0.0, -5.0, 10.0, 5.0))
    assert not any(e.startswith(("t", "x")) for e in guinea.table.column("event_id").to_pylist())
    across = query_bbox(table, (179.0, -5.0, -179.0, 5.0))
    assert set(across.table.column("event_id").to_pylist()) == expected_ids(DATA, (179.0, -5.0, -179.0, 5.0))
    assert across.stats.files_scanned < across.stats.files_total


def test_compaction_keeps_wrapped_boxes_and_answers(ingested):
    table, contract = ingested
    before = table.scan().to_arrow().num_rows
    report = compact(table, MaintenancePolicy(min_file_age_s=0))
    assert report.files_rewritten > 0
    table.refresh()
    assert table.scan().to_arrow().num_rows == before
    ids = contract.bbox_field_ids
    for task in table.scan().plan_files():
        metadata = pq.ParquetFile(task.file.file_path.removeprefix("file://")).metadata.metadata
        if int(metadata[WRAPPED_ROWS_KEY.encode()]):
            lo = from_bytes(DoubleType(), task.file.lower_bounds[ids["xmin"]])
            hi = from_bytes(DoubleType(), task.file.upper_bounds[ids["xmax"]])
            assert lo > hi
    _check_windows(table)
