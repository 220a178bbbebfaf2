"""Staged runs and their merge: how the tasks of a batch leave their Hilbert-sorted rows for a
merge across the whole batch (clustering "batch"), and how that merge cuts the batch's key range
into ranges of equal rows and writes each range's files.

A sorted run is staged as an Arrow IPC file in slices of SLICE_ROWS rows, each slice reported with
its first and last key. The driver cuts the key range of the whole batch into ranges of equal rows
(`plan_merge`) and merge tasks read just the slices of their range from every run, merge them and
write the files: the batch ends up sorted along the curve as a whole, as a Spark range exchange
would leave it, without rows going back to the JVM. A small batch is merged by the last task of
its stage instead (`merge_if_last`): each task leaves a marker naming what it staged, and the task
that finds every marker merges.

Pure Python over Arrow and the table's FileIO: no Spark import.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO

from streaming.decode.decoder import HILBERT
from streaming.storage import list_files
from streaming.write.data_files import DataFileRecord, GeoParquetWriter

# Rows per slice of a staged run: the unit a merge task reads. Small enough that a merge range
# reads little beyond its own rows, large enough that a batch has few slices to plan.
SLICE_ROWS = 8192


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


def peers_if_last(own: list, number: int, tasks: int, markers: str, io: FileIO) -> list[list] | None:
    """Leave this task's items (a JSON list) in a marker under `markers`; the items of every task of
    the stage once each has left its marker, else None.

    The last marker written is complete when its task lists the others, so at least one task finds
    them all; two that finish together may both do (the driver keeps the work of one: a retried
    task rewrites its own marker, and any attempt's run holds the same rows)."""
    with io.new_output(f"{markers}/{number:06d}.json").create(overwrite=True) as out:
        out.write(json.dumps(own).encode())
    peers = []
    for path in files_under(markers, io):
        try:
            with io.new_input(path).open() as f:
                peers.append(json.loads(f.read()))
        except (OSError, ValueError):  # a peer still writing its marker: that peer comes last
            return None
    return peers if len(peers) >= tasks else None


def merge_if_last(
    own: list[Slice], number: int, tasks: int, staging: str, plan: LastTaskMerge, writer: GeoParquetWriter
) -> tuple[list[DataFileRecord], int] | None:
    """If every task of the stage has staged its runs and the batch is small, the files of the whole
    batch merged, and the rows merged; else None (the merge job does it)."""
    peers = peers_if_last(
        [[s.path, s.index, s.key_lo, s.key_hi, s.rows] for s in own],
        number,
        tasks,
        f"{staging.rstrip('/')}/done",
        writer.io,
    )
    if peers is None:
        return None
    slices = [Slice(*s) for peer in peers for s in peer]
    rows = sum(s.rows for s in slices)
    if rows > plan.max_rows:
        return None
    ranges = plan_merge(slices, range_count(rows, plan.min_ranges, plan.rows_per_range))
    return write_ranges(ranges, writer, plan.threads), rows


def write_sorted(rows: pa.Table, ranges: int, writer: GeoParquetWriter, threads: int = 1) -> list[DataFileRecord]:
    """Rows in Hilbert order cut into `ranges` stretches of about equal rows, each written as its own
    files, `threads` stretches at a time (in stretch order either way)."""
    step = max(1, math.ceil(rows.num_rows / max(1, ranges)))
    stretches = [rows.slice(start, step) for start in range(0, rows.num_rows, step)]

    def write(stretch: pa.Table) -> list[DataFileRecord]:
        return list(writer.write(iter(stretch.to_batches())))

    if threads <= 1 or len(stretches) <= 1:
        return [record for stretch in stretches for record in write(stretch)]
    with ThreadPoolExecutor(min(threads, len(stretches)), thread_name_prefix="write-stretch") as pool:
        return [record for files in pool.map(write, stretches) for record in files]


def files_under(location: str, io: FileIO) -> list[str]:
    """The URIs of the files below a folder, recursively, through the table's FileIO."""
    return [stored.uri for stored in list_files(io, location)]
