"""One input partition of a micro-batch in one pass (decode, dead letters, Hilbert sort), and the
Spark task functions that finish a batch from what those passes staged.

`PartitionTask` runs on an executor over the Arrow batches Spark's Kafka source hands the Python
worker. Valid rows are kept (only the columns the files hold) until `rows_per_run` of them have
arrived, then sorted by Hilbert key: a task's memory is bounded by one run, whatever the batch
size. A sorted run is then either
  - written straight away as GeoParquet files of about the contract's target size, each a
    contiguous stretch of the curve (clustering "task": one pass, but the files of different tasks
    cover the same places), or
  - staged for a merge across the whole batch (clustering "batch", streaming/write/merge.py):
    `MergeTask`s, or the last task of a small batch, write the files.
An upsert table's task keeps its whole range instead, and stages the last record of each (key,
partition) by key bucket (streaming/write/versions.py): `ReduceTask`s, or the last task of a small
batch, bring every version of a key together and write its last, then the rows go on as above.
Whichever way, a task returns only the few rows the driver needs: per (topic, partition, reject
reason) the offset range, count and oldest Kafka timestamp, and one row per file or slice written.

Pure Python over Arrow: no Spark import, so the benchmark's limit chain and the tests run exactly
this code.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from streaming.contract import Contract
from streaming.decode.decoder import (
    DELETE,
    HILBERT,
    REJECT_REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    UNAVAILABLE,
    DecodeOptions,
    Decoder,
)
from streaming.decode.isolation import IsolatedDecoder
from streaming.decode.properties import PropertySeen, merge_seen
from streaming.write.data_files import DATA, EQUALITY_DELETES, RECORD_SCHEMA, DataFileRecord, FileSettings
from streaming.write.dead_letter import DeadLetterConfig, DeadLetterWriter
from streaming.write.freshness import EventTimes
from streaming.write.merge import (
    LastTaskMerge,
    MergeRange,
    Slice,
    hilbert_sorted,
    merge_if_last,
    stage_run,
    write_ranges,
)
from streaming.write.rejects_table import REJECTS, RejectsTableFiles, RejectsWriter
from streaming.write.upsert import (
    OFFSET,
    PARTITION,
    TIMESTAMP,
    TOPIC,
    last_per_partition,
    split_tombstones,
)
from streaming.write.versions import (
    CurrentRows,
    VersionSlice,
    delete_file,
    fill_unavailable,
    reduce_if_last,
    reduce_versions,
    stage_versions,
    version_schema,
)

TALLY = "tally"
FILE = "file"
SLICE = "slice"
VERSIONS = "versions"
MERGED = "merged"
UNPLACED = "unplaced"
PROPERTY = "property"
EVENT_TIMES = "event_times"

# The rows a task returns, told apart by `kind`:
# - tally: one per topic, partition and reject reason (null for the valid rows): topic .. oldest_ms;
# - file: one per file written: the DataFileRecord columns, and merged_by: the task whose merge or
#   reduce of the whole batch wrote it (its other files, a rejects table's, are its own);
# - slice: one per slice of a staged run: path, slice, key_lo, key_hi, n;
# - versions: one per key bucket of an upsert task's staged versions: path, slice, key_lo (the
#   bucket), n, content (data: rows; equality_deletes: deletes);
# - merged: one per task that merged or reduced the whole batch: merged_by, n (the staged rows it
#   read), last (the rows it left out: an upsert row whose geometry no record and no table row holds);
# - unplaced: one per reduce task that left rows out so: n;
# - property: one per property name no column maps, in the decoder's sample: property,
#   property_type, n, and the first record holding it: oldest_ms, partition, first;
# - event_times: one per bin of the Kafka timestamps of the valid records: first = the bin's
#   first ms, last = its width in ms, n.
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
class Merged:
    """The files of a task that merged (or reduced) the whole batch, the staged rows it read, and
    the rows it left out (an upsert row whose geometry no record and no table row holds)."""

    task: int
    files: list[DataFileRecord]
    staged_rows: int
    unplaced: int = 0


@dataclass(frozen=True)
class PartitionTask:
    contract: Contract
    decode: DecodeOptions
    files: FileSettings
    dead_letter: DeadLetterConfig | None = None  # None: rejects are counted, not sent
    rows_per_run: int = 1_000_000
    # Decode in a child process, halving after a crash (a batch that crashed a worker: isolation.py)
    isolate_decoder: bool = False
    # A folder URI: stage sorted runs there for MergeTasks instead of writing files (clustering
    # "batch"), and an upsert table's versions for ReduceTasks (either clustering)
    staging: str | None = None
    last_merge: LastTaskMerge | None = None  # with staging: the last task merges a small batch
    rejects: RejectsTableFiles | None = None  # None: no rejects table (setting rejects_table)
    # Upsert tables: the key's current row, for the values a change event did not carry
    current: CurrentRows | None = None

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The mapInArrow function: Kafka source batches in, tally and file (or slice) rows out."""
        prepare_worker_process()
        decoder = (
            IsolatedDecoder(self.contract, self.decode) if self.isolate_decoder else Decoder(self.contract, self.decode)
        )
        keep = [*self.contract.arrow_schema.names, HILBERT]
        writer = self.files.writer(self.contract)
        upsert = self.contract.mode == "upsert"
        if upsert:
            if self.staging is None:
                raise ValueError(f"table {self.contract.table}: an upsert batch stages its versions; no staging folder")
            # Versions of a key are chosen over the task's whole range, so the row order columns stay.
            # ... and so do the columns a change event did not carry, filled from the key's earlier versions.
            keep += [SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TIMESTAMP, UNAVAILABLE]
        tombstones: list[pa.Table] = []
        tallies: list[pa.Table] = []
        event_times = EventTimes()
        run: list[pa.RecordBatch] = []
        run_rows = 0
        records: list[DataFileRecord] = []
        slices: list[Slice] = []
        versions: list[VersionSlice] = []
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
                assert self.staging is not None
                versions = self._stage_versions(run, tombstones, writer.io, self.staging)
            elif run_rows:
                flush(run)
            reject_files = rejects.write() if rejects is not None else []
        finally:
            if dead_letters is not None:
                dead_letters.close()
            if isinstance(decoder, IsolatedDecoder):
                decoder.close()
        merged = None
        if self.staging is not None and self.last_merge is not None:
            number, tasks = self.last_merge.position()
            done: tuple[list[DataFileRecord], int] | tuple[list[DataFileRecord], int, int] | None
            if upsert:
                done = reduce_if_last(
                    versions,
                    number,
                    tasks,
                    self.staging,
                    self.last_merge,
                    self.contract,
                    self.files,
                    writer,
                    self.current,
                )
            else:
                done = merge_if_last(slices, number, tasks, self.staging, self.last_merge, writer)
            if done is not None:
                merged = Merged(number, *done)
        unmapped = decoder.unmapped if isinstance(decoder, Decoder) else {}
        yield results_batch(
            merge_tallies(tallies),
            records + reject_files,
            slices,
            merged,
            unmapped,
            event_times.bins(),
            versions,
        )

    def _stage_versions(
        self, run: list[pa.RecordBatch], tombstones: list[pa.Table], io, staging: str
    ) -> list[VersionSlice]:
        """The task's rows and deletes reduced to the last record of each (key, partition), staged
        by key bucket (streaming/write/versions.py). The whole range at once: an upsert task holds
        its rows until the end (memory bounded by the batch's maxOffsetsPerTrigger share)."""
        schema = version_schema(self.contract)
        if run:
            rows = pa.Table.from_batches(run)
            rows = rows.append_column(PARTITION, rows.column(SOURCE_PARTITION))
            rows = rows.append_column(OFFSET, rows.column(SOURCE_OFFSET))
            rows = rows.append_column(TIMESTAMP, rows.column(SOURCE_TIMESTAMP).cast(pa.int64()))
            rows = rows.select(schema.names)
        else:
            rows = schema.empty_table()
        key = list(self.contract.primary_key)
        deleted = (
            pa.concat_tables(tombstones).select([*key, PARTITION, OFFSET, TIMESTAMP]) if tombstones else pa.table({})
        )
        rows = fill_unavailable(rows, deleted, self.contract)
        rows, deleted = last_per_partition(rows, deleted, self.contract.primary_key)
        return stage_versions(rows, deleted, self.contract, staging, io)


