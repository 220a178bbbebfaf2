"""An upsert batch's versions brought together by key (streaming/write/versions.py), whatever way the
source split its records over tasks: the pure reduction on hard-coded values, then the tasks of one
batch over one Kafka partition's range cut in pieces, reduced by the last task and by reduce tasks.

Before the two stages, each task wrote its own last version of a key: the table then held one row
per task for a key whose versions two tasks shared, and a tombstone in one task's piece left the
other task's row in place (no equality delete reaches a row of its own batch)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import shapely

from streaming.contract import parse_contract
from streaming.decode.decoder import UNAVAILABLE
from streaming.write.data_files import FileSettings
from streaming.write.merge import LastTaskMerge
from streaming.write.task import BatchResults, ReduceTask
from streaming.write.upsert import OFFSET, PARTITION, TIMESTAMP, last_per_partition
from streaming.write.versions import (
    KEY_BUCKETS,
    VersionSlice,
    deletes_schema,
    fill_unavailable,
    plan_reduce,
    version_schema,
)
from tests.conftest import CACHE_DIR
from tests.streaming.decode.test_decoder import feature, kafka_batch, point
from tests.streaming.write.test_task import run, task


def positions(keys, partitions, offsets, timestamps=None) -> pa.Table:
    n = len(keys)
    return pa.table(
        {
            "k": pa.array(keys, pa.string()),
            PARTITION: pa.array(partitions, pa.int32()),
            OFFSET: pa.array(offsets, pa.int64()),
            TIMESTAMP: pa.array(timestamps or [0] * n, pa.int64()),
        }
    )


def test_a_task_keeps_the_last_record_of_each_key_and_partition_rows_and_tombstones_alike():
    rows = positions(["a", "a", "b", "a", "c"], [0, 0, 0, 1, 0], [1, 5, 2, 3, 9])
    tombstones = positions(["b", "c"], [0, 0], [7, 4])
    kept_rows, kept_tombstones = last_per_partition(rows, tombstones, ("k",))
    # a: offset 5 in partition 0 and offset 3 in partition 1 (both stay for the reducer); b: deleted
    # after its row at 2; c: its row at 9 comes after the tombstone at 4.
    assert list(zip(kept_rows.column("k").to_pylist(), kept_rows.column(OFFSET).to_pylist())) == [
        ("a", 5),
        ("a", 3),
        ("c", 9),
    ]
    assert kept_tombstones.column("k").to_pylist() == ["b"]


def test_reducers_take_runs_of_whole_buckets_of_about_equal_rows():
    slices = [VersionSlice(f"t{t}", b, b, 10 + b % 3, bool(t)) for t in range(2) for b in range(0, KEY_BUCKETS, 2)]
    groups = plan_reduce(slices, 4)
    assert len(groups) == 4
    buckets = [sorted({s.bucket for s in g}) for g in groups]
    assert sorted(b for g in buckets for b in g) == list(range(0, KEY_BUCKETS, 2)), "each bucket in one group"
    assert all(max(a) < min(b) for a, b in zip(buckets, buckets[1:])), "runs of consecutive buckets"
    rows = [sum(s.rows for s in g) for g in groups]
    assert max(rows) - min(rows) <= 2 * (12 * 2), "within about a bucket of each other"
    assert {(s.path, s.bucket) for g in groups for s in g} == {(s.path, s.bucket) for s in slices}


# -- one partition's range over several tasks --------------------------------------------------------
def upsert_contract(covering: bool = True):
    """`covering` False: a native-geometry table that stores no bbox covering."""
    from tests.streaming.write.test_upsert import DEMO as RAW

    if covering:
        return parse_contract({**RAW, "mode": "upsert"})
    geometry = {**RAW["geometry"], "native": True}
    return parse_contract({**RAW, "mode": "upsert", "geometry": geometry, "bbox": {"stored": False}})


def versions_stream(n_keys: int, n: int, seed: int) -> tuple[list[bytes], list[bytes | None], dict]:
    """Keyed versions anywhere on the map and 10 % tombstones, and the state they leave."""
    rng = np.random.default_rng(seed)
    keys, values, state = [], [], {}
    for i in range(n):
        key = f"k{rng.integers(n_keys)}"
        if key in state and rng.random() < 0.1:
            keys.append(key.encode())
            values.append(None)
            state.pop(key)
            continue
        x, y = float(rng.uniform(-170, 170)), float(rng.uniform(-80, 80))
        keys.append(key.encode())
        values.append(feature(point(x, y), fid=key, speed=float(i)))
        state[key] = (round(x, 6), round(y, 6), float(i))
    return keys, values, state


def pieces(keys, values, tasks: int) -> list[pa.RecordBatch]:
    """One Kafka partition's records cut into `tasks` consecutive offset ranges."""
    whole = kafka_batch(values, keys=keys, partition=0)
    whole = whole.set_column(
        whole.schema.get_field_index("offset"), "offset", pa.array(np.arange(len(values)), pa.int64())
    )
    cuts = np.linspace(0, len(values), tasks + 1).astype(int)
    return [whole.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])]


