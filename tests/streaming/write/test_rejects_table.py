"""The rejects table: rejected records as rows of an Iceberg table, beside the dead-letter topic.

Written by the real decoder's output, committed through the real committer to a SQL catalog, read
back with pyiceberg and DuckDB as a user would; through the service (broker, Spark) on every
clustering, where each reject is in the table once with the record's exact bytes, and a replayed
batch adds none. The lakehouse shape (bucket, REST catalog, Spark cluster) is in
tests/streaming/job/test_lakehouse.py."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest
from kafka import KafkaConsumer

from app.service import run
from app.settings import load_settings
from streaming.contract import load_contract
from streaming.decode.decoder import Decoder
from streaming.storage import data_location
from streaming.table.catalog import TableMismatch, create_rejects_table, create_table, open_catalog
from streaming.table.commit import BatchCommit, Committer
from streaming.write.dead_letter import REASON_HEADER, SOURCE_OFFSET_HEADER
from streaming.write.rejects_table import REJECTS, RejectsTableFiles, RejectsWriter
from tests.conftest import CACHE_DIR, duckdb_connection, produce_records
from tests.streaming.decode.test_decoder import (
    CONTRACT_PATH,
    DEMO,
    KAFKA_TIMESTAMP_US,
    TOPIC,
    feature,
    kafka_batch,
    point,
)

DAY_US = 86_400_000_000
BAD = [
    b'{"type": "Feature", "geometry": {',  # malformed_json
    feature(point(10.0, 123.0), "f-lat"),  # outside_crs_area
    b"\x07 garbage",  # unknown_format
]


def decoded_with_rejects(day_shift: int = 0) -> pa.RecordBatch:
    values = [feature(point(2.0, 48.0), "ok-1"), *BAD, feature(point(3.0, 45.0), "ok-2")]
    batch = kafka_batch(values, headers=[[("trace", b"t-%d" % i)] for i in range(len(values))])
    if day_shift:
        shifted = pa.array([KAFKA_TIMESTAMP_US + day_shift * DAY_US * (i % 2) for i in range(len(values))])
        batch = batch.set_column(5, "timestamp", shifted.cast(pa.timestamp("us")))
    return Decoder(DEMO).decode(batch)


def writer_for(table, prefix: str = "w-b000000001") -> RejectsWriter:
    return RejectsWriter(
        RejectsTableFiles(
            target_table=DEMO.table,
            data_location=data_location(table),
            file_prefix=prefix,
            io_properties=dict(table.io.properties),
            table_properties=dict(table.properties),
        )
    )


def test_rejected_rows_become_rows_of_the_rejects_table_one_file_per_day(catalog):
    table = create_rejects_table(catalog, "ops.rejects")
    writer = writer_for(table)
    writer.add(decoded_with_rejects(day_shift=1))
    records = writer.write()
    assert [r.content for r in records] == [REJECTS, REJECTS], "the rejects span two days: a file for each"
    assert sorted(r.partition_values for r in records) == [
        (KAFKA_TIMESTAMP_US // DAY_US,),
        (KAFKA_TIMESTAMP_US // DAY_US + 1,),
    ]
    outcome = Committer(table).commit(BatchCommit("w", 1, {TOPIC: {2: (1000, 1004)}}, tuple(records), rejected=3))
    assert outcome.status == "committed"
    rows = sorted(table.refresh().scan().to_arrow().to_pylist(), key=lambda r: r["source_offset"])
    assert [(r["source_offset"], r["reason"]) for r in rows] == [
        (1001, "malformed_json"),
        (1002, "outside_crs_area"),
        (1003, "unknown_format"),
    ]
    assert [r["value"] for r in rows] == BAD, "the record's bytes, untouched"
    assert [r["headers"] for r in rows] == [[{"key": "trace", "value": b"t-%d" % i}] for i in (1, 2, 3)]
    assert {r["target_table"] for r in rows} == {DEMO.table}
    assert all(r["detail"] for r in rows) and all(r["source_topic"] == TOPIC for r in rows)
    # A replayed batch (same writer, same batch id) commits nothing twice.
    again = writer_for(table, "w-b000000001")
    again.add(decoded_with_rejects(day_shift=1))
    assert Committer(table).commit(BatchCommit("w", 1, {TOPIC: {2: (1000, 1004)}}, tuple(again.write()))).status == (
        "skipped_replay"
    )
    assert table.refresh().scan().to_arrow().num_rows == 3

    # DuckDB reads it with the reason as a plain column: SQL over the rejects.
    con = duckdb_connection()
    counts = con.execute(
        f"SELECT reason, count(*) FROM iceberg_scan('{table.metadata_location}') GROUP BY reason ORDER BY reason"
    ).fetchall()
    assert counts == [("malformed_json", 1), ("outside_crs_area", 1), ("unknown_format", 1)]


def test_a_table_of_that_name_with_other_columns_is_refused_naming_it(catalog):
    create_table(catalog, DEMO)
    with pytest.raises(TableMismatch, match=rf"rejects_table: {DEMO.table} exists with the columns"):
        create_rejects_table(catalog, DEMO.table)
    with pytest.raises(ValueError, match="rejects_table: 'rejects' needs a namespace"):
        create_rejects_table(catalog, "rejects")
    assert (
        create_rejects_table(catalog, "ops.rejects").schema() == create_rejects_table(catalog, "ops.rejects").schema()
    )


@pytest.mark.integration
@pytest.mark.parametrize("clustering", ["batch", "task", "shuffle"])
def test_the_service_commits_each_reject_once_beside_the_dead_letter_topic(kafka, spark, topic, tmp_path, clustering):
    good = [(f"g{i}".encode(), feature(point(i % 90, i % 45), f"g{i}"), []) for i in range(300)]
    bad = [(f"b{i}".encode(), value, [("trace", b"x")]) for i, value in enumerate(BAD)]
    records = good[:100] + bad + good[100:]
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    settings = load_settings(
        env={},
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        catalog={"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path / 'wh'}"},
        checkpoint_location=str(tmp_path / "ck"),
        metrics_port=0,
        cache_dir=str(CACHE_DIR),
        clustering=clustering,
        max_offsets_per_trigger=120,
        rejects_table="ops.rejects",
        maintenance_mode="off",
        writer_id="rejects-test",
    )
    contract = load_contract(CONTRACT_PATH)
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.committed_rows == len(good) and sum(totals.rejected.values()) == len(bad)

    rejects = open_catalog(settings.catalog_name, settings.catalog).load_table("ops.rejects")
    rows = rejects.scan().to_arrow().to_pylist()
    assert sorted((r["key"], r["value"], r["reason"]) for r in rows) == sorted(
        (key, value, reason)
        for (key, value, _), reason in zip(bad, ["malformed_json", "outside_crs_area", "unknown_format"], strict=True)
    )
    # The same records, with the same reasons and source offsets, as the dead-letter topic holds.
    consumer = KafkaConsumer(
        f"{topic}.dlq", bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000
    )
    try:
        letters = {
            (int(dict(m.headers)[SOURCE_OFFSET_HEADER]), dict(m.headers)[REASON_HEADER].decode()) for m in consumer
        }
    finally:
        consumer.close()
    assert {(r["source_offset"], r["reason"]) for r in rows} == letters
    snapshots = rejects.metadata.snapshots
    assert len(snapshots) == 1, "one commit: only the batch that held rejects"
    assert json.loads(snapshots[0].summary["geoingest.kafka-offsets"])[topic]

    # Every batch replayed (the checkpoint lost, the same writer id and batch ids): both tables'
    # replay checks by batch identity keep one copy of each row.
    shutil.rmtree(tmp_path / "ck")
    again = run(settings, contract, until_idle=True, spark=spark)
    assert again.commits == {"skipped_replay": totals.batches}
    assert rejects.refresh().scan().to_arrow().num_rows == len(bad)
    data = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    assert data.scan().to_arrow().num_rows == len(good)