@dataclass(frozen=True)
class MergeTask:
    """The mapInArrow function of the merge pass: range numbers in (one task per range), the files
    of those ranges out."""

    contract: Contract
    files: FileSettings
    ranges: tuple[MergeRange, ...]

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare_worker_process()
        writer = self.files.writer(self.contract)
        records: list[DataFileRecord] = []
        for batch in batches:
            records += write_ranges((self.ranges[number] for number in batch.column(0).to_pylist()), writer)
        yield results_batch([], records)


@dataclass(frozen=True)
class ReduceTask:
    """The mapInArrow function of an upsert batch's reduce pass: group numbers in (one task per
    group of key buckets), each key's last version out: written as files (clustering "task"), or
    staged as a sorted run for the merge (clustering "batch"), with the equality delete file of
    every key of the group."""

    contract: Contract
    files: FileSettings
    groups: tuple[tuple[VersionSlice, ...], ...]
    staging: str | None = None  # clustering "batch": where the sorted runs go
    last_merge: LastTaskMerge | None = None  # with staging: the last task merges a small batch
    current: CurrentRows | None = None  # the key's current row, for what a change event did not carry

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare_worker_process()
        writer = self.files.writer(self.contract)
        records: list[DataFileRecord] = []
        slices: list[Slice] = []
        unplaced = 0
        for batch in batches:
            for number in batch.column(0).to_pylist():
                latest, touched, left_out = reduce_versions(self.groups[number], self.contract, writer.io, self.current)
                unplaced += left_out
                records += delete_file(touched, self.contract, self.files, writer.io)
                if self.staging is None:
                    records += writer.write(hilbert_sorted(latest))
                elif latest.num_rows:
                    slices += stage_run(hilbert_sorted(latest), self.staging, writer.io)
        merged = None
        if self.staging is not None and self.last_merge is not None:
            number, tasks = self.last_merge.position()
            done = merge_if_last(slices, number, tasks, self.staging, self.last_merge, writer)
            if done is not None:
                merged = Merged(number, *done)
        yield results_batch([], records, slices, merged, unplaced=unplaced)


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


