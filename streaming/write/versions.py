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

A change event may lack a value it left unchanged (Debezium's placeholder for a TOASTed column
under REPLICA IDENTITY DEFAULT, streaming/decode/formats/debezium.py): the decoder lists such
columns in UNAVAILABLE. The key's current value is kept: both stages take each listed column from
the nearest earlier record of the key in its partition that carried it (no delete of the key in
between, `fill_unavailable`), and the reducer takes what is still missing from the key's row in
the table as the batch found it (`CurrentRows`, streaming/read/current.py). A row whose geometry
(or another required column) no earlier record and no table row holds cannot be written and is
left out (counted in the results, logged by the driver); an optional column left unknown is
stored as null, never as the placeholder.

Pure Python over Arrow and the table's FileIO: no Spark import.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO

from streaming.contract import Contract
from streaming.decode.covering import with_covering
from streaming.decode.decoder import HILBERT, UNAVAILABLE, UNAVAILABLE_TYPE
from streaming.kernels.hilbert import hilbert_keys_of_bounds
from streaming.kernels.key_hash import key_hashes
from streaming.write.data_files import DataFileRecord, FileSettings, GeoParquetWriter
from streaming.write.file_types import as_type, as_types
from streaming.write.merge import LastTaskMerge, hilbert_sorted, peers_if_last, range_count, write_sorted
from streaming.write.upsert import (
    OFFSET,
    PARTITION,
    TIMESTAMP,
    key_codes,
    keys_and_positions,
    latest_versions,
    write_equality_deletes,
)


