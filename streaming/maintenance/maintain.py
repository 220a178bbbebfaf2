"""Table maintenance: compaction along the Hilbert curve, manifest merging, snapshot expiry and
orphan deletion. The one place that changes a table for upkeep, as streaming/commit.py is for ingest.

Why it is needed: every micro-batch adds a snapshot, a manifest and a few small files. Commit cost
and scan planning grow with the snapshots and manifests, and small batches defeat pruning, since
every batch's files span the whole data extent. Each step bounds one of these:

- compaction reads the small files of many batches (below `small_file_bytes`, added at least
  `min_file_age_s` ago), sorts their rows by Hilbert key again and writes them as files of the
  contract's target size with the same GeoParquet metadata, covering column and manifest bounds as
  ingest, then replaces them in one overwrite snapshot. The rows are sorted again rather than
  k-way merged although each source is sorted: numpy's quicksort over the concatenated keys beat
  its run-merging stable sort from 50 sources up, and both take a fraction of the time reading and
  writing the files does (bench/maintenance.py, "merge or re-sort"). Files are packed into bins by
  the Hilbert key of their extent's centre, one contiguous stretch of the curve per bin, at most
  `max_bin_bytes` each, so a rewrite's memory is bounded whatever the table holds.
- manifest merging rewrites the current snapshot's data manifests into few (pyiceberg's merge
  append with no new files), so planning reads a handful of manifests instead of one per batch.
- expiry removes snapshots older than `snapshot_max_age_s` beyond the newest `keep_snapshots`, then
  deletes the manifest lists, manifests and data files that only they referenced.
- orphan deletion removes files under the table location that no snapshot references, once older
  than `orphan_min_age_s` (younger ones may belong to a commit in flight).

Exactly-once survives expiry: every maintenance snapshot carries the history of every writer
(`geoingest.writers`, see streaming/commit.py), and only snapshots older than the newest such
carrier are ever expired, so the replay check and `--resume-from-table` find what they need.

Concurrency: ingest appends never wait for maintenance. A maintenance commit is one attempt on a
freshly loaded table; when the catalog refuses it (an ingest commit landed in between), the table is
loaded again, the files it replaces are checked to be still live, and the same rewritten files
are committed on the new base, with the table's commit.retry.* backoff. A bin whose sources are
gone (another compaction replaced them) is given up and its new files deleted: no row is lost or
duplicated either way. Files of a batch whose commit is in flight are not in the table yet, and
files younger than `min_file_age_s` are never rewritten, so an ingest retry that finds its own
batch landed still finds its own files.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from streaming.commit import (
    WRITERS,
    RetryPolicy,
    single_attempt_view,
    to_data_file,
    writer_histories_json,
)
from streaming.contract import BBOX_FIELDS, Contract
from streaming.deletes import EqualityDeletes, has_delete_files, snapshot_files
from streaming.hilbert import hilbert_keys_of_bounds
from streaming.inspect import file_bbox
from streaming.lease import LeaseHeld, LeaseLost, MaintenanceLease
from streaming.maintenance_plan import (
    STEPS,
    Bin,
    ExpiryPlan,
    LiveFile,
    MaintenancePolicy,
    SnapshotFacts,
    compaction_candidates,
    plan_bins,
    plan_expiry,
)
from streaming.orphans import Orphan, delete_files, find_orphans
from streaming.query import FieldIdProjection, table_contract
from streaming.storage import data_location
from streaming.writer import DataFileRecord, GeoParquetWriter

log = logging.getLogger("geoingest.maintenance")

# Snapshot summary key of maintenance snapshots: which step made it.
MAINTENANCE = "geoingest.maintenance"
COMPACTION_FILE_PREFIX = "compacted"

T = TypeVar("T")
# progress(step, advance, total, unit): a step moved on by `advance` of `total` (the CLI draws bars).
Progress = Callable[[str, int, int, str], None]


def _no_progress(step: str, done: int, total: int, unit: str) -> None:
    pass


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


@dataclass(frozen=True)
class ManifestReport:
    manifests_before: int
    manifests_after: int
    snapshot_id: int | None
    conflicts: int
    seconds: float


@dataclass(frozen=True)
class ExpiryReport:
    snapshots_before: int
    snapshots_expired: int
    files_deleted: int  # manifest lists, manifests and data files only the expired ones referenced
    bytes_deleted: int
    conflicts: int
    seconds: float


@dataclass(frozen=True)
class OrphanReport:
    found: int
    deleted: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    dry_run: bool
    compaction: CompactionReport | None = None
    manifests: ManifestReport | None = None
    expiry: ExpiryReport | None = None
    orphans: OrphanReport | None = None
    seconds: float = 0.0
    # Why the run stopped before its steps (another maintainer holds the table's lease), if it did.
    skipped: str | None = None

    @property
    def conflicts(self) -> int:
        return sum(r.conflicts for r in (self.compaction, self.manifests, self.expiry) if r is not None)

    def to_json(self) -> dict:
        def plain(report):
            return None if report is None else dict(report.__dict__)

        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "compaction": plain(self.compaction),
            "manifests": plain(self.manifests),
            "expiry": plain(self.expiry),
            "orphans": plain(self.orphans),
            "conflicts": self.conflicts,
            "seconds": round(self.seconds, 3),
            "skipped": self.skipped,
        }


class MaintenanceGaveUp(RuntimeError):
    """A maintenance commit lost every retry to concurrent commits; nothing of it landed."""

    def __init__(self, message: str, conflicts: int):
        super().__init__(message)
        self.conflicts = conflicts


# -- reading the table --------------------------------------------------------------------------
def live_files(table: Table, contract: Contract) -> list[tuple[LiveFile, DataFile]]:
    """Data files of the current snapshot with their Hilbert key and the time they were added."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    added_ms = {s.snapshot_id: s.timestamp_ms for s in table.metadata.snapshots}
    ids = contract.bbox_field_ids
    out: list[tuple[LiveFile, DataFile]] = []
    bounds: list[tuple[float, float, float, float] | None] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            f = entry.data_file
            bounds.append(file_bbox(f, ids))
            out.append(
                (
                    LiveFile(
                        f.file_path,
                        int(f.file_size_in_bytes),
                        int(f.record_count),
                        None,
                        None if entry.snapshot_id is None else added_ms.get(entry.snapshot_id),
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
            out[i] = (LiveFile(live.path, live.file_size_in_bytes, live.record_count, key, live.added_ms), data_file)
    return out


def data_manifest_count(table: Table) -> int:
    snapshot = table.current_snapshot()
    if snapshot is None:
        return 0
    return sum(1 for m in snapshot.manifests(table.io) if m.content == ManifestContent.DATA)


def _snapshot_facts(snapshots: Iterable[Snapshot]) -> list[SnapshotFacts]:
    return [
        SnapshotFacts(
            s.snapshot_id,
            s.sequence_number or 0,
            s.timestamp_ms,
            bool(s.summary and WRITERS in s.summary.additional_properties),
        )
        for s in snapshots
    ]


def _protected_ids(table: Table) -> set[int]:
    return {ref.snapshot_id for ref in table.metadata.refs.values()}


def _reachable(table: Table, snapshots: Iterable[Snapshot], with_deleted: bool) -> dict[str, int]:
    """Path -> size of every manifest list, manifest and data file these snapshots reference.

    A manifest entry marked deleted names a file its snapshot no longer holds (its parent did):
    `with_deleted` counts those too, for the snapshots about to go."""
    files: dict[str, int] = {}
    seen_manifests: set[str] = set()
    for snapshot in snapshots:
        files[snapshot.manifest_list] = 0
        for manifest in snapshot.manifests(table.io):
            files[manifest.manifest_path] = manifest.manifest_length
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=not with_deleted):
                files[entry.data_file.file_path] = int(entry.data_file.file_size_in_bytes)
    return files


# -- committing ---------------------------------------------------------------------------------
@dataclass
class _Retrier:
    """Runs one-attempt maintenance commits until one lands, with the table's commit.retry.* backoff."""

    table: Table
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def run(self, what: str, attempt: Callable[[], T]) -> tuple[T, int]:
        started = time.monotonic()
        conflicts = 0
        while True:
            try:
                return attempt(), conflicts
            except (CommitFailedException, ValidationException) as exc:
                conflicts += 1
                policy = RetryPolicy.from_table_properties(self.table.properties)
                elapsed_ms = (time.monotonic() - started) * 1000
                if conflicts > policy.num_retries or elapsed_ms > policy.total_timeout_ms:
                    raise MaintenanceGaveUp(
                        f"{what} of {'.'.join(self.table.name())} gave up after {conflicts} conflict(s) in "
                        f"{elapsed_ms:.0f} ms; last error: {exc}",
                        conflicts,
                    ) from exc
                log.info(
                    "maintenance commit conflicted, retrying on a fresh table",
                    extra={"summary": {"step": what, "conflicts": conflicts, "error": str(exc)[:300]}},
                )
                self.sleep(policy.wait_ms(conflicts, self.rng) / 1000)


def _adopt(table: Table, view: Table) -> None:
    # The view holds the metadata the catalog answered with.
    table.metadata, table.metadata_location = view.metadata, view.metadata_location


def _current_snapshot_id(table: Table) -> int:
    snapshot = table.current_snapshot()
    if snapshot is None:
        raise RuntimeError(f"table {'.'.join(table.name())}: no current snapshot after a maintenance commit")
    return snapshot.snapshot_id


def _carry(view: Table, step: str) -> dict[str, str]:
    return {MAINTENANCE: step, WRITERS: writer_histories_json(view.metadata.snapshots)}


def _size(table: Table, path: str) -> int:
    try:
        return len(table.io.new_input(path))
    except (OSError, FileNotFoundError):
        return 0


def _delete_quietly(table: Table, paths: Iterable[str]) -> None:
    for path in paths:
        try:
            table.io.delete(path)
        except (OSError, FileNotFoundError) as exc:  # left for orphan deletion
            log.warning("could not delete a file", extra={"summary": {"path": path, "error": str(exc)}})


# -- compaction ---------------------------------------------------------------------------------
def rewrite_bin(
    table: Table,
    contract: Contract,
    bin_: Bin,
    progress: Progress = _no_progress,
    deletes: EqualityDeletes | None = None,
    sequence_numbers: dict[str, int] | None = None,
) -> list[DataFileRecord]:
    """The bin's rows, Hilbert-sorted again, written as new data files like ingest writes them.

    In an upsert table the equality deletes that apply to a source file are applied as it is read:
    the new files get a newer sequence number, which those deletes no longer reach."""
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
        parts.append(rows.select(names))
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
        dict(table.properties),
        dict(table.io.properties),
        data_location(table),
        f"{COMPACTION_FILE_PREFIX}-{uuid.uuid4().hex[:12]}",
    )
    written = list(writer.write(ordered.to_batches(max_chunksize=contract.clustering.row_group_rows)))
    if sum(r.record_count for r in written) != rows.num_rows:
        _delete_quietly(table, [r.path for r in written])
        raise RuntimeError(
            f"compaction of {len(bin_.files)} files wrote {sum(r.record_count for r in written)} "
            f"rows for {rows.num_rows}; nothing replaced"
        )
    return written


def _equality_deletes(table: Table) -> tuple[EqualityDeletes | None, dict[str, int], set[str]]:
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
    # the delete files' paths (a delete file beyond them at commit time gives the rewrite up)
    deletes: EqualityDeletes | None
    sequence_numbers: dict[str, int]
    planned_deletes: set[str]


def _plan_compaction(table: Table, policy: MaintenancePolicy, now_ms: int | None) -> _CompactionPlan:
    """The bins a compaction of the table (as last refreshed) would rewrite now."""
    contract = table_contract(table)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    small = policy.small_file_bytes or (contract.clustering.target_file_bytes * 3) // 4
    files = [live for live, _ in live_files(table, contract)]
    candidates = compaction_candidates(files, small, int(policy.min_file_age_s * 1000), now_ms)
    deletes, sequence_numbers, planned_deletes = _equality_deletes(table)
    reached = _files_to_apply_deletes(files, deletes, sequence_numbers, policy)
    if reached:
        # Every file the deletes reach is rewritten, whatever its size or age, alone if need be:
        # only then do the delete files reach nothing, and readers stop loading them.
        chosen = {f.path for f in candidates} | {f.path for f in reached}
        bins = plan_bins([f for f in files if f.path in chosen], policy.max_bin_bytes, 1)
    else:
        bins = plan_bins(candidates, policy.max_bin_bytes, policy.min_files_per_bin)
    return _CompactionPlan(contract, candidates, bins, deletes, sequence_numbers, planned_deletes)


@dataclass
class _Rewrite:
    sources: tuple[str, ...]
    outputs: list[DataFileRecord]


def compact(
    table: Table,
    policy: MaintenancePolicy,
    dry_run: bool = False,
    progress: Progress = _no_progress,
    now_ms: int | None = None,
    retrier: _Retrier | None = None,
) -> CompactionReport:
    """Rewrite the small, old files of the current snapshot into large Hilbert-clustered ones and
    replace them in one overwrite snapshot (see the module docstring for concurrency)."""
    started = time.monotonic()
    table.refresh()
    plan = _plan_compaction(table, policy, now_ms)
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
            rewrites.append(_Rewrite(tuple(f.path for f in bin_.files), written))
    except BaseException:
        _delete_quietly(table, [r.path for rw in rewrites for r in rw.outputs])
        raise
    abandoned: list[_Rewrite] = []

    def attempt() -> int | None:
        table.refresh()
        live = {f.file_path: f for _, f in live_files(table, contract)}
        # Equality deletes committed since the plan would not reach the new files (their sequence
        # number is newer): a key they delete or replace would come back. Given up, as Iceberg does.
        new_deletes = _delete_file_paths(table) - planned_deletes
        for rw in list(rewrites):
            if new_deletes or not all(p in live for p in rw.sources):
                rewrites.remove(rw)
                abandoned.append(rw)
                _delete_quietly(table, [r.path for r in rw.outputs])
        if not rewrites:
            return None
        view = single_attempt_view(table)
        spec_id = view.metadata.default_spec_id
        # An overwrite, not a replace: pyiceberg 0.12 cannot summarise a "replace" snapshot.
        with view.transaction() as tx:
            with tx.update_snapshot(snapshot_properties=_carry(view, "compaction")).overwrite() as overwrite:
                for rw in rewrites:
                    for path in rw.sources:
                        overwrite.delete_data_file(live[path])
                    for record in rw.outputs:
                        overwrite.append_data_file(to_data_file(record, spec_id))
        _adopt(table, view)
        return _current_snapshot_id(view)

    retrier = retrier or _Retrier(table)
    try:
        snapshot_id, conflicts = retrier.run("compaction", attempt)
    except (MaintenanceGaveUp, CommitFailedException, ValidationException):
        # Refused for sure: the new files are garbage. (After an unanswered attempt, CATALOG_UNAVAILABLE,
        # the commit may have landed: the files stay, and orphan deletion takes them if it did not.)
        _delete_quietly(table, [r.path for rw in rewrites for r in rw.outputs])
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


# -- manifests ----------------------------------------------------------------------------------
def merge_manifests(
    table: Table, policy: MaintenancePolicy, force: bool = False, dry_run: bool = False, retrier: _Retrier | None = None
) -> ManifestReport:
    """Merge the current snapshot's data manifests when there are more than `max_manifests` (or
    always, with `force`: the snapshot it commits also carries the writer histories expiry needs)."""
    started = time.monotonic()
    table.refresh()
    before = data_manifest_count(table)
    if dry_run or table.current_snapshot() is None or (before <= policy.max_manifests and not force):
        return ManifestReport(before, before, None, 0, time.monotonic() - started)

    # Merging is pyiceberg's merge append with no new files; its knobs are table properties, set
    # on this commit's view only so ingest's fast appends stay as they are.
    merging = {
        "commit.manifest-merge.enabled": "true",
        "commit.manifest.min-count-to-merge": "2",
        "commit.manifest.target-size-bytes": str(policy.manifest_target_bytes),
    }

    def attempt() -> int:
        table.refresh()
        view = single_attempt_view(table, merging)
        with view.transaction() as tx:
            tx.update_snapshot(snapshot_properties=_carry(view, "manifest-merge")).merge_append().commit()
        _adopt(table, view)
        return _current_snapshot_id(view)

    snapshot_id, conflicts = (retrier or _Retrier(table)).run("manifest merge", attempt)
    return ManifestReport(before, data_manifest_count(table), snapshot_id, conflicts, time.monotonic() - started)


# -- expiry -------------------------------------------------------------------------------------
def expire_snapshots(
    table: Table,
    policy: MaintenancePolicy,
    dry_run: bool = False,
    progress: Progress = _no_progress,
    now_ms: int | None = None,
    retrier: _Retrier | None = None,
) -> ExpiryReport:
    """Expire old snapshots (keeping what the replay check needs, see plan_expiry), then delete the
    files that only the expired snapshots referenced."""
    started = time.monotonic()
    retrier = retrier or _Retrier(table)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms

    def plan() -> ExpiryPlan:
        table.refresh()
        return _plan_expiry(table, policy, now_ms)

    expiry = plan()
    before = len(table.metadata.snapshots)
    conflicts = 0
    if expiry.uncovered and not dry_run:
        # Old snapshots whose batches no carried history holds yet: a fresh carrier first.
        conflicts += merge_manifests(table, policy, force=True, retrier=retrier).conflicts
        expiry = plan()
    if dry_run or not expiry.expire:
        expirable = len(expiry.expire) + (len(expiry.uncovered) if dry_run else 0)
        return ExpiryReport(before, expirable, 0, 0, conflicts, time.monotonic() - started)

    expired: list[Snapshot] = []

    def attempt() -> int:
        current = plan()
        doomed = set(current.expire)
        expired[:] = [s for s in table.metadata.snapshots if s.snapshot_id in doomed]
        if not doomed:
            return 0
        view = single_attempt_view(table)
        view.maintenance.expire_snapshots().by_ids(sorted(doomed)).commit()
        _adopt(table, view)
        return len(doomed)

    count, more = retrier.run("snapshot expiry", attempt)
    conflicts += more
    # What only the expired snapshots referenced: nothing current can reach it any more.
    table.refresh()
    gone = _reachable(table, expired, with_deleted=True)
    kept = _reachable(table, table.metadata.snapshots, with_deleted=False)
    doomed_files = sorted(p for p in gone if p not in kept)
    deleted = 0
    for path in doomed_files:
        # Manifest lists carry no size in the metadata; the others do.
        deleted += gone[path] or _size(table, path)
        _delete_quietly(table, [path])
        progress("expire: delete files", 1, len(doomed_files), "files")
    return ExpiryReport(before, count, len(doomed_files), deleted, conflicts, time.monotonic() - started)


def _plan_expiry(table: Table, policy: MaintenancePolicy, now_ms: int) -> ExpiryPlan:
    """What expiry would remove from the table as last refreshed."""
    return plan_expiry(
        _snapshot_facts(table.metadata.snapshots),
        _protected_ids(table),
        now_ms,
        int(policy.snapshot_max_age_s * 1000),
        policy.keep_snapshots,
        policy.max_snapshots,
    )


# -- orphans ------------------------------------------------------------------------------------
def delete_orphans(
    table: Table, policy: MaintenancePolicy, dry_run: bool = False, progress: Progress = _no_progress
) -> tuple[OrphanReport, list[Orphan]]:
    """Files under the table location (data and metadata) that nothing references, older than
    `orphan_min_age_s`; deleted unless `dry_run`."""
    started = time.monotonic()
    table.refresh()
    orphans = find_orphans(table, min_age_s=policy.orphan_min_age_s, include_metadata=True)
    if not dry_run:
        for orphan in orphans:
            delete_files(table, [orphan.path])
            progress("orphans: delete", 1, len(orphans), "files")
    report = OrphanReport(
        len(orphans), 0 if dry_run else len(orphans), sum(o.size for o in orphans), time.monotonic() - started
    )
    return report, orphans


# -- all of it ----------------------------------------------------------------------------------
def _has_work(table: Table, policy: MaintenancePolicy, steps: tuple[str, ...], now_ms: int | None) -> bool:
    """Whether any of the steps would change the table now (orphans: always, they must look)."""
    table.refresh()
    if table.current_snapshot() is None:
        return False
    if "orphans" in steps:
        return True
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if "expire" in steps:
        expiry = _plan_expiry(table, policy, now_ms)
        if expiry.expire or expiry.uncovered:
            return True
    if "compact" in steps:
        if data_manifest_count(table) > policy.max_manifests:
            return True
        if _plan_compaction(table, policy, now_ms).bins:
            return True
    return False


def maintain(
    table: Table,
    policy: MaintenancePolicy,
    steps: Iterable[str] = STEPS,
    dry_run: bool = False,
    progress: Progress = _no_progress,
    now_ms: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    holder: str | None = None,
) -> MaintenanceReport:
    """Run the chosen steps in order: compact (then merge manifests), expire, delete orphans, holding
    the table's maintenance lease (streaming/lease.py). When another maintainer holds it, nothing runs
    and the report says so in `skipped`; a dry run changes nothing and takes no lease."""
    steps = tuple(steps)
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise ValueError(f"maintenance steps {unknown}: expected some of {', '.join(STEPS)}")
    started = time.monotonic()
    retrier = _Retrier(table, sleep=sleep)
    lease = MaintenanceLease(table, policy.lease_s, holder, sleep=sleep)
    compaction = manifests = expiry = orphans = None
    skipped = None
    try:
        # A run with nothing to do takes no lease (each change of it is a commit): its steps find
        # nothing and commit nothing. Work that appears meanwhile is still done safely, as without
        # a lease: the lease spares duplicate work, the live-file check guards the rows.
        if not dry_run and _has_work(table, policy, steps, now_ms):
            lease.acquire()
        if "compact" in steps:
            compaction = compact(table, policy, dry_run=dry_run, progress=progress, now_ms=now_ms, retrier=retrier)
            lease.renew()
            manifests = merge_manifests(table, policy, dry_run=dry_run, retrier=retrier)
        if "expire" in steps:
            lease.renew()
            expiry = expire_snapshots(table, policy, dry_run=dry_run, progress=progress, now_ms=now_ms, retrier=retrier)
        if "orphans" in steps:
            lease.renew()
            orphans, _ = delete_orphans(table, policy, dry_run=dry_run, progress=progress)
    except (LeaseHeld, LeaseLost) as exc:
        skipped = str(exc)
    finally:
        lease.release()
    report = MaintenanceReport(
        ".".join(table.name()),
        dry_run,
        compaction,
        manifests,
        expiry,
        orphans,
        time.monotonic() - started,
        skipped,
    )
    log.info("maintenance", extra={"summary": report.to_json()})
    return report
