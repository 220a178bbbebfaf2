"""An upsert batch's versions brought together by key, however the source split its records.

Spark's Kafka source (`minPartitions`) and the Python source split one Kafka partition's offset
range over several tasks when a topic has fewer partitions than cores, and a producer may send
one key to several partitions. A task that chose the last version of each key on its own range
would write one row per task for a key whose versions it shares, and all files of a batch share
one sequence number, so no equality delete of one task reaches another task's row. So a batch of
an upsert table runs in two stages:

1. every task (streaming/write/task.py `PartitionTask`) keeps the last record of each (key, Kafka
   partition) of its range, rows and deletes alike (`last_per_partition`: the highest offset,
   which stays the highest whatever other tasks read), and stages them as Arrow IPC files, one
   record batch per key bucket (a hash of the key: streaming/kernels/key_hash.py);
2. a reducer reads every task's slices of its buckets, so it holds every version of its keys,
   chooses each key's last (`latest_versions`), writes the equality delete file of every key it
   holds, and hands the rows on to be written. A batch of at most `merge_in_task_max_rows` staged
   versions is reduced by the last task of stage one, over every bucket (no second Spark job);
   a larger one by a reduce job of one task per group of buckets (`plan_reduce`).

Pure Python over Arrow and the table's FileIO: no Spark import.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO

from streaming.contract import Contract
from streaming.decode.decoder import HILBERT
from streaming.kernels.key_hash import key_hashes
from streaming.write.data_files import DataFileRecord, FileSettings, GeoParquetWriter
from streaming.write.merge import LastTaskMerge, hilbert_sorted, peers_if_last, range_count, write_sorted
from streaming.write.upsert import OFFSET, PARTITION, TIMESTAMP, latest_versions, write_equality_deletes

# Buckets a task's versions are staged in: the unit a reducer takes. Far more than reducers, so
# that groups of buckets balance rows; few enough that a small batch stages few record batches.
KEY_BUCKETS = 64


@dataclass(frozen=True)
class VersionSlice:
    """The staged versions of one key bucket of one task: rows, or deletes (keys and positions)."""

    path: str
    index: int  # the record batch of the Arrow IPC file
    bucket: int
    rows: int
    deletes: bool

    def to_json(self) -> list:
        return [self.path, self.index, self.bucket, self.rows, self.deletes]


def version_schema(contract: Contract) -> pa.Schema:
    """A staged row: the columns the files hold, its Hilbert key and its Kafka position."""
    return pa.schema(
        [
            *contract.arrow_schema,
            pa.field(HILBERT, pa.int64()),
            pa.field(PARTITION, pa.int32()),
            pa.field(OFFSET, pa.int64()),
            pa.field(TIMESTAMP, pa.int64()),
        ]
    )


def deletes_schema(contract: Contract) -> pa.Schema:
    """A staged delete: the key columns and its Kafka position."""
    schema = contract.arrow_schema
    return pa.schema(
        [
            *(schema.field(name) for name in contract.primary_key),
            pa.field(PARTITION, pa.int32()),
            pa.field(OFFSET, pa.int64()),
            pa.field(TIMESTAMP, pa.int64()),
        ]
    )


def key_buckets(table: pa.Table, key_columns: Sequence[str], buckets: int = KEY_BUCKETS) -> np.ndarray:
    """The bucket of each row's key: equal keys, equal buckets, in every task."""
    if table.num_rows == 0:
        return np.zeros(0, np.int64)
    hashes = key_hashes([table.column(name) for name in key_columns])
    return (hashes % np.uint64(buckets)).astype(np.int64)


def stage_versions(
    rows: pa.Table, deletes: pa.Table, contract: Contract, staging: str, io: FileIO
) -> list[VersionSlice]:
    """A task's last records per (key, partition), each kind as one Arrow IPC file under `staging`,
    one record batch per key bucket it holds."""
    slices = []
    for table, schema, is_deletes in (
        (rows, version_schema(contract), False),
        (deletes, deletes_schema(contract), True),
    ):
        if table.num_rows == 0:
            continue
        table = table.select(schema.names).cast(schema)
        bucket = key_buckets(table, contract.primary_key)
        order = np.argsort(bucket, kind="stable")
        ordered, sorted_buckets = table.take(pa.array(order)), bucket[order]
        starts = np.flatnonzero(np.r_[True, sorted_buckets[1:] != sorted_buckets[:-1]])
        stops = np.r_[starts[1:], len(sorted_buckets)]
        path = f"{staging.rstrip('/')}/versions-{uuid.uuid4().hex}.arrow"
        with io.new_output(path).create(overwrite=True) as out, pa.ipc.new_file(out, schema) as ipc:
            for index, (start, stop) in enumerate(zip(starts, stops)):
                ipc.write_table(ordered.slice(int(start), int(stop - start)), max_chunksize=int(stop - start))
                slices.append(VersionSlice(path, index, int(sorted_buckets[start]), int(stop - start), is_deletes))
    return slices


