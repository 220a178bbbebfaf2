"""The one-pass task of an input partition, without Spark: Kafka batches in, tallies and
Hilbert-sorted GeoParquet files out (what the driver collects of every task)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import shapely

from streaming.contract import BBOX_FIELDS
from streaming.decode.decoder import DecodeOptions
from streaming.kernels.hilbert import hilbert_keys_of_bounds
from streaming.write.data_files import FileSettings
from streaming.write.merge import LastTaskMerge, MergeRange, Slice, plan_merge
from streaming.write.task import (
    EVENT_TIMES,
    FILE,
    TALLY,
    BatchResults,
    MergeTask,
    PartitionTask,
    Tally,
)
from tests.streaming.decode.test_decoder import DEMO, FIRST_OFFSET, TOPIC, feature, kafka_batch, point


def task(tmp_path, rows_per_run: int = 1_000_000) -> PartitionTask:
    return PartitionTask(
        DEMO,
        DecodeOptions(),
        FileSettings({}, {}, f"file://{tmp_path}/data", "w-b000000007"),
        rows_per_run=rows_per_run,
    )


def run(task: PartitionTask, batches: list[pa.RecordBatch]) -> BatchResults:
    out = list(task(batches))
    assert len(out) == 1, "one result batch per task"
    return BatchResults.from_rows(out[0].to_pylist())


def points(n: int, seed: int = 3) -> list[bytes]:
    rng = np.random.default_rng(seed)
    xs, ys = rng.uniform(-170, 170, n), rng.uniform(-80, 80, n)
    return [
        feature(point(float(x), float(y)), fid=f"s{seed}-p{i}", kind="ping", speed=1.0)
        for i, (x, y) in enumerate(zip(xs, ys))
    ]


def keys_of(path: str) -> np.ndarray:
    bbox = pq.read_table(path.removeprefix("file://"), columns=["bbox"]).column("bbox").combine_chunks()
    b = [bbox.field(name).to_numpy() for name in BBOX_FIELDS]
    return hilbert_keys_of_bounds(*b, DEMO.clustering.extent, DEMO.clustering.hilbert_bits)


def test_tallies_account_for_every_record_by_partition_and_fate(tmp_path):
    good = points(30)
    values = good[:10] + [b"junk", None] + good[10:]
    first = kafka_batch(values[:16], partition=0)
    second = kafka_batch(values[16:], partition=1)
    results = run(task(tmp_path), [first, second])
    tallies = sorted(results.tallies, key=lambda t: (t.partition, t.reason or ""))
    last_of_first = FIRST_OFFSET + 15
    assert tallies == [
        Tally(TOPIC, 0, None, FIRST_OFFSET, last_of_first, 14, tallies[0].oldest_ms),
        Tally(TOPIC, 0, "null_value", FIRST_OFFSET + 11, FIRST_OFFSET + 11, 1, tallies[1].oldest_ms),
        Tally(TOPIC, 0, "unknown_format", FIRST_OFFSET + 10, FIRST_OFFSET + 10, 1, tallies[2].oldest_ms),
        Tally(TOPIC, 1, None, FIRST_OFFSET, FIRST_OFFSET + 15, 16, tallies[3].oldest_ms),
    ]
    assert sum(f.record_count for f in results.files) == 30


def test_files_are_hilbert_sorted_and_carry_their_bounds(tmp_path):
    batches = [kafka_batch(points(500, seed=s)) for s in range(4)]
    results = run(task(tmp_path), batches)
    assert sum(f.record_count for f in results.files) == 2000
    for record in results.files:
        keys = keys_of(record.path)
        assert np.all(np.diff(keys) >= 0), "rows in Hilbert order"
        bbox = pq.read_table(record.path.removeprefix("file://"), columns=["bbox"]).column("bbox").combine_chunks()
        assert record.bbox == (
            min(bbox.field("xmin").to_pylist()),
            min(bbox.field("ymin").to_pylist()),
            max(bbox.field("xmax").to_pylist()),
            max(bbox.field("ymax").to_pylist()),
        )
        assert record.path.rsplit("/", 1)[1].startswith("w-b000000007-")
        geo = json.loads(pq.read_metadata(record.path.removeprefix("file://")).metadata[b"geo"])
        assert geo["columns"]["geometry"]["covering"]["bbox"]["xmin"] == ["bbox", "xmin"]


def test_a_run_bounds_the_rows_held_and_each_run_is_sorted_on_its_own(tmp_path):
    batches = [kafka_batch(points(400, seed=s)) for s in range(5)]
    results = run(task(tmp_path, rows_per_run=800), batches)
    assert sum(f.record_count for f in results.files) == 2000
    # the demo contract cuts files at 1 MiB, far above 800 points: a file per run of two batches
    batches_in = sorted(
        sorted(
            {
                i.split("-")[0]
                for i in pq.read_table(f.path.removeprefix("file://"), columns=["event_id"]).column(0).to_pylist()
            }
        )
        for f in results.files
    )
    assert batches_in == [["s0", "s1"], ["s2", "s3"], ["s4"]]


def test_a_partition_of_rejects_only_writes_no_file_and_still_reports_its_offsets(tmp_path):
    results = run(task(tmp_path), [kafka_batch([b"x", b"y"], partition=3)])
    assert results.files == []
    assert [(t.partition, t.reason, t.first, t.last, t.n) for t in results.tallies] == [
        (3, "unknown_format", FIRST_OFFSET, FIRST_OFFSET + 1, 2)
    ]


def test_result_rows_are_told_apart_by_kind(tmp_path):
    out = list(task(tmp_path)([kafka_batch(points(3))]))[0].to_pylist()
    assert {row["kind"] for row in out} == {TALLY, FILE, EVENT_TIMES}
    assert sum(row["n"] for row in out if row["kind"] == EVENT_TIMES) == 3, "every valid event's timestamp"
    assert all(
        shapely.box(row["xmin"], row["ymin"], row["xmax"], row["ymax"]).is_valid for row in out if row["kind"] == FILE
    )


# -- clustering "batch": sorted runs merged by key range ---------------------------------------------
def test_plan_cuts_the_keys_into_ranges_of_about_equal_rows():
    slices = [
        Slice("a", 0, 0, 99, 100),
        Slice("a", 1, 100, 199, 100),
        Slice("b", 0, 50, 149, 100),
        Slice("b", 1, 150, 249, 100),
    ]
    plan = plan_merge(slices, 2)
    assert [(r.key_lo, r.key_hi) for r in plan] == [(None, 125), (125, None)]
    assert plan[0].slices == (("a", 0), ("a", 1), ("b", 0))
    assert plan[1].slices == (("a", 1), ("b", 0), ("b", 1))


def test_plan_never_splits_one_key_and_reads_every_slice():
    slices = [Slice("a", i, 7, 7, 10) for i in range(4)]
    plan = plan_merge(slices, 3)
    # the only cut is at 7, below which nothing lies: one range holds them all
    assert [(r.key_lo, r.key_hi) for r in plan] == [(7, None)]
    assert plan[0].slices == tuple(("a", i) for i in range(4))


def test_runs_of_several_tasks_merge_into_files_that_do_not_overlap_on_the_curve(tmp_path):
    staging = f"file://{tmp_path}/staging"
    first = run(
        dataclasses.replace(task(tmp_path, rows_per_run=700), staging=staging),
        [kafka_batch(points(500, seed=s)) for s in (1, 2, 3)],
    )
    second = run(dataclasses.replace(task(tmp_path), staging=staging), [kafka_batch(points(800, seed=9))])
    assert first.files == [] and second.files == []
    slices = first.slices + second.slices
    assert sum(s.rows for s in slices) == 2300
    plan = plan_merge(slices, 3)
    merge = MergeTask(DEMO, FileSettings({}, {}, f"file://{tmp_path}/data", "w-b000000007"), tuple(plan))
    out = [BatchResults.from_rows(b.to_pylist()) for b in merge([pa.record_batch({"id": list(range(len(plan)))})])]
    files = [f for o in out for f in o.files]
    ids = [
        i
        for f in files
        for i in pq.read_table(f.path.removeprefix("file://"), columns=["event_id"]).column(0).to_pylist()
    ]
    assert sorted(ids) == sorted(f"s{s}-p{i}" for s, n in ((1, 500), (2, 500), (3, 500), (9, 800)) for i in range(n))
    spans = sorted((keys_of(f.path)[0], keys_of(f.path)[-1]) for f in files)
    for (_lo, hi), (next_lo, _) in zip(spans, spans[1:]):
        assert hi <= next_lo, "files follow each other along the curve"
    for f in files:
        assert np.all(np.diff(keys_of(f.path)) >= 0)


def test_rows_that_share_the_key_of_a_cut_land_in_one_range_once(tmp_path):
    staging = f"file://{tmp_path}/staging"
    same_place = [feature(point(2.35, 48.85), fid=f"same-{i}", kind="ping", speed=1.0) for i in range(600)]
    first = run(dataclasses.replace(task(tmp_path), staging=staging), [kafka_batch(points(300, seed=1) + same_place)])
    second = run(dataclasses.replace(task(tmp_path), staging=staging), [kafka_batch(same_place[:100] + points(300))])
    read_all = tuple((s.path, s.index) for s in first.slices + second.slices)
    key = int(
        hilbert_keys_of_bounds(
            np.array([2.35]),
            np.array([48.85]),
            np.array([2.35]),
            np.array([48.85]),
            DEMO.clustering.extent,
            DEMO.clustering.hilbert_bits,
        )[0]
    )
    ranges = (MergeRange(None, key, read_all), MergeRange(key, key + 1, read_all), MergeRange(key + 1, None, read_all))
    merge = MergeTask(DEMO, FileSettings({}, {}, f"file://{tmp_path}/data", "w-b000000007"), ranges)
    out = [BatchResults.from_rows(b.to_pylist()) for b in merge([pa.record_batch({"id": [0, 1, 2]})])]
    files = [f for o in out for f in o.files]
    assert sorted(ids_in(files)) == sorted(
        [f"s1-p{i}" for i in range(300)]
        + [f"s3-p{i}" for i in range(300)]
        + [f"same-{i}" for i in range(600)]
        + [f"same-{i}" for i in range(100)]
    )
    at_key = [f for f in files if keys_of(f.path)[0] == key]
    assert sorted(ids_in(at_key)) == sorted([f"same-{i}" for i in range(600)] + [f"same-{i}" for i in range(100)]), (
        "every row of the cut's key, and only those, in the range that starts there"
    )


# -- small batches: merged by their last task -------------------------------------------------------
def last_merge_tasks(tmp_path, tasks: int, max_rows: int = 1_000_000, threads: int = 1) -> list[PartitionTask]:
    staging = f"file://{tmp_path}/staging"
    return [
        dataclasses.replace(
            task(tmp_path),
            staging=staging,
            last_merge=LastTaskMerge(lambda n=n: (n, tasks), 2, 1_000_000, max_rows, threads),
        )
        for n in range(tasks)
    ]


def ids_in(files) -> list[str]:
    return [
        i
        for f in files
        for i in pq.read_table(f.path.removeprefix("file://"), columns=["event_id"]).column(0).to_pylist()
    ]


def test_the_last_task_of_a_small_batch_merges_every_run_into_files_that_follow_the_curve(tmp_path):
    tasks = last_merge_tasks(tmp_path, 3)
    inputs = [[kafka_batch(points(400, seed=1))], [], [kafka_batch(points(700, seed=2) + [b"junk"])]]
    results = [run(t, batches) for t, batches in zip(tasks, inputs)]
    assert results[0].merged == {} and results[1].merged == {}, "a task that is not last leaves the merge"
    files = results[2].merged[2]
    assert sorted(ids_in(files)) == sorted([f"s1-p{i}" for i in range(400)] + [f"s2-p{i}" for i in range(700)])
    assert len(files) == 2, "as many key ranges as a merge job would cut"
    spans = sorted((keys_of(f.path)[0], keys_of(f.path)[-1]) for f in files)
    assert spans[0][1] <= spans[1][0]
    assert all(np.all(np.diff(keys_of(f.path)) >= 0) for f in files)
    assert {t.reason: t.n for t in results[2].tallies} == {None: 700, "unknown_format": 1}, (
        "a task's tallies stay its own"
    )


def test_the_last_task_writes_the_same_files_on_two_threads_as_on_one(tmp_path):
    files_by_threads = {}
    for threads in (1, 2):
        tasks = last_merge_tasks(tmp_path / f"threads-{threads}", 2, threads=threads)
        results = [run(t, [kafka_batch(points(n, seed=seed))]) for t, (n, seed) in zip(tasks, ((900, 1), (700, 2)))]
        files_by_threads[threads] = [(f.record_count, f.bbox, ids_in([f])) for f in results[1].merged[1]]
    assert len(files_by_threads[2]) == 2
    assert files_by_threads[2] == files_by_threads[1], "the same rows in the same files, in curve order"


def test_a_task_that_ran_again_replaces_its_own_marker_and_the_rows_stay_once(tmp_path):
    first, second = last_merge_tasks(tmp_path, 2)
    run(first, [kafka_batch(points(300, seed=1))])
    run(first, [kafka_batch(points(300, seed=1))])  # a retried attempt of task 0: a second run, same rows
    merged = run(second, [kafka_batch(points(200, seed=2))]).merged[1]
    assert sorted(ids_in(merged)) == sorted([f"s1-p{i}" for i in range(300)] + [f"s2-p{i}" for i in range(200)])


def test_a_batch_above_the_limit_is_left_to_the_merge_job(tmp_path):
    first, second = last_merge_tasks(tmp_path, 2, max_rows=499)
    results = [run(first, [kafka_batch(points(300, seed=1))]), run(second, [kafka_batch(points(200, seed=2))])]
    assert all(r.merged == {} and r.files == [] for r in results)
    assert sum(s.rows for r in results for s in r.slices) == 500, "the runs stay staged for the merge job"


# -- worker processes ------------------------------------------------------------------------------
def memory_pool_of_a_prepared_worker(env: dict[str, str]) -> str:
    code = (
        "import pyarrow as pa; from streaming.write.task import prepare_worker_process; "
        "prepare_worker_process(); print(pa.default_memory_pool().backend_name)"
    )
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[3],
    )
    return done.stdout.strip()


def test_a_worker_allocates_with_malloc_unless_arrow_is_told_a_pool():
    assert memory_pool_of_a_prepared_worker({}) == "system"
    assert memory_pool_of_a_prepared_worker({"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}) == "mimalloc"


def test_a_partition_of_deletes_only_writes_their_keys_and_no_rows(tmp_path):
    # Change events of a mirrored table (format "debezium") whose task range holds only deletes:
    # a delete event and the tombstone after it, of two keys.
    from tests.streaming.decode.formats.test_debezium import PLACES, event, key

    deletes = [event("d", before={"id": i, "name": None, "geom": None}) for i in (3, 4)]
    upsert_task = dataclasses.replace(last_merge_tasks(tmp_path, 1)[0], contract=PLACES)
    results = run(upsert_task, [kafka_batch([*deletes, None, None], keys=[key(3), key(4), key(3), key(4)])])
    assert results.files == [] and results.delete_files == []
    merged = BatchResults()
    merged.take_files(results.merged[0])
    assert merged.files == [] and len(merged.delete_files) == 1
    deleted = pq.read_table(merged.delete_files[0].path.removeprefix("file://"))
    assert sorted(deleted.column("id").to_pylist()) == [3, 4]
    assert [(t.reason, t.n) for t in results.tallies] == [(None, 4)], "deletes count as valid records"
