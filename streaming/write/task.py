"""One input partition of a micro-batch in one pass (decode, dead letters, Hilbert sort), and the
merge of the sorted runs of all partitions into the batch's files.

`PartitionTask` runs on an executor over the Arrow batches Spark's Kafka source hands the Python
worker. Valid rows are kept (only the columns the files hold) until `rows_per_run` of them have
arrived, then sorted by Hilbert key: a task's memory is bounded by one run, whatever the batch
size. A sorted run is then either
  - written straight away as GeoParquet files of about the contract's target size, each a
    contiguous stretch of the curve (clustering "task": one pass, but the files of different tasks
    cover the same places), or
  - staged as an Arrow IPC file in slices of SLICE_ROWS rows, each slice reported with its first
    and last key (clustering "batch"). The driver cuts the key range of the whole batch into
    ranges of equal rows (`plan_merge`) and `MergeTask`s read just the slices of their range from
    every run, merge them and write the files: the batch ends up sorted along the curve as a
    whole, as a Spark range exchange would leave it, without rows ever going back to the JVM.
Either way a task returns only the few rows the driver needs: per (topic, partition, reject reason)
the offset range, count and oldest Kafka timestamp, and one row per file or slice written.

Pure Python over Arrow: no Spark import, so the benchmark's limit chain and the tests run exactly
this code.
"""

from __future__ import annotations

import gc
import json
import math
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO

from streaming.contract import Contract
from streaming.decode.decoder import (
    DELETE,
    HILBERT,
    REJECT_REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    DecodeOptions,
    Decoder,
    decoded_schema,
)
from streaming.decode.isolation import IsolatedDecoder
from streaming.decode.properties import PropertySeen, merge_seen
from streaming.storage import list_files
from streaming.write.data_files import DATA, EQUALITY_DELETES, RECORD_SCHEMA, DataFileRecord, GeoParquetWriter
from streaming.write.dead_letter import DeadLetterConfig, DeadLetterWriter
from streaming.write.freshness import EventTimes
from streaming.write.partitions import PartitionLayout
from streaming.write.rejects_table import REJECTS, RejectsTableFiles, RejectsWriter
from streaming.write.upsert import (
    OFFSET,
    PARTITION,
    TIMESTAMP,
    TOPIC,
    latest_versions,
    split_tombstones,
    write_equality_deletes,
)

TALLY = "tally"
FILE = "file"
SLICE = "slice"
PROPERTY = "property"
EVENT_TIMES = "event_times"
# Rows per slice of a staged run: the unit a merge task reads. Small enough that a merge range
# reads little beyond its own rows, large enough that a batch has few slices to plan.
SLICE_ROWS = 8192

# The rows a task returns, told apart by `kind`: a tally row (one per topic, partition and reject
# reason, null for the valid rows: topic .. oldest_ms), a file row (one per data file written: the
# DataFileRecord columns, and merged_by: the task whose merge of the whole batch wrote it) or a
# slice row (one per slice of a staged run: path, slice, key_lo, key_hi, n) or a property row (one per
# property name no column maps, in the decoder's sample: property, property_type, n, and the first
# record holding it: oldest_ms, partition, first) or an event-times row (one per bin of the Kafka
# timestamps of the valid records: first = the bin's first ms, last = its width in ms, n).
RESULT_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("reason", pa.string()),
        ("first", pa.int64()),
        ("last", pa.int64()),
        ("n", pa.int64()),
        ("oldest_ms", pa.int64()),
        *RECORD_SCHEMA,
        ("slice", pa.int32()),
        ("key_lo", pa.int64()),
        ("key_hi", pa.int64()),
        ("merged_by", pa.int32()),
        ("property", pa.string()),
        ("property_type", pa.string()),
    ]
)


@dataclass(frozen=True)
class Tally:
    """Records of one topic-partition that share a fate (a reject reason, or None: valid)."""

    topic: str
    partition: int
    reason: str | None
    first: int
    last: int
    n: int
    oldest_ms: int | None


@dataclass(frozen=True)
class Slice:
    """SLICE_ROWS (or fewer) rows of a staged run, in Hilbert order: keys key_lo .. key_hi."""

    path: str
    index: int  # the record batch of the Arrow IPC file
    key_lo: int
    key_hi: int
    rows: int


