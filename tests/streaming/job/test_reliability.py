"""Nothing lost, nothing twice: dead letters, replayed batches, resuming from the table, orphans.
Real broker, real Spark, real SQLite catalog."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import shapely
from kafka import KafkaConsumer

from app.errors import one_line
from app.service import run
from streaming.contract import load_contract
from streaming.job.config import SOURCES, JobConfig
from streaming.job.processor import BatchProcessor
from streaming.maintenance.orphans import find_orphans
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import WRITER_ID, recorded_offsets
from streaming.write.data_files import GeoParquetWriter
from streaming.write.dead_letter import (
    DETAIL_HEADER,
    REASON_HEADER,
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER,
)
from tests.conftest import local_settings, produce_records
from tests.streaming.job.test_chaos import (
    Service,
    catalog_of,
    checkpoint_batches,
    checkpoint_dir,
    service_env,
    wait_for,
)

pytestmark = pytest.mark.integration

CONTRACT = load_contract(Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json")


def point_feature(event_id: str, x: float, y: float) -> bytes:
    return json.dumps(
        {
            "type": "Feature",
            "id": event_id,
            "properties": {"kind": "ping"},
            "geometry": {"type": "Point", "coordinates": [x, y]},
        }
    ).encode()


def good_records(prefix: str, n: int):
    return [
        (f"{prefix}{i}".encode(), point_feature(f"{prefix}{i}", (i % 300) * 0.1, (i % 170) * 0.1 - 8), [])
        for i in range(n)
    ]


def table_ids(settings) -> list[str]:
    table = open_catalog(settings.catalog_name, settings.catalog).load_table(CONTRACT.table)
    return table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()


def consume_all(bootstrap: str, topic: str) -> list:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
        enable_auto_commit=False,
    )
    try:
        return list(consumer)
    finally:
        consumer.close()


@pytest.fixture(params=SOURCES)
def source(request) -> str:
    """Both Kafka sources must keep every promise here: Spark's, and the Python one whose tasks
    read their offset ranges themselves."""
    return request.param


def test_every_record_ends_in_the_table_or_the_dead_letter_topic(kafka, spark, topic, tmp_path, source):
    bad = [
        (b"bad-garbage", b"\x07 garbage", [("trace", b"abc")]),
        (b"bad-null", None, []),
        (b"bad-json", b'{"type": "Feature", "id": "x", "geometry": {', []),
        (b"bad-lat", point_feature("bad-lat", 10.0, 123.0), []),
        (b"bad-wkb", shapely.to_wkb(shapely.Point(1, 2))[:12], []),
    ]
    records = good_records("g", 600)
    for i, record in enumerate(bad):
        records.insert(100 * i + 7, record)
    assert produce_records(kafka.bootstrap, topic, records) == len(records)

    settings = local_settings(kafka, topic, tmp_path, source=source)
    create_table(open_catalog(settings.catalog_name, settings.catalog), CONTRACT)
    totals = run(settings, CONTRACT, until_idle=True, spark=spark)

    ids = table_ids(settings)
    assert sorted(ids) == sorted(f"g{i}" for i in range(600))
    dead = consume_all(kafka.bootstrap, settings.dead_letter_topic)
    assert len(ids) + len(dead) == len(records) == totals.consumed
    by_key = {m.key: m for m in dead}
    expected = {
        b"bad-garbage": "unknown_format",
        b"bad-null": "null_value",
        b"bad-json": "malformed_json",
        b"bad-lat": "outside_crs_area",
        b"bad-wkb": "bad_wkb",
    }
    assert {k: dict(by_key[k].headers)[REASON_HEADER].decode() for k in expected} == expected
    originals = {k: (v, h) for k, v, h in bad}
    for key, message in by_key.items():
        headers = dict(message.headers)
        value, original_headers = originals[key]
        assert message.value == value, "the value travels untouched"
        assert headers[SOURCE_TOPIC_HEADER].decode() == topic
        assert int(headers[SOURCE_PARTITION_HEADER]) in range(3) and int(headers[SOURCE_OFFSET_HEADER]) >= 0
        assert headers[DETAIL_HEADER]
        for name, original in original_headers:
            assert headers[name] == original, "original headers are kept"
    assert b"123" in dict(by_key[b"bad-lat"].headers)[DETAIL_HEADER], "the detail names the value"


def test_a_replayed_batch_is_recognised_and_leaves_no_files_behind(kafka, spark, topic, tmp_path):
    """The job died after the Iceberg commit but before Spark recorded the batch: Spark runs the
    same batch id over the same offsets again."""
    assert produce_records(kafka.bootstrap, topic, good_records("r", 400)) == 400
    catalog = open_catalog(
        "test", {"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path / 'wh'}"}
    )
    table, _ = create_table(catalog, CONTRACT)
    reports = []
    processor = BatchProcessor(
        spark,
        table,
        CONTRACT,
        JobConfig(kafka.bootstrap, topic, str(tmp_path / "ck"), "w-1"),
        observers=(reports.append,),
    )
    batch = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    processor(batch, 0)
    processor(batch, 0)
    assert [r.outcome.status for r in reports] == ["committed", "skipped_replay"]
    table.refresh()
    assert table.scan().to_arrow().num_rows == 400
    assert len(table.metadata.snapshots) == 1
    assert find_orphans(table, min_age_s=0) == [], "the replay's own files were removed"


def test_a_lost_checkpoint_resumes_from_the_offsets_in_the_table(kafka, spark, topic, tmp_path, source):
    settings = local_settings(kafka, topic, tmp_path, source=source)
    create_table(open_catalog(settings.catalog_name, settings.catalog), CONTRACT)
    produce_records(kafka.bootstrap, topic, good_records("a", 500) + [(b"bad", b"nope", [])])
    run(settings, CONTRACT, until_idle=True, spark=spark)

    shutil.rmtree(tmp_path / "ck")
    produce_records(kafka.bootstrap, topic, good_records("b", 300))
    totals = run(settings, CONTRACT, until_idle=True, spark=spark, resume_from_table=True)

    assert totals.consumed == 300, "only what came after the recorded offsets"
    ids = table_ids(settings)
    assert len(ids) == len(set(ids)) == 800
    table = open_catalog(settings.catalog_name, settings.catalog).load_table(CONTRACT.table)
    recorded = recorded_offsets(table)[topic]
    assert sum(last - first + 1 for first, last in recorded.values()) == 801, "no gap: the reject's offset too"


def test_without_resume_a_lost_checkpoint_starts_from_the_earliest_offsets_and_a_new_writer(
    kafka, spark, topic, tmp_path
):
    """Starting over is the documented default; the new writer id keeps batch 0 from being
    mistaken for the old batch 0 (which would silently drop it)."""
    settings = local_settings(kafka, topic, tmp_path)
    create_table(open_catalog(settings.catalog_name, settings.catalog), CONTRACT)
    produce_records(kafka.bootstrap, topic, good_records("a", 200))
    run(settings, CONTRACT, until_idle=True, spark=spark)
    shutil.rmtree(tmp_path / "ck")
    produce_records(kafka.bootstrap, topic, good_records("b", 100))
    totals = run(settings, CONTRACT, until_idle=True, spark=spark)
    assert totals.consumed == 300 and totals.commits == {"committed": totals.batches}
    assert len(table_ids(settings)) == 500


def test_a_writer_id_reused_by_a_checkpoint_that_lost_its_progress_is_refused_in_one_line(
    kafka, spark, topic, tmp_path
):
    """The checkpoint's offsets/ and commits/ are gone, its writer id is not: Spark numbers the
    batches from 0 again over other offsets, and the table holds batch 0 of that writer. Taking
    it for a replay dropped the new records in silence; the service stops instead, and following
    its line loses and duplicates nothing, in the rejects table either."""
    settings = local_settings(kafka, topic, tmp_path, rejects_table="ops.rejects")
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    create_table(catalog, CONTRACT)
    produce_records(kafka.bootstrap, topic, good_records("a", 300))
    run(settings, CONTRACT, until_idle=True, spark=spark)
    checkpoint = Path(settings.checkpoint_for(CONTRACT.table))
    writer_id = (checkpoint / "geoingest-writer-id").read_text().strip()
    shutil.rmtree(checkpoint / "offsets")
    shutil.rmtree(checkpoint / "commits")
    produce_records(kafka.bootstrap, topic, good_records("b", 200) + [(b"bad", b"junk", [])])

    with pytest.raises(Exception) as refused:
        run(settings, CONTRACT, until_idle=True, spark=spark)

    line = one_line(refused.value)
    table = catalog.load_table(CONTRACT.table)
    (held,) = [s.summary.additional_properties for s in table.metadata.snapshots]
    assert held[WRITER_ID] == writer_id
    assert line.startswith(f"batch 0 of writer {writer_id} is not a replay of what demo.events holds"), line
    recorded = ", ".join(f"{topic}/{p} {a}-{b}" for p, (a, b) in sorted(recorded_offsets(table)[topic].items()))
    assert f"Kafka offsets {recorded}, this batch read {topic}/" in line, line
    assert "new writer id" in line and "--resume-from-table" in line
    assert sorted(table_ids(settings)) == sorted(f"a{i}" for i in range(300)), "the refused batch added nothing"
    assert catalog.load_table("ops.rejects").current_snapshot() is None, "nor its reject"
    assert find_orphans(table, min_age_s=0) == [], "nor left its files behind"

    # What the line says: a new checkpoint (a new writer id), resumed after the table's offsets.
    shutil.rmtree(checkpoint)
    totals = run(settings, CONTRACT, until_idle=True, spark=spark, resume_from_table=True)
    assert totals.consumed == 201
    ids = table_ids(settings)
    assert len(ids) == len(set(ids)) and set(ids) == {f"a{i}" for i in range(300)} | {f"b{i}" for i in range(200)}
    rejects = catalog.load_table("ops.rejects").scan().to_arrow()
    assert rejects.column("key").to_pylist() == [b"bad"]


def test_a_batch_killed_between_the_iceberg_commit_and_the_checkpoint_is_replayed_and_skipped(kafka, topic, tmp_path):
    """The real service, held after its Iceberg commit (the test hook) and killed there: the restart
    replays that batch id over the same offsets, skips it, and goes on."""
    env = service_env(kafka.bootstrap, topic, tmp_path)
    create_table(catalog_of(env), CONTRACT)
    produce_records(kafka.bootstrap, topic, good_records("h", 300))
    marker = tmp_path / "held.marker"
    held = Service(env, tmp_path, "held", extra_env={"GEOINGEST_HOLD_AFTER_COMMIT_FILE": str(marker)})
    try:
        assert wait_for(marker.exists, 300, held), held.stderr_tail()
    finally:
        held.kill()
    batch_id = int(marker.read_text())
    planned, checkpointed = checkpoint_batches(checkpoint_dir(env))
    assert batch_id in planned and batch_id not in checkpointed, "killed between the two commits"
    produce_records(kafka.bootstrap, topic, good_records("i", 100))

    again = Service(env, tmp_path, "again", "--until-idle")
    assert again.wait(600) == 0, again.stderr_tail()

    commits = {b["batch_id"]: b["commit"] for b in again.batches()}
    assert commits[batch_id] == "skipped_replay", commits
    assert "committed" in commits.values(), "the records produced after the kill landed"
    table = catalog_of(env).load_table(CONTRACT.table)
    ids = table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()
    assert len(ids) == len(set(ids)) and set(ids) == {f"h{i}" for i in range(300)} | {f"i{i}" for i in range(100)}
    assert find_orphans(table, min_age_s=0) == [], "the replay's files were removed"


def test_files_of_a_batch_that_never_committed_are_listed_as_orphans(tmp_path, catalog):
    table, _ = create_table(catalog, CONTRACT)
    from pyarrow import RecordBatch

    from streaming.decode.decoder import Decoder
    from streaming.table.commit import BatchCommit, Committer

    def files(prefix: str):
        import pyarrow as pa
        import pyarrow.compute as pc

        values = [point_feature(f"{prefix}{i}", i * 0.1, 1.0) for i in range(50)]
        n = len(values)
        batch = RecordBatch.from_pydict(
            {
                "key": pa.array([b"k"] * n),
                "value": pa.array(values),
                "topic": pa.array(["t"] * n),
                "partition": pa.array([0] * n, pa.int32()),
                "offset": pa.array(range(n), pa.int64()),
                "timestamp": pa.array([0] * n, pa.timestamp("us")),
            }
        )
        decoded = Decoder(CONTRACT).decode(batch)
        decoded = decoded.filter(pc.is_null(decoded.column("_reject_reason")))
        writer = GeoParquetWriter(CONTRACT, table.properties, table.io.properties, f"{table.location()}/data", prefix)
        return tuple(writer.write([decoded]))

    committed = files("kept")
    Committer(table).commit(BatchCommit("w", 0, {"t": {0: (0, 49)}}, committed))
    crashed = files("crashed")  # written, never committed: the process died here

    orphans = find_orphans(table, min_age_s=0)
    assert [o.path for o in orphans] == [f.path.replace("file://", "") for f in crashed]
    assert find_orphans(table, min_age_s=3600) == [], "young files may still be committing"
    table.refresh()
    assert table.scan().to_arrow().num_rows == 50, "orphans are never read as data"
    from streaming.maintenance.orphans import delete_files

    delete_files(table, [o.path for o in orphans])
    assert find_orphans(table, min_age_s=0) == []
    assert table.scan().to_arrow().num_rows == 50


def test_a_batch_of_only_rejects_still_records_its_offsets(kafka, spark, topic, tmp_path):
    settings = local_settings(kafka, topic, tmp_path)
    create_table(open_catalog(settings.catalog_name, settings.catalog), CONTRACT)
    produce_records(kafka.bootstrap, topic, [(b"x", b"junk", []), (b"y", None, [])])
    totals = run(settings, CONTRACT, until_idle=True, spark=spark)
    assert totals.committed_rows == 0 and totals.rejected == {"unknown_format": 1, "null_value": 1}
    table = open_catalog(settings.catalog_name, settings.catalog).load_table(CONTRACT.table)
    recorded = recorded_offsets(table)[topic]
    assert sum(last - first + 1 for first, last in recorded.values()) == 2
