"""Table maintenance: retention, compaction along the Hilbert curve, manifest merging, snapshot
expiry and orphan deletion. The one place that changes a table for upkeep, as streaming/table/commit.py is for ingest.

Why it is needed: every micro-batch adds a snapshot, a manifest and a few small files. Commit cost
and scan planning grow with the snapshots and manifests, and small batches defeat pruning, since
every batch's files span the whole data extent. Each step bounds one of these:

- retention drops the partitions wholly older than the horizon (`retention`), as a metadata-only
  delete (streaming/maintenance/retention.py); expiry then frees their files.
- compaction reads the small files of many batches (below `small_file_bytes`, added at least
  `min_file_age_s` ago), sorts their rows by Hilbert key again and writes them as files of the
  contract's target size with the same GeoParquet metadata, covering column and manifest bounds as
  ingest, then replaces them in one "replace" snapshot. The rows are sorted again rather than
  k-way merged although each source is sorted: numpy's quicksort over the concatenated keys beat
  its run-merging stable sort from 50 sources up, and both take a fraction of the time reading and
  writing the files does (bench/maintenance.py, "merge or re-sort"). Files are packed into bins by
  the Hilbert key of their extent's centre, one contiguous stretch of the curve per bin, at most
  `max_bin_bytes` each, so a rewrite's memory is bounded whatever the table holds.
- manifest merging rewrites the current snapshot's data manifests into few, one spec each and
  grouped by partition (a snapshot with no new files), so planning reads a handful of manifests
  instead of one per batch, and skips those whose partitions a filter excludes.
- expiry removes snapshots older than `snapshot_max_age_s` beyond the newest `keep_snapshots`, then
  deletes the manifest lists, manifests and data files that only they referenced.
- orphan deletion removes files under the table location that no snapshot references, once older
  than `orphan_min_age_s` (younger ones may belong to a commit in flight).

Exactly-once survives expiry: every maintenance snapshot carries the history of every writer
(`geoingest.writers`, see streaming/table/commit.py), and only snapshots older than the newest such
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
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import cast

from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile, write_manifest
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.table.update.snapshot import ExpireSnapshots, _FastAppendFiles

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
    size,
)
from streaming.maintenance.compaction import (
    CompactionReport,
    compact,
    plan_compaction,
)
from streaming.maintenance.lease import LeaseHeld, LeaseLost, MaintenanceLease
from streaming.maintenance.orphans import Orphan, check_orphan_age, delete_files, find_orphans
from streaming.maintenance.plan import (
    STEPS,
    ExpiryPlan,
    MaintenancePolicy,
    SnapshotFacts,
    plan_expiry,
    plan_manifests,
)
from streaming.maintenance.retention import RetentionReport, apply_retention, plan_table_retention, retention_of
from streaming.table.commit import (
    WRITERS,
    single_attempt_view,
)
from streaming.table.native import is_native
from streaming.table.turns import no_turn

log = logging.getLogger("geoingest.maintenance")


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
    retention: RetentionReport | None = None
    compaction: CompactionReport | None = None
    manifests: ManifestReport | None = None
    expiry: ExpiryReport | None = None
    orphans: OrphanReport | None = None
    seconds: float = 0.0
    # Why the run stopped before its steps (another maintainer holds the table's lease), if it did.
    skipped: str | None = None

    @property
    def conflicts(self) -> int:
        return sum(r.conflicts for r in (self.retention, self.compaction, self.manifests, self.expiry) if r is not None)

    def to_json(self) -> dict:
        def plain(report):
            return None if report is None else dict(report.__dict__)

        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "retention": plain(self.retention),
            "compaction": plain(self.compaction),
            "manifests": plain(self.manifests),
            "expiry": plain(self.expiry),
            "orphans": plain(self.orphans),
            "conflicts": self.conflicts,
            "seconds": round(self.seconds, 3),
            "skipped": self.skipped,
        }


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


# -- manifests ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _MergedManifests:
    """Data manifests written once for a merge, and the data manifests of the base they replace."""

    snapshot_id: int  # of the snapshot that commits them, written into them
    replaced: frozenset[str]
    merged: tuple[ManifestFile, ...]

    def on(self, snapshot: Snapshot, io: FileIO) -> list[ManifestFile] | None:
        """`snapshot`'s manifests with the replaced ones swapped for the merged ones, or None when
        a commit since the base rewrote a replaced manifest (a removal rewrites the manifest that
        held the file)."""
        manifests = snapshot.manifests(io)
        if not self.replaced <= {m.manifest_path for m in manifests}:
            return None
        return [m for m in manifests if m.manifest_path not in self.replaced] + list(self.merged)


def _write_merged_manifests(view: Table, policy: MaintenancePolicy) -> _MergedManifests:
    """The current snapshot's live data entries regrouped by `plan_manifests`, one spec per
    manifest, each a short run of partitions (pyiceberg's merge append packs manifests by size in
    the order they came, one per batch, so a merged manifest would hold every partition of its
    batches). Written outside any commit, so a commit that loses its race leaves them for the next
    attempt."""
    metadata = view.metadata
    snapshot = view.current_snapshot()
    assert snapshot is not None
    replaced: list[str] = []
    entries: list[ManifestEntry] = []
    data_bytes = 0
    for manifest in snapshot.manifests(view.io):
        if manifest.content == ManifestContent.DATA:
            replaced.append(manifest.manifest_path)
            data_bytes += manifest.manifest_length
            entries += manifest.fetch_manifest_entry(io=view.io, discard_deleted=True)
    merged: list[ManifestFile] = []
    snapshot_id = metadata.new_snapshot_id()
    if entries:
        keys = [
            (e.data_file.spec_id, tuple(e.data_file.partition[i] for i in range(len(e.data_file.partition))))
            for e in entries
        ]
        name = uuid.uuid4()
        locations = view.location_provider()
        compression = cast(
            AvroCompressionCodec,
            metadata.properties.get(
                TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
            ),
        )
        for n, group in enumerate(plan_manifests(keys, data_bytes / len(entries), policy.manifest_target_bytes)):
            with write_manifest(
                format_version=metadata.format_version,
                spec=metadata.specs()[keys[group[0]][0]],
                schema=metadata.schema(),
                output_file=view.io.new_output(locations.new_metadata_location(f"{name}-m{n}.avro")),
                snapshot_id=snapshot_id,
                avro_compression=compression,
            ) as writer:
                for i in group:
                    entry = entries[i]
                    writer.add_entry(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.EXISTING,
                            snapshot_id=entry.snapshot_id,
                            sequence_number=entry.sequence_number,
                            file_sequence_number=entry.file_sequence_number,
                            data_file=entry.data_file,
                        )
                    )
            merged.append(writer.to_manifest_file())
    return _MergedManifests(snapshot_id, frozenset(replaced), tuple(merged))


class _ReplaceManifests(_FastAppendFiles):
    """A snapshot with no new files whose manifests are the parent's, with a merge's replaced data
    manifests swapped for its merged ones. It takes the snapshot id the merged manifests were
    written under, on every attempt: a manifest names the snapshot that added it, and the
    manifest list gives such a manifest the commit's sequence number."""

    def __init__(self, view: Table, transaction: Transaction, merged: _MergedManifests):
        super().__init__(
            operation=Operation.APPEND,
            transaction=transaction,
            io=view.io,
            snapshot_properties=carry(view, "manifest-merge"),
        )
        self._snapshot_id = merged.snapshot_id
        self.merged = merged

    def _existing_manifests(self) -> list[ManifestFile]:
        parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id or -1)
        assert parent is not None
        swap = self.merged.on(parent, self._io)
        assert swap is not None
        return swap