@dataclass(frozen=True)
class MergeRange:
    """The rows with key_lo <= Hilbert key < key_hi (None: no bound), and the slices holding them."""

    key_lo: int | None
    key_hi: int | None
    slices: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class LastTaskMerge:
    """How the last task of a batch merges it (clustering "batch", no merge job)."""

    # This task's number and the number of tasks of its stage (from Spark's task context)
    position: Callable[[], tuple[int, int]]
    min_ranges: int  # the key ranges to cut at least (the cores: as many files as a merge job writes)
    rows_per_range: int
    # A batch with more valid rows is left to the merge job, whose tasks spread over the executors
    max_rows: int
    # Ranges written at once. The batch's other tasks are done when the last one merges, so their
    # cores are idle: Parquet encoding and compression run in Arrow without the GIL.
    threads: int = 1


@dataclass(frozen=True)
class FileSettings:
    """Where and how a task writes its files (everything it needs of the table, no catalog)."""

    table_properties: dict[str, str]
    io_properties: dict[str, str]
    data_location: str
    file_prefix: str
    # The table's partition spec (None: unpartitioned)
    partition: PartitionLayout | None = None


@dataclass(frozen=True)
class PartitionTask:
    contract: Contract
    decode: DecodeOptions
    files: FileSettings
    dead_letter: DeadLetterConfig | None = None  # None: rejects are counted, not sent
    rows_per_run: int = 1_000_000
    # Decode in a child process, halving after a crash (a batch that crashed a worker: isolation.py)
    isolate_decoder: bool = False
    # A folder URI: stage sorted runs there for MergeTasks instead of writing files (clustering "batch")
    staging: str | None = None
    last_merge: LastTaskMerge | None = None  # with staging: the last task merges a small batch
    rejects: RejectsTableFiles | None = None  # None: no rejects table (setting rejects_table)

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The mapInArrow function: Kafka source batches in, tally and file (or slice) rows out."""
        prepare_worker_process()
        decoder = (
            IsolatedDecoder(self.contract, self.decode) if self.isolate_decoder else Decoder(self.contract, self.decode)
        )
        keep = [*self.contract.arrow_schema.names, HILBERT]
        writer = GeoParquetWriter(
            self.contract,
            self.files.table_properties,
            self.files.io_properties,
            self.files.data_location,
            self.files.file_prefix,
            self.files.partition,
        )
        upsert = self.contract.mode == "upsert"
        if upsert:
            # Versions of a key are chosen over the task's whole range, so the row order columns stay.
            keep += [SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TIMESTAMP]
        tombstones: list[pa.Table] = []
        delete_files: list[DataFileRecord] = []
        tallies: list[pa.Table] = []
        event_times = EventTimes()
        run: list[pa.RecordBatch] = []
        run_rows = 0
        records: list[DataFileRecord] = []
        slices: list[Slice] = []
        dead_letters: DeadLetterWriter | None = None
        rejects = RejectsWriter(self.rejects) if self.rejects is not None else None

        def flush(run: list[pa.RecordBatch]) -> None:
            if self.staging is None:
                records.extend(writer.write(hilbert_sorted(run)))
            else:
                slices.extend(stage_run(hilbert_sorted(run), self.staging, writer.io))

        try:
            for batch in batches:
                if upsert:
                    batch, deleted = split_tombstones(batch, self.contract)
                    if deleted.num_rows:
                        tombstones.append(deleted)
                        tallies.append(_tombstone_tally(deleted))
                if batch.num_rows == 0:
                    continue
                decoded = decoder.decode(batch)
                tallies.append(tally_table(decoded))
                rejected = decoded.column(REJECT_REASON).null_count < decoded.num_rows
                if rejected and self.dead_letter is not None:
                    dead_letters = dead_letters or DeadLetterWriter(self.dead_letter)
                    dead_letters.send(decoded)
                if rejected and rejects is not None:
                    rejects.add(decoded)
                valid = decoded.select(keep)
                deleting = decoded.column(DELETE)
                if upsert and pc.any(deleting).as_py():
                    # Deletes a format decoded (change events' deletes) go the way tombstones go.
                    tombstones.append(_decoded_deletes(decoded.filter(deleting), self.contract))
                    valid = valid.filter(pc.invert(deleting))
                    decoded = decoded.filter(pc.invert(deleting))
                if rejected:
                    valid = valid.filter(pc.is_null(decoded.column(REJECT_REASON)))
                micros = decoded.column(SOURCE_TIMESTAMP).cast(pa.int64())
                if rejected:
                    micros = micros.filter(pc.is_null(decoded.column(REJECT_REASON)))
                event_times.add(micros.to_numpy(zero_copy_only=False) // 1000)
                if valid.num_rows:
                    run.append(valid)
                    run_rows += valid.num_rows
                if run_rows >= self.rows_per_run and not upsert:
                    flush(run)
                    run, run_rows = [], 0
            if upsert:
                run, delete_files = self._latest_versions(run, tombstones, writer)
                run_rows = sum(b.num_rows for b in run)
            if run_rows:
                flush(run)
            reject_files = rejects.write() if rejects is not None else []
        finally:
            if dead_letters is not None:
                dead_letters.close()
            if isinstance(decoder, IsolatedDecoder):
                decoder.close()
        merged_by = None
        if self.staging is not None and self.last_merge is not None:
            number, tasks = self.last_merge.position()
            merged = merge_if_last(slices, number, tasks, self.staging, self.last_merge, writer)
            if merged is not None:
                records, merged_by = merged, number
        unmapped = decoder.unmapped if isinstance(decoder, Decoder) else {}
        yield results_batch(
            merge_tallies(tallies),
            records + delete_files + reject_files,
            slices,
            merged_by,
            unmapped,
            event_times.bins(),
        )

    def _latest_versions(
        self, run: list[pa.RecordBatch], tombstones: list[pa.Table], writer: GeoParquetWriter
    ) -> tuple[list[pa.RecordBatch], list[DataFileRecord]]:
        """The task's rows reduced to each key's last version, and the equality delete file of
        every key it touched (streaming/write/upsert.py). The whole range at once: an upsert task holds
        its rows until the end (memory bounded by the batch's maxOffsetsPerTrigger share)."""
        schema = pa.schema([*self.contract.arrow_schema, pa.field(HILBERT, pa.int64())])
        # A task whose records all delete (tombstones, change events' deletes) has no rows at all.
        kept = decoded_schema(self.contract)
        empty = pa.schema([*schema, *(kept.field(n) for n in (SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TIMESTAMP))])
        rows = pa.Table.from_batches(run) if run else empty.empty_table()
        ordered = rows.append_column(PARTITION, rows.column(SOURCE_PARTITION))
        ordered = ordered.append_column(OFFSET, rows.column(SOURCE_OFFSET))
        ordered = ordered.append_column(TIMESTAMP, rows.column(SOURCE_TIMESTAMP).cast(pa.int64()))
        deleted = (
            pa.concat_tables(tombstones).select([*self.contract.primary_key, PARTITION, OFFSET, TIMESTAMP])
            if tombstones
            else pa.table({})
        )
        latest, touched = latest_versions(ordered, deleted, self.contract.primary_key)
        deletes = []
        if touched.num_rows:
            deletes.append(
                write_equality_deletes(
                    touched,
                    self.contract,
                    writer.io,
                    self.files.table_properties,
                    self.files.data_location,
                    self.files.file_prefix,
                )
            )
        latest = latest.select(schema.names)
        return latest.to_batches(), deletes


@dataclass(frozen=True)
class MergeTask:
    """The mapInArrow function of the merge pass: range numbers in (one task per range), the files
    of those ranges out."""

    contract: Contract
    files: FileSettings
    ranges: tuple[MergeRange, ...]

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare_worker_process()
        writer = GeoParquetWriter(
            self.contract,
            self.files.table_properties,
            self.files.io_properties,
            self.files.data_location,
            self.files.file_prefix,
            self.files.partition,
        )
        records: list[DataFileRecord] = []
        for batch in batches:
            records += write_ranges((self.ranges[number] for number in batch.column(0).to_pylist()), writer)
        yield results_batch([], records)


_worker_prepared = False


def prepare_worker_process() -> None:
    """Once per worker process, at its first task:
    - leave the objects its imports made (100k+: pyarrow, shapely, pyiceberg, pydantic) out of
      Python's full garbage collections. A batch makes tens of thousands of geometry objects, each
      full collection then walked all of them again: measured, 12-34 % of a task's CPU. Only
      garbage cycles already there when the worker starts are never collected; later ones are.
    - allocate Arrow buffers with the C library's malloc rather than Arrow's bundled mimalloc,
      unless ARROW_DEFAULT_MEMORY_POOL names a pool. mimalloc asks the kernel for transparent huge
      pages over its arena and hands freed pages back in pieces, so a batch's fresh buffers keep
      faulting in 2 MiB pages to be zeroed: measured on 200k polygons, a task spends 10-15 % less
      time with malloc, and merging 400k rows 0.34-0.40 s instead of 0.48-0.58 s."""
    global _worker_prepared
    if not _worker_prepared:
        gc.collect()
        gc.freeze()
        if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
            pa.set_memory_pool(pa.system_memory_pool())
        _worker_prepared = True


def tally_table(decoded: pa.RecordBatch) -> pa.Table:
    """Offset range, count and oldest timestamp per (topic, partition, reason) of a decoded batch."""
    table = pa.table(
        {
            "topic": decoded.column(SOURCE_TOPIC),
            "partition": decoded.column(SOURCE_PARTITION),
            "reason": decoded.column(REJECT_REASON),
            "offset": decoded.column(SOURCE_OFFSET),
            "timestamp": decoded.column(SOURCE_TIMESTAMP).cast(pa.int64()),
        }
    )
    grouped = table.group_by(["topic", "partition", "reason"], use_threads=False).aggregate(
        [("offset", "min"), ("offset", "max"), ("offset", "count"), ("timestamp", "min")]
    )
    return pa.table(
        {
            "topic": grouped.column("topic"),
            "partition": grouped.column("partition"),
            "reason": grouped.column("reason"),
            "first": grouped.column("offset_min"),
            "last": grouped.column("offset_max"),
            "n": grouped.column("offset_count"),
            # microseconds (Spark's timestamp unit) to the milliseconds Kafka speaks
            "oldest_ms": pc.divide(grouped.column("timestamp_min"), 1000),
        }
    )


def _decoded_deletes(deletes: pa.RecordBatch, contract: Contract) -> pa.Table:
    """The decoder's delete rows as tombstones are kept: the key columns and the Kafka position."""
    return pa.table(
        {
            **{name: deletes.column(name) for name in contract.primary_key},
            TOPIC: deletes.column(SOURCE_TOPIC),
            PARTITION: deletes.column(SOURCE_PARTITION),
            OFFSET: deletes.column(SOURCE_OFFSET),
            TIMESTAMP: deletes.column(SOURCE_TIMESTAMP).cast(pa.int64()),
        }
    )


def _tombstone_tally(tombstones: pa.Table) -> pa.Table:
    """Tombstones applied in upsert mode count as valid records of their partitions (their offsets
    are consumed and recorded like any other's)."""
    return tally_table(
        pa.RecordBatch.from_pydict(
            {
                SOURCE_TOPIC: tombstones.column(TOPIC).combine_chunks(),
                SOURCE_PARTITION: tombstones.column(PARTITION).combine_chunks(),
                REJECT_REASON: pa.nulls(tombstones.num_rows, pa.string()),
                SOURCE_OFFSET: tombstones.column(OFFSET).combine_chunks(),
                SOURCE_TIMESTAMP: tombstones.column(TIMESTAMP).combine_chunks(),
            }
        )
    )


def merge_tallies(tables: list[pa.Table]) -> list[Tally]:
    if not tables:
        return []
    grouped = (
        pa.concat_tables(tables)
        .group_by(["topic", "partition", "reason"], use_threads=False)
        .aggregate([("first", "min"), ("last", "max"), ("n", "sum"), ("oldest_ms", "min")])
    )
    return [
        Tally(r["topic"], r["partition"], r["reason"], r["first_min"], r["last_max"], r["n_sum"], r["oldest_ms_min"])
        for r in grouped.to_pylist()
    ]


def hilbert_sorted(run: list[pa.RecordBatch] | pa.Table) -> Iterator[pa.RecordBatch]:
    """The rows of a run in Hilbert key order (stable: equal keys keep their arrival order)."""
    table = run if isinstance(run, pa.Table) else pa.Table.from_batches(run)
    order = np.argsort(table.column(HILBERT).to_numpy(), kind="stable")
    return iter(table.take(pa.array(order)).to_batches())


def stage_run(sorted_batches: Iterator[pa.RecordBatch], staging: str, io: FileIO) -> list[Slice]:
    """A sorted run as one Arrow IPC file of SLICE_ROWS-row record batches under `staging`."""
    table = pa.Table.from_batches(list(sorted_batches))
    path = f"{staging.rstrip('/')}/{uuid.uuid4().hex}.arrow"
    slices = []
    # A fresh name: no need to ask the store first whether it exists (a HEAD and a LIST on S3).
    with io.new_output(path).create(overwrite=True) as out, pa.ipc.new_file(out, table.schema) as ipc:
        for index, batch in enumerate(table.to_batches(max_chunksize=SLICE_ROWS)):
            ipc.write_batch(batch)
            keys = batch.column(HILBERT)
            slices.append(Slice(path, index, keys[0].as_py(), keys[-1].as_py(), batch.num_rows))
    return slices


def range_count(rows: int, min_ranges: int, rows_per_range: int) -> int:
    """How many key ranges (files, at least) a batch of `rows` valid rows is merged into."""
    return max(min_ranges, math.ceil(rows / rows_per_range))


def plan_merge(slices: list[Slice], ranges: int) -> list[MergeRange]:
    """Cut the batch's keys into `ranges` stretches of about equal rows (fewer where keys repeat),
    and name the slices each must read. A slice's rows count as spread around the middle of its
    key span: a range is then off its share by at most a slice per run; a row is in one range."""
    if not slices:
        return []
    middle = np.array([(s.key_lo + s.key_hi) / 2 for s in slices])
    rows = np.array([s.rows for s in slices], dtype=np.float64)
    order = np.argsort(middle, kind="stable")
    # rows below each slice's middle, interpolated in between
    below = np.cumsum(rows[order]) - rows[order] / 2
    targets = rows.sum() * np.arange(1, ranges) / ranges
    cuts = sorted({math.ceil(key) for key in np.interp(targets, below, middle[order])})
    bounds = [None, *cuts, None]
    plan = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        needed = tuple(
            (s.path, s.index) for s in slices if (lo is None or s.key_hi >= lo) and (hi is None or s.key_lo < hi)
        )
        if needed:
            plan.append(MergeRange(lo, hi, needed))
    return plan


def write_ranges(ranges: Iterable[MergeRange], writer: GeoParquetWriter, threads: int = 1) -> list[DataFileRecord]:
    """The files of merge ranges, each range's rows merged from their staged slices, `threads`
    ranges at a time (in range order either way)."""

    def write(merge: MergeRange) -> list[DataFileRecord]:
        rows = merged_range(merge, writer.io)
        return list(writer.write(iter(rows.to_batches()))) if rows.num_rows else []

    ranges = list(ranges)
    if threads <= 1 or len(ranges) <= 1:
        return [record for merge in ranges for record in write(merge)]
    with ThreadPoolExecutor(min(threads, len(ranges)), thread_name_prefix="merge-range") as pool:
        return [record for files in pool.map(write, ranges) for record in files]


def merged_range(merge: MergeRange, io: FileIO) -> pa.Table:
    """The rows of a merge range from the staged slices, in Hilbert order."""
    by_path: dict[str, list[int]] = {}
    for path, index in merge.slices:
        by_path.setdefault(path, []).append(index)
    parts = []
    schema = None
    for path, indices in by_path.items():
        with io.new_input(path).open(seekable=True) as f:
            reader = pa.ipc.open_file(f)
            schema = reader.schema
            for index in indices:
                batch = reader.get_batch(index)
                # a slice is sorted: its rows in the range are one stretch, taken without a copy
                keys = batch.column(HILBERT).to_numpy()
                start = 0 if merge.key_lo is None else int(np.searchsorted(keys, merge.key_lo, side="left"))
                stop = len(keys) if merge.key_hi is None else int(np.searchsorted(keys, merge.key_hi, side="left"))
                if stop > start:
                    parts.append(batch.slice(start, stop - start))
    table = pa.Table.from_batches(parts, schema=schema)
    return table.take(pa.array(np.argsort(table.column(HILBERT).to_numpy(), kind="stable")))


def merge_if_last(
    own: list[Slice], number: int, tasks: int, staging: str, plan: LastTaskMerge, writer: GeoParquetWriter
) -> list[DataFileRecord] | None:
    """Leave this task's slices in a marker; if every task of the stage has left one and the batch
    is small, merge the whole batch and return its files, else None (the merge job does it).
    The last marker written is complete when its task lists the others, so at least one task
    merges; two that finish together may both do: the driver keeps one set (a retried task
    rewrites its own marker, and any attempt's run holds the same rows)."""
    markers = f"{staging.rstrip('/')}/done"
    with writer.io.new_output(f"{markers}/{number:06d}.json").create(overwrite=True) as out:
        out.write(json.dumps([[s.path, s.index, s.key_lo, s.key_hi, s.rows] for s in own]).encode())
    peers = []
    for path in files_under(markers, writer.io):
        try:
            with writer.io.new_input(path).open() as f:
                peers.append(json.loads(f.read()))
        except (OSError, ValueError):  # a peer still writing its marker: that peer comes last
            return None
    if len(peers) < tasks:
        return None
    slices = [Slice(*s) for peer in peers for s in peer]
    rows = sum(s.rows for s in slices)
    if rows > plan.max_rows:
        return None
    return write_ranges(
        plan_merge(slices, range_count(rows, plan.min_ranges, plan.rows_per_range)), writer, plan.threads
    )


def files_under(location: str, io: FileIO) -> list[str]:
    """The URIs of the files below a folder, recursively, through the table's FileIO."""
    return [stored.uri for stored in list_files(io, location)]


def results_batch(
    tallies: list[Tally],
    records: list[DataFileRecord],
    slices: Sequence[Slice] = (),
    merged_by: int | None = None,
    unmapped: dict[str, PropertySeen] | None = None,
    event_times: Sequence[tuple[int, int, int]] = (),
) -> pa.RecordBatch:
    rows = [
        {
            "kind": TALLY,
            "topic": t.topic,
            "partition": t.partition,
            "reason": t.reason,
            "first": t.first,
            "last": t.last,
            "n": t.n,
            "oldest_ms": t.oldest_ms,
        }
        for t in tallies
    ]
    # A delete file or a rejects table's file is its task's own, never part of a merge of the whole batch.
    rows += [{"kind": FILE, **r.to_row(), "merged_by": None if r.content != DATA else merged_by} for r in records]
    rows += [
        {"kind": SLICE, "path": s.path, "slice": s.index, "key_lo": s.key_lo, "key_hi": s.key_hi, "n": s.rows}
        for s in slices
    ]
    rows += [
        {
            "kind": PROPERTY,
            "property": name,
            "property_type": seen.type,
            "n": seen.count,
            "oldest_ms": seen.first[0],
            "partition": seen.first[1],
            "first": seen.first[2],
        }
        for name, seen in (unmapped or {}).items()
    ]
    rows += [{"kind": EVENT_TIMES, "first": start, "last": width, "n": n} for start, width, n in event_times]
    return pa.RecordBatch.from_pylist(rows, schema=RESULT_SCHEMA)


@dataclass
class BatchResults:
    """What the driver collected of a micro-batch: tallies and files of all its tasks."""

    tallies: list[Tally] = field(default_factory=list)
    files: list[DataFileRecord] = field(default_factory=list)
    slices: list[Slice] = field(default_factory=list)
    # The files of each task that merged the whole batch (LastTaskMerge), by task number
    merged: dict[int, list[DataFileRecord]] = field(default_factory=dict)
    # Upsert tables: the equality delete files of the keys each task touched
    delete_files: list[DataFileRecord] = field(default_factory=list)
    # The rejects table's files (setting rejects_table)
    reject_files: list[DataFileRecord] = field(default_factory=list)
    # Property names no column maps, in the decoders' samples
    unmapped: dict[str, PropertySeen] = field(default_factory=dict)
    # Kafka timestamps of the valid records, binned: (first ms, width ms, records)
    event_times: list[tuple[int, int, int]] = field(default_factory=list)

    @classmethod
    def from_rows(cls, rows: Iterable) -> BatchResults:
        out = cls()
        for row in rows:
            if row["kind"] == TALLY:
                out.tallies.append(
                    Tally(
                        row["topic"],
                        row["partition"],
                        row["reason"],
                        row["first"],
                        row["last"],
                        row["n"],
                        row["oldest_ms"],
                    )
                )
            elif row["kind"] == EVENT_TIMES:
                out.event_times.append((row["first"], row["last"], row["n"]))
            elif row["kind"] == PROPERTY:
                seen = PropertySeen(row["property_type"], row["n"], (row["oldest_ms"], row["partition"], row["first"]))
                merge_seen(out.unmapped, {row["property"]: seen})
            elif row["kind"] == SLICE:
                out.slices.append(Slice(row["path"], row["slice"], row["key_lo"], row["key_hi"], row["n"]))
            elif row["content"] == EQUALITY_DELETES:
                out.delete_files.append(DataFileRecord.from_row(row))
            elif row["content"] == REJECTS:
                out.reject_files.append(DataFileRecord.from_row(row))
            elif row["merged_by"] is not None:
                out.merged.setdefault(row["merged_by"], []).append(DataFileRecord.from_row(row))
            else:
                out.files.append(DataFileRecord.from_row(row))
        return out
