"""Compaction along the Hilbert curve: the small files of each bin rewritten as one sorted run,
with an upsert table's equality deletes applied, committed as one replace on a fresh table.

A bin holds files of one partition of one spec only (streaming/maintenance/plan.py), and its new
files take that spec and partition: a compacted file of a day partition spans that day, however
many batches it merges. Only files of the table's current spec are compacted: pyiceberg 0.12
writes every file a snapshot adds into a manifest of the current spec, so a file of an older spec
could not keep its spec through a rewrite. Files written before a partition evolution stay as they
are (they are old, so mostly compacted already)."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.manifest import DataFile, ManifestContent, ManifestFile
from pyiceberg.table import Table

from streaming.contract import BBOX_FIELDS, Contract
from streaming.decode.covering import with_covering
from streaming.kernels.hilbert import hilbert_keys_of_bounds
from streaming.maintenance import native
from streaming.maintenance.commits import (
    MaintenanceGaveUp,
    Progress,
    Retrier,
    adopt,
    carry,
    current_snapshot_id,
    delete_quietly,
    no_progress,
)
from streaming.maintenance.lease import LeaseLost
from streaming.maintenance.plan import Bin, LiveFile, MaintenancePolicy, compaction_candidates, plan_bins
from streaming.read.bounds import FileBounds
from streaming.read.projection import FieldIdProjection
from streaming.read.query import table_contract
from streaming.storage import data_location
from streaming.table.catalog import partition_layout
from streaming.table.commit import data_spec_id, single_attempt_view, to_data_file
from streaming.table.deletes import EqualityDeletes, has_delete_files, snapshot_files
from streaming.table.native import is_native
from streaming.table.row_delta import RewriteFiles
from streaming.write.data_files import DataFileRecord, GeoParquetWriter, written_ms

log = logging.getLogger("geoingest.maintenance")


COMPACTION_FILE_PREFIX = "compacted"


# -- reports ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompactionReport:
    candidates: int
    bins: int
    files_rewritten: int  # source files replaced
    bytes_rewritten: int
    files_written: int
    bytes_written: int
    rows: int
    bins_abandoned: int  # sources replaced meanwhile by someone else: given up, outputs deleted
    conflicts: int
    snapshot_id: int | None
    seconds: float


# -- reading the table --------------------------------------------------------------------------
def live_files(
    table: Table,
    contract: Contract,
    time_field_id: int | None = None,
    read_manifest: Callable[[ManifestFile], bool] | None = None,
) -> list[tuple[LiveFile, DataFile]]:
    """Data files of the current snapshot with their Hilbert key, the time they were added, their
    spec and partition, and the upper bound of the column `time_field_id` (if given) they hold;
    only from the data manifests `read_manifest` accepts, if given."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    added_ms = {s.snapshot_id: s.timestamp_ms for s in table.metadata.snapshots}
    file_bounds = FileBounds.of_contract(contract)
    out: list[tuple[LiveFile, DataFile]] = []
    bounds: list[tuple[float, float, float, float] | None] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA or (read_manifest is not None and not read_manifest(manifest)):
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            f = entry.data_file
            bounds.append(file_bounds(f))
            upper = (f.upper_bounds or {}).get(time_field_id) if time_field_id is not None else None
            out.append(
                (
                    LiveFile(
                        f.file_path,
                        int(f.file_size_in_bytes),
                        int(f.record_count),
                        None,
                        added_ms.get(entry.snapshot_id or -1, written_ms(f.file_path)),
                        manifest.partition_spec_id,
                        tuple(f.partition[i] for i in range(len(f.partition))),
                        None if upper is None else int.from_bytes(upper, "little", signed=True),
                    ),
                    f,
                )
            )
    placed = [i for i, b in enumerate(bounds) if b is not None]
    if placed:
        b = np.array([bounds[i] for i in placed])
        keys = hilbert_keys_of_bounds(
            b[:, 0], b[:, 1], b[:, 2], b[:, 3], contract.clustering.extent, contract.clustering.hilbert_bits
        )
        for i, key in zip(placed, keys.tolist()):
            live, data_file = out[i]
            out[i] = (dataclasses.replace(live, hilbert_key=key), data_file)
    return out