def merge_manifests(
    table: Table, policy: MaintenancePolicy, force: bool = False, dry_run: bool = False, retrier: Retrier | None = None
) -> ManifestReport:
    """Merge the current snapshot's data manifests when there are more than `max_manifests` (or
    always, with `force`: the snapshot it commits also carries the writer histories expiry needs),
    regrouped by spec and partition.

    The merged manifests are written once. When an ingest commit lands first, the retry commits
    the same merged manifests on the new base beside the manifests the commits since then added,
    a metadata-only attempt that takes milliseconds, so a merge keeps up with a commit every few
    hundred milliseconds. Only when a replaced manifest is gone from the new base (a commit
    removed files) is the merge written again."""
    started = time.monotonic()
    table.refresh()
    before = data_manifest_count(table)
    if dry_run or table.current_snapshot() is None or (before <= policy.max_manifests and not force):
        return ManifestReport(before, before, None, 0, time.monotonic() - started)
    retrier = retrier or Retrier(table)
    if is_native(table):
        return (
            _native_carrier(table, before, started, retrier)
            if force
            else ManifestReport(before, before, None, 0, time.monotonic() - started)
        )
    written: list[_MergedManifests] = []

    def attempt() -> int:
        table.refresh()
        view = single_attempt_view(table)
        snapshot = view.current_snapshot()
        assert snapshot is not None
        if not written or written[-1].on(snapshot, view.io) is None:
            written.append(_write_merged_manifests(view, policy))
        with retrier.transaction(view) as tx:
            _ReplaceManifests(view, tx, written[-1]).commit()
        adopt(table, view)
        return current_snapshot_id(view)

    try:
        snapshot_id, conflicts = retrier.run("manifest merge", attempt)
    except (MaintenanceGaveUp, LeaseLost):
        delete_quietly(table, (m.manifest_path for merge in written for m in merge.merged))
        raise
    # Merges written for a base a removal then changed were never committed.
    delete_quietly(table, (m.manifest_path for merge in written[:-1] for m in merge.merged))
    return ManifestReport(before, data_manifest_count(table), snapshot_id, conflicts, time.monotonic() - started)