def results_batch(
    tallies: list[Tally],
    records: list[DataFileRecord],
    slices: Sequence[Slice] = (),
    merged: Merged | None = None,
    unmapped: dict[str, PropertySeen] | None = None,
    event_times: Sequence[tuple[int, int, int]] = (),
    versions: Sequence[VersionSlice] = (),
    unplaced: int = 0,
) -> pa.RecordBatch:
    """A task's result rows (RESULT_SCHEMA): `records` are its own files, `merged` the files of its
    merge of the whole batch, if it did one."""
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
    rows += [{"kind": FILE, **r.to_row()} for r in records]
    if merged is not None:
        rows += [{"kind": FILE, **r.to_row(), "merged_by": merged.task} for r in merged.files]
        rows.append({"kind": MERGED, "merged_by": merged.task, "n": merged.staged_rows, "last": merged.unplaced})
    if unplaced:
        rows.append({"kind": UNPLACED, "n": unplaced})
    rows += [
        {"kind": SLICE, "path": s.path, "slice": s.index, "key_lo": s.key_lo, "key_hi": s.key_hi, "n": s.rows}
        for s in slices
    ]
    rows += [
        {
            "kind": VERSIONS,
            "path": v.path,
            "slice": v.index,
            "key_lo": v.bucket,
            "n": v.rows,
            "content": EQUALITY_DELETES if v.deletes else DATA,
        }
        for v in versions
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
    # Upsert tables: the versions each task staged by key bucket
    versions: list[VersionSlice] = field(default_factory=list)
    # The files of each task that merged (or reduced) the whole batch, by task number
    merged: dict[int, list[DataFileRecord]] = field(default_factory=dict)
    # ... and the staged rows each of them read: a merge is whole when it read all the stage staged
    merged_inputs: dict[int, int] = field(default_factory=dict)
    # ... and the rows each of them left out (upsert rows whose geometry nothing holds)
    merged_unplaced: dict[int, int] = field(default_factory=dict)
    # The rows reduce tasks left out so
    unplaced: int = 0
    # Upsert tables: the equality delete files of the keys the batch touched
    delete_files: list[DataFileRecord] = field(default_factory=list)
    # The rejects table's files (setting rejects_table)
    reject_files: list[DataFileRecord] = field(default_factory=list)
    # Property names no column maps, in the decoders' samples
    unmapped: dict[str, PropertySeen] = field(default_factory=dict)
    # Kafka timestamps of the valid records, binned: (first ms, width ms, records)
    event_times: list[tuple[int, int, int]] = field(default_factory=list)

    def take_files(self, files: Iterable[DataFileRecord]) -> None:
        """Data and delete files of the batch (a merge's or a reducer's), each to its list."""
        for record in files:
            (self.delete_files if record.content == EQUALITY_DELETES else self.files).append(record)

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
            elif row["kind"] == VERSIONS:
                out.versions.append(
                    VersionSlice(row["path"], row["slice"], row["key_lo"], row["n"], row["content"] == EQUALITY_DELETES)
                )
            elif row["kind"] == MERGED:
                out.merged_inputs[row["merged_by"]] = row["n"]
                out.merged_unplaced[row["merged_by"]] = row["last"] or 0
            elif row["kind"] == UNPLACED:
                out.unplaced += row["n"]
            elif row["merged_by"] is not None:
                out.merged.setdefault(row["merged_by"], []).append(DataFileRecord.from_row(row))
            elif row["content"] == REJECTS:
                out.reject_files.append(DataFileRecord.from_row(row))
            else:
                out.take_files([DataFileRecord.from_row(row)])
        return out