def upsert_tasks(tmp_path, n: int, max_rows: int = 1_000_000):
    staging = f"file://{tmp_path}/staging"
    return [
        dataclasses.replace(
            task(tmp_path),
            contract=upsert_contract(),
            staging=staging,
            last_merge=LastTaskMerge(lambda i=i: (i, n), 2, 1_000_000, max_rows, 2),
        )
        for i in range(n)
    ]


def table_state(records) -> dict:
    rows = pa.concat_tables(
        [pq.read_table(r.path.removeprefix("file://"), columns=["event_id", "geometry", "speed"]) for r in records]
    )
    ids = rows.column("event_id").to_pylist()
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} keys written twice"
    points = shapely.from_wkb(rows.column("geometry").to_numpy(zero_copy_only=False))
    return {
        k: (round(float(shapely.get_x(p)), 6), round(float(shapely.get_y(p)), 6), s)
        for k, p, s in zip(ids, points, rows.column("speed").to_pylist())
    }


def deleted_keys(records) -> set[str]:
    return {k for r in records for k in pq.read_table(r.path.removeprefix("file://")).column("event_id").to_pylist()}


def test_the_last_task_reduces_a_partition_split_over_tasks_to_each_keys_last_version(tmp_path):
    keys, values, state = versions_stream(n_keys=200, n=3_000, seed=1)
    tasks = upsert_tasks(tmp_path, 3)
    results = [run(t, [piece]) for t, piece in zip(tasks, pieces(keys, values, 3))]
    assert all(r.files == [] and r.delete_files == [] for r in results), "no task writes rows of its own"
    assert results[0].merged == {} and results[1].merged == {}
    batch = BatchResults()
    batch.take_files(results[2].merged[2])
    assert results[2].merged_inputs[2] == sum(v.rows for r in results for v in r.versions)
    assert table_state(batch.files) == state, "one row per live key, its last version"
    assert len(batch.delete_files) == 1 and deleted_keys(batch.delete_files) == {k.decode() for k in keys}, (
        "one delete file listing every key the batch touched"
    )


def test_reduce_tasks_give_the_same_rows_as_the_last_task(tmp_path):
    keys, values, state = versions_stream(n_keys=200, n=3_000, seed=2)
    tasks = upsert_tasks(tmp_path, 3, max_rows=10)  # too many for the last task: the reduce job's
    results = [run(t, [piece]) for t, piece in zip(tasks, pieces(keys, values, 3))]
    assert all(r.merged == {} for r in results)
    versions = [v for r in results for v in r.versions]
    groups = plan_reduce(versions, 3)
    files = FileSettings({}, {}, f"file://{tmp_path}/data", "w-b000000007")
    reduce = ReduceTask(upsert_contract(), files, tuple(groups))
    out = BatchResults.from_rows(list(reduce([pa.record_batch({"id": list(range(len(groups)))})]))[0].to_pylist())
    assert table_state(out.files) == state
    assert len(out.delete_files) == len(groups) and deleted_keys(out.delete_files) == {k.decode() for k in keys}