class CurrentRows(Protocol):
    """The table's current rows of some keys: the key columns and `columns`, one row per key found."""

    def __call__(self, keys: pa.Table, columns: Sequence[str]) -> pa.Table: ...


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
    """A staged row: the columns the files hold, its Hilbert key, its Kafka position and the columns
    its event did not carry."""
    return pa.schema(
        [
            # Nullable: a row lacks what its event did not carry until the reducer fills it.
            *(f.with_nullable(True) for f in contract.arrow_schema),
            pa.field(HILBERT, pa.int64()),
            pa.field(PARTITION, pa.int32()),
            pa.field(OFFSET, pa.int64()),
            pa.field(TIMESTAMP, pa.int64()),
            pa.field(UNAVAILABLE, UNAVAILABLE_TYPE),
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
        table = as_types(table, schema)
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


def reduce_versions(
    slices: Sequence[VersionSlice], contract: Contract, io: FileIO, current: CurrentRows | None = None
) -> tuple[pa.Table, pa.Table, int]:
    """(each key's last version among the staged slices, unless deleted, in the files' columns and
    the Hilbert key; every key the slices hold, for the equality delete file; the rows left out for
    a geometry nobody holds)."""
    rows = _read(slices, False, version_schema(contract), io)
    deletes = _read(slices, True, deletes_schema(contract), io)
    rows = fill_unavailable(rows, deletes, contract)
    latest, touched = latest_versions(rows, deletes, contract.primary_key)
    latest, unplaced = fill_from_table(latest, contract, current)
    return latest.select([*contract.arrow_schema.names, HILBERT]), touched, unplaced


def fill_unavailable(rows: pa.Table, deletes: pa.Table, contract: Contract) -> pa.Table:
    """Each row's unavailable columns from the nearest earlier record of its key in its partition
    (by offset) that carried them, unless a delete of the key comes between; what no such record
    carries stays listed in UNAVAILABLE. The geometry brings its bbox and Hilbert key along."""
    if UNAVAILABLE not in rows.column_names or rows.column(UNAVAILABLE).null_count == rows.num_rows:
        return rows
    n = rows.num_rows
    positions = keys_and_positions(rows, deletes, contract.primary_key)
    code = key_codes(positions, contract.primary_key)
    partition = positions.column(PARTITION).to_numpy(zero_copy_only=False).astype(np.int64)
    offset = positions.column(OFFSET).to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.lexsort((offset, partition, code))
    m = len(order)
    at = np.arange(m)
    first_of_run = np.r_[True, (np.diff(code[order]) != 0) | (np.diff(partition[order]) != 0)]
    is_delete = order >= n
    # A record may take a value from a record after the latest delete of its key, within its run.
    floor = np.maximum(
        np.maximum.accumulate(np.where(first_of_run, at, 0)),
        np.maximum.accumulate(np.where(is_delete, at, -1)) + 1,
    )
    missing = _listed(rows.column(UNAVAILABLE).combine_chunks())
    still: dict[str, np.ndarray] = {}
    for name, missing_in_rows in missing.items():
        missing_here = np.zeros(m, dtype=bool)
        missing_here[~is_delete] = missing_in_rows[order[~is_delete]]
        nearest = np.maximum.accumulate(np.where(is_delete | missing_here, -1, at))
        filled = missing_here & (nearest >= floor)
        take = np.arange(n)
        take[order[filled]] = order[nearest[filled]]
        rows = _take_columns(rows, _carried_with(name, contract), take)
        left = missing_in_rows.copy()
        left[order[filled]] = False
        still[name] = left
    return rows.set_column(rows.schema.get_field_index(UNAVAILABLE), UNAVAILABLE, _as_lists(still, n))


def fill_from_table(latest: pa.Table, contract: Contract, current: CurrentRows | None) -> tuple[pa.Table, int]:
    """The last versions with what they still lack taken from the key's current row in the table;
    a row whose geometry the table does not hold either is left out. Returns the rows and how
    many were left out."""
    if UNAVAILABLE not in latest.column_names or latest.column(UNAVAILABLE).null_count == latest.num_rows:
        return latest, 0
    missing = _listed(latest.column(UNAVAILABLE).combine_chunks())
    wanting = np.logical_or.reduce(list(missing.values()))
    found = None
    if current is not None:
        keys = latest.select(list(contract.primary_key)).filter(pa.array(wanting))
        stored = set(contract.iceberg_schema.column_names)
        columns = sorted({c for name in missing for c in _carried_with(name, contract) if c in stored})
        found = current(keys, columns)
        if contract.geometry.name in found.column_names:
            # A table that stores no covering: it is computed again from the geometry read.
            found = with_covering(found, contract)
    geometry = contract.geometry.name
    place = _positions_in(latest, found, contract.primary_key) if found is not None else np.full(latest.num_rows, -1)
    for name, missing_in_rows in missing.items():
        filled = missing_in_rows & (place >= 0)
        if found is not None and filled.any():
            for column in _carried_with(name, contract):
                if column == HILBERT:
                    continue
                source = as_type(found.column(column).combine_chunks(), latest.schema.field(column).type)
                padded = pa.concat_arrays([latest.column(column).combine_chunks(), source])
                take = np.arange(latest.num_rows)
                take[filled] = latest.num_rows + place[filled]
                latest = latest.set_column(latest.schema.get_field_index(column), column, padded.take(pa.array(take)))
        if name == geometry:
            latest = _with_hilbert_keys(latest, contract, filled)
    # A row still without its geometry, or another column it cannot be written without, is left out.
    required = {geometry, *(c.name for c in contract.columns if c.required)}
    unplaced = np.zeros(latest.num_rows, dtype=bool)
    for name, missing_in_rows in missing.items():
        if name in required:
            unplaced |= missing_in_rows & (place < 0)
    return latest.filter(pa.array(~unplaced)), int(unplaced.sum())


def _positions_in(rows: pa.Table, found: pa.Table, key_columns: Sequence[str]) -> np.ndarray:
    """Per row of `rows`, the row of `found` with its key, or -1."""
    names = [f"k{i}" for i in range(len(key_columns))]
    left = pa.table(
        [*(rows.column(c) for c in key_columns), pa.array(np.arange(rows.num_rows, dtype=np.int64))],
        names=[*names, "row"],
    )
    right = pa.table(
        [
            *(found.column(c).cast(rows.schema.field(c).type) for c in key_columns),
            pa.array(np.arange(found.num_rows, dtype=np.int64)),
        ],
        names=[*names, "found"],
    )
    joined = left.join(right, keys=names, join_type="inner", use_threads=False)
    place = np.full(rows.num_rows, -1, dtype=np.int64)
    place[joined.column("row").to_numpy()] = joined.column("found").to_numpy()
    return place


def _carried_with(name: str, contract: Contract) -> list[str]:
    """The staged columns a column's value brings: a geometry its bbox and Hilbert key too."""
    return [name, contract.bbox_name, HILBERT] if name == contract.geometry.name else [name]


def _take_columns(rows: pa.Table, columns: Sequence[str], take: np.ndarray) -> pa.Table:
    indices = pa.array(take)
    for column in columns:
        rows = rows.set_column(rows.schema.get_field_index(column), column, rows.column(column).take(indices))
    return rows


def _with_hilbert_keys(rows: pa.Table, contract: Contract, where: np.ndarray) -> pa.Table:
    """The Hilbert keys of the rows at `where` computed again from their bbox."""
    if not where.any():
        return rows
    bbox = rows.column(contract.bbox_name).combine_chunks().filter(pa.array(where))
    xmin, ymin, xmax, ymax = (bbox.field(n).to_numpy(zero_copy_only=False) for n in ("xmin", "ymin", "xmax", "ymax"))
    keys = pc.fill_null(rows.column(HILBERT), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    keys[where] = hilbert_keys_of_bounds(
        xmin, ymin, xmax, ymax, contract.clustering.extent, contract.clustering.hilbert_bits
    )
    return rows.set_column(rows.schema.get_field_index(HILBERT), HILBERT, pa.array(keys, pa.int64()))


def _listed(lists: pa.Array) -> dict[str, np.ndarray]:
    """Per column name UNAVAILABLE holds anywhere, the rows that list it."""
    flat = lists.flatten()
    if len(flat) == 0:
        return {}
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    names = flat.to_numpy(zero_copy_only=False)
    out = {}
    for name in np.unique(names):
        rows = np.zeros(len(lists), dtype=bool)
        rows[parents[names == name]] = True
        out[str(name)] = rows
    return out


def _as_lists(listed: dict[str, np.ndarray], n: int) -> pa.Array:
    """The inverse of _listed: per row the names that list it, null for none."""
    names = sorted(listed)
    if not names:
        return pa.nulls(n, UNAVAILABLE_TYPE)
    table = np.stack([listed[name] for name in names], axis=1)
    counts = table.sum(axis=1)
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int32)
    values = pa.array(np.array(names, dtype=object)[np.nonzero(table)[1]], pa.string())
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(counts == 0))


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
    current: CurrentRows | None = None,
) -> tuple[list[DataFileRecord], int]:
    """The files of a reducer that writes them itself: the equality delete file of every key the
    slices hold, and the last versions sorted along the curve in `ranges` stretches; and the rows
    left out for a geometry nobody holds."""
    latest, touched, unplaced = reduce_versions(slices, contract, writer.io, current)
    records = delete_file(touched, contract, files, writer.io)
    ordered = pa.Table.from_batches(list(hilbert_sorted(latest)), schema=latest.schema)
    return records + write_sorted(ordered, ranges, writer, threads), unplaced


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
    current: CurrentRows | None = None,
) -> tuple[list[DataFileRecord], int, int] | None:
    """If every task of the stage has staged its versions and they are few enough, the whole
    batch's files (delete file included), the staged versions reduced and the rows left out; else
    None (the reduce job does it)."""
    peers = peers_if_last([s.to_json() for s in own], number, tasks, f"{staging.rstrip('/')}/done", writer.io)
    if peers is None:
        return None
    slices = [VersionSlice(*s) for peer in peers for s in peer]
    staged = sum(s.rows for s in slices)
    if staged > plan.max_rows:
        return None
    rows = sum(s.rows for s in slices if not s.deletes)
    ranges = range_count(rows, plan.min_ranges, plan.rows_per_range)
    records, unplaced = reduced_files(slices, contract, files, writer, ranges, plan.threads, current)
    return records, staged, unplaced


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