# -- compaction ---------------------------------------------------------------------------------
def rewrite_bin(
    table: Table,
    contract: Contract,
    bin_: Bin,
    progress: Progress = no_progress,
    deletes: EqualityDeletes | None = None,
    sequence_numbers: dict[str, int] | None = None,
    target: Table | None = None,
    file_prefix: str = COMPACTION_FILE_PREFIX,
) -> list[DataFileRecord]:
    """The bin's rows, Hilbert-sorted again, written as new data files like ingest writes them, in
    `table` or, for a copy, in `target` (made from `contract`).

    In an upsert table the equality deletes that apply to a source file are applied as it is read:
    the new files get a sequence number those deletes do not reach (see compact)."""
    target = target or table
    names = contract.arrow_schema.names
    # By field id: files written before a column was renamed, widened or added read as the table is now.
    projection = FieldIdProjection(table.schema())
    parts: list[pa.Table] = []
    for f in bin_.files:
        with table.io.new_input(f.path).open() as stream:
            parquet = pq.ParquetFile(stream)
            rows = projection(parquet.read(columns=projection.columns_to_read(parquet.schema_arrow)), f.path)
        if rows.num_rows != f.record_count:
            raise RuntimeError(
                f"data file {f.path} holds {rows.num_rows} rows, its manifest entry says "
                f"{f.record_count}; not compacting it"
            )
        if deletes is not None and sequence_numbers is not None:
            rows = deletes.live(rows, sequence_numbers[f.path])
        parts.append(with_covering(rows, contract).select(names))
        progress("compact: read", f.file_size_in_bytes, bin_.bytes, "B")
    rows = pa.concat_tables(parts, promote_options="permissive").combine_chunks()
    bbox = rows.column(contract.bbox_name).chunk(0) if rows.num_rows else None
    if bbox is None:
        keys = np.zeros(0, np.int64)
    else:
        xmin, ymin, xmax, ymax = (bbox.field(n).to_numpy() for n in BBOX_FIELDS)
        keys = hilbert_keys_of_bounds(
            xmin, ymin, xmax, ymax, contract.clustering.extent, contract.clustering.hilbert_bits
        )
    # Re-sorted, not merged: see the module docstring. The order of equal keys does not matter here.
    ordered = rows.take(pa.array(np.argsort(keys, kind="quicksort")))
    writer = GeoParquetWriter(
        contract,
        dict(target.properties),
        dict(target.io.properties),
        data_location(target),
        f"{file_prefix}-{uuid.uuid4().hex[:12]}",
        partition_layout(target),
    )
    written = list(writer.write(ordered.to_batches(max_chunksize=contract.clustering.row_group_rows)))
    if sum(r.record_count for r in written) != rows.num_rows:
        delete_quietly(target, [r.path for r in written])
        raise RuntimeError(
            f"compaction of {len(bin_.files)} files wrote {sum(r.record_count for r in written)} "
            f"rows for {rows.num_rows}; nothing replaced"
        )
    return written


def equality_deletes_of(table: Table) -> tuple[EqualityDeletes | None, dict[str, int], set[str]]:
    """An upsert table's equality deletes, the sequence number of each data file, the delete files'
    paths; (None, {}, set()) for a table without delete files."""
    snapshot = table.current_snapshot()
    if not has_delete_files(table, snapshot):
        return None, {}, set()
    assert snapshot is not None
    planned = snapshot_files(table, snapshot)
    return (
        EqualityDeletes(table, planned.reaching_deletes()),
        {p.file.file_path: p.sequence_number for p in planned.data},
        {p.file.file_path for p in planned.equality_deletes},
    )


def _files_to_apply_deletes(
    files: list[LiveFile],
    deletes: EqualityDeletes | None,
    sequence_numbers: dict[str, int],
    policy: MaintenancePolicy,
) -> list[LiveFile]:
    """The data files an upsert table's deletes reach, once the keys the delete files list (each
    listing supersedes about one older row) come to `delete_ratio` of those files' rows (Iceberg's
    rewrite uses a ratio alike): rewriting them all is what lets readers drop the deletes, and the
    ratio spaces those rewrites out."""
    if deletes is None or not len(deletes):
        return []
    newest = deletes.newest_sequence_number
    reached = [f for f in files if f.hilbert_key is not None and sequence_numbers.get(f.path, newest) < newest]
    rows = sum(f.record_count for f in reached)
    return reached if rows and deletes.listed >= policy.delete_ratio * rows else []