def test_versions_of_a_key_in_two_partitions_read_by_two_tasks_meet_and_the_later_one_wins(tmp_path):
    first = kafka_batch([feature(point(1, 1), fid="a", speed=1.0)], keys=[b"a"], partition=0)
    second = kafka_batch([feature(point(2, 2), fid="a", speed=2.0)], keys=[b"a"], partition=1)
    # the second's Kafka timestamp is the later one
    second = second.set_column(
        second.schema.get_field_index("timestamp"),
        "timestamp",
        pc.add(second.column("timestamp").cast(pa.int64()), 1_000).cast(pa.timestamp("us")),
    )
    tasks = upsert_tasks(tmp_path, 2)
    run(tasks[0], [second])
    batch = BatchResults()
    batch.take_files(run(tasks[1], [first]).merged[1])
    assert table_state(batch.files) == {"a": (2.0, 2.0, 2.0)}


# -- values a change event did not carry -------------------------------------------------------------
def staged_rows(contract, rows: list[dict]) -> pa.Table:
    """Staged versions (version_schema) of hard-coded rows: event_id, name, x, y, partition, offset,
    and the columns the event lacked (geometry lacked: no geometry, bbox nor Hilbert key)."""
    schema = version_schema(contract)
    n = len(rows)
    lacks = [r.get("lacks") for r in rows]
    has_geometry = ["geometry" not in (lack or ()) for lack in lacks]
    points = [shapely.Point(r.get("x", 0), r.get("y", 0)) for r in rows]
    boxes = [
        (r.get("x", 0), r.get("y", 0), r.get("x", 0), r.get("y", 0)) if g else None for r, g in zip(rows, has_geometry)
    ]
    columns = {
        "event_id": pa.array([r["id"] for r in rows]),
        "event_time": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
        "kind": pa.nulls(n, pa.string()),
        "name": pa.array([None if "name" in (r.get("lacks") or ()) else r.get("name") for r in rows], pa.string()),
        "speed": pa.nulls(n, pa.float64()),
        "population": pa.nulls(n, pa.int64()),
        "source_partition": pa.array([r.get("partition", 0) for r in rows], pa.int32()),
        "source_offset": pa.array([r["offset"] for r in rows], pa.int64()),
        "geometry": pa.array([shapely.to_wkb(p) if g else None for p, g in zip(points, has_geometry)], pa.binary()),
        "bbox": pa.array(
            [None if b is None else dict(zip(("xmin", "ymin", "xmax", "ymax"), b)) for b in boxes],
            schema.field("bbox").type,
        ),
        "_hilbert": pa.array([r["offset"] if g else None for r, g in zip(rows, has_geometry)], pa.int64()),
        PARTITION: pa.array([r.get("partition", 0) for r in rows], pa.int32()),
        OFFSET: pa.array([r["offset"] for r in rows], pa.int64()),
        TIMESTAMP: pa.array([r["offset"] for r in rows], pa.int64()),
        UNAVAILABLE: pa.array([list(lack) if lack else None for lack in lacks], pa.list_(pa.string())),
    }
    return pa.table([columns[f.name] for f in schema], schema=schema)


def staged_deletes(contract, deletes: list[tuple[str, int]]) -> pa.Table:
    schema = deletes_schema(contract)
    return pa.table(
        {
            "event_id": [k for k, _ in deletes],
            PARTITION: pa.array([0] * len(deletes), pa.int32()),
            OFFSET: pa.array([o for _, o in deletes], pa.int64()),
            TIMESTAMP: pa.array([o for _, o in deletes], pa.int64()),
        },
        schema=schema,
    )


def where_and_name(rows: pa.Table) -> dict[int, tuple]:
    points = [None if g is None else shapely.from_wkb(g) for g in rows.column("geometry").to_pylist()]
    return {
        o: (n, None if p is None else (p.x, p.y), u)
        for o, n, p, u in zip(
            rows.column(OFFSET).to_pylist(),
            rows.column("name").to_pylist(),
            points,
            rows.column(UNAVAILABLE).to_pylist(),
        )
    }