def _native_carrier(table: Table, before: int, started: float, retrier: Retrier) -> ManifestReport:
    """A native table's manifests are merged by Iceberg Java as it commits (its merging snapshot
    producers, at commit.manifest.min-count-to-merge); what a forced merge is for there is the
    snapshot carrying every writer's history, made as an append of no file."""

    def attempt() -> int:
        table.refresh()
        view = single_attempt_view(table)
        with retrier.native_fence(view) as fence:
            snapshot_id = native.carrier(view, carry(view, "manifest-merge"), fence)
        table.refresh()
        return snapshot_id

    snapshot_id, conflicts = retrier.run("manifest merge", attempt)
    return ManifestReport(before, data_manifest_count(table), snapshot_id, conflicts, time.monotonic() - started)


# -- expiry -------------------------------------------------------------------------------------
def expire_snapshots(
    table: Table,
    policy: MaintenancePolicy,
    dry_run: bool = False,
    progress: Progress = no_progress,
    now_ms: int | None = None,
    retrier: Retrier | None = None,
) -> ExpiryReport:
    """Expire old snapshots (keeping what the replay check needs, see plan_expiry), then delete the
    files that only the expired snapshots referenced."""
    started = time.monotonic()
    retrier = retrier or Retrier(table)
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
        if is_native(view):
            with retrier.native_fence(view) as fence:
                native.expire(view, doomed, fence)
            table.refresh()
            return len(doomed)
        with retrier.transaction(view) as tx:
            ExpireSnapshots(tx).by_ids(sorted(doomed)).commit()
        adopt(table, view)
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
        deleted += gone[path] or size(table, path)
        delete_quietly(table, [path])
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
    table: Table,
    policy: MaintenancePolicy,
    dry_run: bool = False,
    progress: Progress = no_progress,
    lease: MaintenanceLease | None = None,
) -> tuple[OrphanReport, list[Orphan]]:
    """Files under the table location (data and metadata) that nothing references, older than
    `orphan_min_age_s` (refused below the table's commit window, see orphans.orphan_age_floor_s);
    deleted unless `dry_run`, and then, with the run's `lease`, only once the lease is confirmed
    after the listing: no maintainer that took it since can have been writing files then."""
    started = time.monotonic()
    table.refresh()
    if not dry_run:
        check_orphan_age(table, policy.orphan_min_age_s, "maintenance_orphan_min_age_s")
    orphans = find_orphans(table, min_age_s=policy.orphan_min_age_s, include_metadata=True)
    if not dry_run and lease is not None:
        lease.confirm()
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
    if "retention" in steps:
        retention_s = retention_of(table, policy)
        if retention_s is not None and plan_table_retention(table, retention_s, now_ms)[0].drop:
            return True
    if "expire" in steps:
        expiry = _plan_expiry(table, policy, now_ms)
        if expiry.expire or expiry.uncovered:
            return True
    if "compact" in steps:
        # A native table's manifests are merged as Iceberg Java commits (_native_carrier).
        if not is_native(table) and data_manifest_count(table) > policy.max_manifests:
            return True
        if plan_compaction(table, policy, now_ms).bins:
            return True
    return False