def _delete_file_paths(table: Table) -> set[str]:
    snapshot = table.current_snapshot()
    if not has_delete_files(table, snapshot):
        return set()
    assert snapshot is not None
    return {p.file.file_path for p in snapshot_files(table, snapshot).equality_deletes}


@dataclass(frozen=True)
class _CompactionPlan:
    contract: Contract
    candidates: list[LiveFile]
    bins: list[Bin]
    # Upsert tables: the deletes to apply while rewriting, each data file's sequence number, and
    # the delete files' paths (one beyond them at commit time must reach the new files)
    deletes: EqualityDeletes | None
    sequence_numbers: dict[str, int]
    planned_deletes: set[str]
    # The snapshot planned from, and its sequence number
    snapshot_id: int | None
    read_sequence_number: int


def plan_compaction(table: Table, policy: MaintenancePolicy, now_ms: int | None) -> _CompactionPlan:
    """The bins a compaction of the table (as last refreshed) would rewrite now."""
    contract = table_contract(table)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    small = policy.small_file_bytes or (contract.clustering.target_file_bytes * 3) // 4
    # Files of older specs are left alone (see the module docstring).
    spec_id = table.metadata.default_spec_id
    files = [live for live, _ in live_files(table, contract) if live.spec_id == spec_id]
    candidates = compaction_candidates(files, small, int(policy.min_file_age_s * 1000), now_ms)
    deletes, sequence_numbers, planned_deletes = equality_deletes_of(table)
    reached = _files_to_apply_deletes(files, deletes, sequence_numbers, policy)
    if reached:
        # Every file the deletes reach is rewritten, whatever its size or age, alone if need be:
        # only then do the delete files reach nothing, and readers stop loading them.
        chosen = {f.path for f in candidates} | {f.path for f in reached}
        bins = plan_bins([f for f in files if f.path in chosen], policy.max_bin_bytes, 1)
    else:
        bins = plan_bins(candidates, policy.max_bin_bytes, policy.min_files_per_bin)
    snapshot = table.current_snapshot()
    read_sequence_number = (snapshot.sequence_number or 0) if snapshot is not None else 0
    return _CompactionPlan(
        contract,
        candidates,
        bins,
        deletes,
        sequence_numbers,
        planned_deletes,
        None if snapshot is None else snapshot.snapshot_id,
        read_sequence_number,
    )


@dataclass
class _Rewrite:
    sources: tuple[str, ...]
    outputs: list[DataFileRecord]
    spec_id: int
    partition: tuple