def reduce_versions(slices: Sequence[VersionSlice], contract: Contract, io: FileIO) -> tuple[pa.Table, pa.Table]:
    """(each key's last version among the staged slices, unless deleted, in the files' columns and
    the Hilbert key; every key the slices hold, for the equality delete file)."""
    rows_schema, deletes_schema_ = version_schema(contract), deletes_schema(contract)
    rows = _read(slices, False, rows_schema, io)
    deletes = _read(slices, True, deletes_schema_, io)
    latest, touched = latest_versions(rows, deletes, contract.primary_key)
    return latest.select([*contract.arrow_schema.names, HILBERT]), touched


def _read(slices: Sequence[VersionSlice], deletes: bool, schema: pa.Schema, io: FileIO) -> pa.Table:
    by_path: dict[str, list[int]] = {}
    for s in slices:
        if s.deletes == deletes:
            by_path.setdefault(s.path, []).append(s.index)
    parts = []
    for path, indices in by_path.items():
        with io.new_input(path).open(seekable=True) as f:
            reader = pa.ipc.open_file(f)
            parts += [reader.get_batch(index) for index in indices]
    return pa.Table.from_batches(parts, schema=schema)


def reduced_files(
    slices: Sequence[VersionSlice],
    contract: Contract,
    files: FileSettings,
    writer: GeoParquetWriter,
    ranges: int,
    threads: int = 1,
) -> list[DataFileRecord]:
    """The files of a reducer that writes them itself: the equality delete file of every key the
    slices hold, and the last versions sorted along the curve in `ranges` stretches."""
    latest, touched = reduce_versions(slices, contract, writer.io)
    records = delete_file(touched, contract, files, writer.io)
    ordered = pa.Table.from_batches(list(hilbert_sorted(latest)), schema=latest.schema)
    return records + write_sorted(ordered, ranges, writer, threads)


def delete_file(touched: pa.Table, contract: Contract, files: FileSettings, io: FileIO) -> list[DataFileRecord]:
    if touched.num_rows == 0:
        return []
    return [
        write_equality_deletes(touched, contract, io, files.table_properties, files.data_location, files.file_prefix)
    ]


def reduce_if_last(
    own: list[VersionSlice],
    number: int,
    tasks: int,
    staging: str,
    plan: LastTaskMerge,
    contract: Contract,
    files: FileSettings,
    writer: GeoParquetWriter,
) -> tuple[list[DataFileRecord], int] | None:
    """If every task of the stage has staged its versions and they are few enough, the whole
    batch's files (delete file included) and the staged versions reduced; else None (the reduce
    job does it)."""
    peers = peers_if_last([s.to_json() for s in own], number, tasks, f"{staging.rstrip('/')}/done", writer.io)
    if peers is None:
        return None
    slices = [VersionSlice(*s) for peer in peers for s in peer]
    staged = sum(s.rows for s in slices)
    if staged > plan.max_rows:
        return None
    rows = sum(s.rows for s in slices if not s.deletes)
    ranges = range_count(rows, plan.min_ranges, plan.rows_per_range)
    return reduced_files(slices, contract, files, writer, ranges, plan.threads), staged


def plan_reduce(slices: Sequence[VersionSlice], groups: int) -> list[tuple[VersionSlice, ...]]:
    """The buckets cut into at most `groups` runs of consecutive buckets of about equal staged
    rows, each with every slice of its buckets: one reducer's input each."""
    if not slices:
        return []
    per_bucket = np.zeros(KEY_BUCKETS, np.int64)
    for s in slices:
        per_bucket[s.bucket] += s.rows
    share = math.ceil(per_bucket.sum() / max(1, groups))
    cut_of_bucket = np.minimum(np.cumsum(per_bucket) - per_bucket, per_bucket.sum() - 1) // max(1, share)
    plan: dict[int, list[VersionSlice]] = {}
    for s in slices:
        plan.setdefault(int(cut_of_bucket[s.bucket]), []).append(s)
    return [tuple(plan[cut]) for cut in sorted(plan)]