def test_an_unavailable_value_is_the_nearest_earlier_one_of_its_key_and_never_crosses_a_delete():
    contract = upsert_contract()
    rows = staged_rows(
        contract,
        [
            {"id": "a", "offset": 1, "name": "first", "x": 1, "y": 1},
            {"id": "b", "offset": 2, "name": "b", "x": 5, "y": 5},
            {"id": "a", "offset": 3, "x": 2, "y": 2, "lacks": ["name"]},
            {"id": "a", "offset": 4, "name": "renamed", "lacks": ["geometry"]},
            {"id": "b", "offset": 6, "name": "b2", "lacks": ["geometry"]},
            {"id": "c", "offset": 7, "lacks": ["name", "geometry"]},
        ],
    )
    filled = fill_unavailable(rows, staged_deletes(contract, [("b", 5)]), contract)
    assert where_and_name(filled) == {
        1: ("first", (1.0, 1.0), None),
        2: ("b", (5.0, 5.0), None),
        3: ("first", (2.0, 2.0), None),
        4: ("renamed", (2.0, 2.0), None),  # the geometry of offset 3, itself filled with offset 1's name
        6: ("b2", None, ["geometry"]),  # b was deleted at 5: nothing before it counts
        7: (None, None, ["geometry", "name"]),  # c has no earlier record
    }
    bbox = filled.column("bbox").to_pylist()[3]
    assert bbox == {"xmin": 2.0, "ymin": 2.0, "xmax": 2.0, "ymax": 2.0} and filled.column("_hilbert")[3].as_py() == 3


@pytest.mark.parametrize("covering", [True, False], ids=["bbox", "native-no-bbox"])
def test_what_the_batch_does_not_hold_comes_from_the_tables_current_row(tmp_path, covering):
    """Without a stored covering, the geometry taken from the table brings a covering made again."""
    from app.maven import configure_iceberg_java
    from streaming.read.current import TableRows
    from streaming.table.catalog import create_table, open_catalog
    from streaming.table.commit import BatchCommit, Committer
    from streaming.write.versions import fill_from_table

    configure_iceberg_java(CACHE_DIR)  # a native table is made and committed to by Iceberg Java
    contract = upsert_contract(covering)
    catalog = open_catalog(
        "t", {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/w"}
    )
    table, _ = create_table(catalog, contract)
    before = staged_rows(
        contract,
        [
            {"id": "a", "offset": 1, "name": "old", "x": 7, "y": 8},
            {"id": "b", "offset": 2, "name": "b", "x": 3, "y": 3},
        ],
    )
    writer = FileSettings(dict(table.properties), dict(table.io.properties), f"{table.location()}/data", "w").writer(
        contract
    )
    written = list(writer.write(before.select([*contract.arrow_schema.names]).to_batches()))
    Committer(table).commit(BatchCommit("w", 0, {"t": {0: (1, 2)}}, tuple(written)))

    latest = staged_rows(
        contract,
        [
            {"id": "a", "offset": 3, "name": "new", "lacks": ["geometry"]},
            {"id": "b", "offset": 4, "x": 4, "y": 4, "lacks": ["name"]},
            {"id": "z", "offset": 5, "name": "z", "lacks": ["geometry"]},
        ],
    )
    current = TableRows(table.metadata_location, dict(table.io.properties))
    filled, unplaced = fill_from_table(latest, contract, current)
    assert unplaced == 1, "z has no row in the table: its geometry is nowhere"
    assert {k: v[:2] for k, v in where_and_name(filled).items()} == {3: ("new", (7.0, 8.0)), 4: ("b", (4.0, 4.0))}
    assert filled.column("_hilbert").to_pylist()[0] != 3, "the Hilbert key of the table's geometry, computed again"
    assert filled.column("bbox").to_pylist()[0] == {"xmin": 7.0, "ymin": 8.0, "xmax": 7.0, "ymax": 8.0}