def compact(
    table: Table,
    policy: MaintenancePolicy,
    dry_run: bool = False,
    progress: Progress = no_progress,
    now_ms: int | None = None,
    retrier: Retrier | None = None,
) -> CompactionReport:
    """Rewrite the small, old files of the current snapshot into large Hilbert-clustered ones and
    replace them in one "replace" snapshot (see the module docstring for concurrency)."""
    started = time.monotonic()
    table.refresh()
    plan = plan_compaction(table, policy, now_ms)
    contract, candidates, bins = plan.contract, plan.candidates, plan.bins
    deletes, sequence_numbers, planned_deletes = plan.deletes, plan.sequence_numbers, plan.planned_deletes
    if dry_run or not bins:
        return CompactionReport(
            len(candidates),
            len(bins),
            sum(len(b.files) for b in bins),
            sum(b.bytes for b in bins),
            0,
            0,
            sum(b.records for b in bins),
            0,
            0,
            None,
            time.monotonic() - started,
        )

    rewrites: list[_Rewrite] = []
    total = sum(b.bytes for b in bins)

    def overall(step: str, advance: int, _bin_total: int, unit: str) -> None:
        progress(step, advance, total, unit)

    try:
        for bin_ in bins:
            written = rewrite_bin(table, contract, bin_, overall, deletes, sequence_numbers)
            rewrites.append(_Rewrite(tuple(f.path for f in bin_.files), written, bin_.spec_id, bin_.partition))
    except BaseException:
        delete_quietly(table, [r.path for rw in rewrites for r in rw.outputs])
        raise
    abandoned: list[_Rewrite] = []
    retrier = retrier or Retrier(table)

    def attempt() -> int | None:
        table.refresh()
        live = {f.file_path: f for _, f in live_files(table, contract)}
        # Only a source another compaction replaced meanwhile gives its bin up: equality deletes
        # committed since the plan are made to reach the new files instead (RewriteFiles).
        overtaken = bool(_delete_file_paths(table) - planned_deletes)
        for rw in list(rewrites):
            if not all(p in live for p in rw.sources):
                rewrites.remove(rw)
                abandoned.append(rw)
                delete_quietly(table, [r.path for r in rw.outputs])
        for rw in list(rewrites):
            # An output gone (deleted by hand, or as an orphan by a remover that takes no lease)
            # would be committed as a file no reader can open: its bin is given up instead.
            missing = [r.path for r in rw.outputs if not table.io.new_input(r.path).exists()]
            if missing:
                log.warning(
                    "a compacted file is gone before its commit; its bin is given up",
                    extra={"summary": {"missing": missing[:5], "sources": len(rw.sources)}},
                )
                rewrites.remove(rw)
                abandoned.append(rw)
                delete_quietly(table, [r.path for r in rw.outputs if r.path not in missing])
        if not rewrites:
            return None
        view = single_attempt_view(table)
        if any(rw.spec_id != view.metadata.default_spec_id for rw in rewrites):
            # The partition spec evolved since the plan: the new files' spec is no longer the
            # one their manifest would be written with. Given up, as a conflict.
            for rw in rewrites:
                abandoned.append(rw)
                delete_quietly(table, [r.path for r in rw.outputs])
            rewrites.clear()
            return None
        # Without such deletes the new files take the commit's own sequence number: newer than every
        # delete file, so no reader (pyiceberg's included) loads the deletes for them.
        sequence_number = plan.read_sequence_number if overtaken else None
        if is_native(view):
            with retrier.native_fence(view) as fence:
                snapshot_id = native.rewrite(
                    view,
                    [path for rw in rewrites for path in rw.sources],
                    [(r, data_spec_id(r, view.metadata)) for rw in rewrites for r in rw.outputs],
                    carry(view, "compaction"),
                    plan.snapshot_id,
                    sequence_number,
                    fence,
                )
            table.refresh()
            return snapshot_id
        with retrier.transaction(view) as tx:
            with RewriteFiles(tx, sequence_number, carry(view, "compaction")) as rewrite:
                for rw in rewrites:
                    for path in rw.sources:
                        rewrite.delete_data_file(live[path])
                    for record in rw.outputs:
                        rewrite.append_data_file(to_data_file(record, data_spec_id(record, view.metadata)))
        adopt(table, view)
        return current_snapshot_id(view)

    try:
        snapshot_id, conflicts = retrier.run("compaction", attempt)
    except (MaintenanceGaveUp, CommitFailedException, ValidationException, LeaseLost):
        # Refused for sure, or never sent (the lease lost): the new files are garbage. (After an
        # unanswered attempt, CATALOG_UNAVAILABLE, the commit may have landed: the files stay, and
        # orphan deletion takes them if it did not.)
        delete_quietly(table, [r.path for rw in rewrites for r in rw.outputs])
        raise
    kept = [b for b in bins if tuple(f.path for f in b.files) in {rw.sources for rw in rewrites}]
    outputs = [r for rw in rewrites for r in rw.outputs]
    return CompactionReport(
        candidates=len(candidates),
        bins=len(bins),
        files_rewritten=sum(len(b.files) for b in kept),
        bytes_rewritten=sum(b.bytes for b in kept),
        files_written=len(outputs),
        bytes_written=sum(r.file_size_in_bytes for r in outputs),
        rows=sum(b.records for b in kept),
        bins_abandoned=len(abandoned),
        conflicts=conflicts,
        snapshot_id=snapshot_id,
        seconds=time.monotonic() - started,
    )