def maintain(
    table: Table,
    policy: MaintenancePolicy,
    steps: Iterable[str] = STEPS,
    dry_run: bool = False,
    progress: Progress = no_progress,
    now_ms: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    holder: str | None = None,
    turn: Callable[[str], AbstractContextManager[None]] = no_turn,
) -> MaintenanceReport:
    """Run the chosen steps in order: retention, compact (then merge manifests), expire, delete orphans, holding
    the table's maintenance lease (streaming/maintenance/lease.py), kept alive while the steps run, every commit
    fenced by it. When another maintainer holds it, nothing runs, and when another takes it over, nothing more
    is committed: the report says so in `skipped`. A dry run changes nothing and takes no lease. An orphan age
    below the table's commit window is refused (ValueError) before anything is done. Each commit
    attempt waits for its `turn` among the service's writers (streaming/table/turns.py)."""
    steps = tuple(steps)
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise ValueError(f"maintenance steps {unknown}: expected some of {', '.join(STEPS)}")
    started = time.monotonic()
    lease = MaintenanceLease(table, policy.lease_s, holder, sleep=sleep)
    retrier = Retrier(table, sleep=sleep, lease=lease, turn=turn)
    retention = compaction = manifests = expiry = orphans = None
    skipped = None
    try:
        leased = False
        if not dry_run and _has_work(table, policy, steps, now_ms):
            if "orphans" in steps:
                check_orphan_age(table, policy.orphan_min_age_s, "maintenance_orphan_min_age_s")
            leased = lease.acquire()
        # A run with nothing to do takes no lease (each change of it is a commit), and its steps only
        # look, as in a dry run: every maintenance commit is fenced by the lease. Work that appears
        # meanwhile waits for the next run.
        looking = dry_run or not leased
        with lease.keep_alive() if leased else nullcontext():
            if "retention" in steps:
                retention = apply_retention(table, policy, dry_run=looking, now_ms=now_ms, retrier=retrier)
            if "compact" in steps:
                compaction = compact(table, policy, dry_run=looking, progress=progress, now_ms=now_ms, retrier=retrier)
                manifests = merge_manifests(table, policy, dry_run=looking, retrier=retrier)
            if "expire" in steps:
                expiry = expire_snapshots(
                    table, policy, dry_run=looking, progress=progress, now_ms=now_ms, retrier=retrier
                )
            if "orphans" in steps:
                orphans, _ = delete_orphans(
                    table, policy, dry_run=looking, progress=progress, lease=lease if leased else None
                )
    except (LeaseHeld, LeaseLost) as exc:
        skipped = str(exc)
    finally:
        lease.release()
    report = MaintenanceReport(
        ".".join(table.name()),
        dry_run,
        retention,
        compaction,
        manifests,
        expiry,
        orphans,
        time.monotonic() - started,
        skipped,
    )
    log.info("maintenance", extra={"summary": report.to_json()})
    return report
