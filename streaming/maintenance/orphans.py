"""Files in a table's location that no snapshot references: data files written by a batch that never
committed (the process died between writing and committing) or by a compaction that died before its
commit, and, with `include_metadata`, manifests, manifest lists and metadata files that no snapshot or
metadata log entry names any more (failed attempts, expired snapshots, metadata versions past
write.metadata.previous-versions-max). They are never read, since readers follow the metadata; this
finds them, and deletes them when asked."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyiceberg.table import Table

from streaming.storage import data_location, list_files
from streaming.table.commit import RetryPolicy

# Beyond the table's commit retry window, what else may pass between a file written by ingest and
# the commit that references it landing: the rest of the batch's job after its first file (0.19 s
# a batch at 100,000 events/s; a batch that catches up on a backlog, max_offsets_per_trigger events,
# takes seconds at the rates measured, plus each slow geometry's repair budget), the last commit
# attempt itself, and the difference between the clock of the storage that dates the file and the
# maintainer's that ages it. Ten minutes is many times all of them; a batch whose job takes longer
# than that is beyond what the floor protects.
ORPHAN_AGE_MARGIN_S = 600.0


@dataclass(frozen=True)
class Orphan:
    path: str
    size: int
    age_s: float


def referenced_files(table: Table) -> set[str]:
    """Paths of every data file of every snapshot still in the table's metadata."""
    paths: set[str] = set()
    seen_manifests: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                paths.add(_normalise(entry.data_file.file_path))
    return paths


def referenced_metadata_files(table: Table) -> set[str]:
    """Paths of the metadata files the table still needs: the current and logged metadata files,
    every snapshot's manifest list and the manifests those lists name, statistics files."""
    metadata = table.metadata
    paths = {table.metadata_location, *(entry.metadata_file for entry in metadata.metadata_log)}
    paths.update(s.statistics_path for s in metadata.statistics)
    paths.update(s.statistics_path for s in metadata.partition_statistics)
    for snapshot in metadata.snapshots:
        paths.add(snapshot.manifest_list)
        paths.update(m.manifest_path for m in snapshot.manifests(table.io))
    return {_normalise(p) for p in paths}


def orphan_age_floor_s(table: Table) -> float:
    """The youngest an unreferenced file may be and still be deleted: an ingest commit retries for
    up to commit.retry.total-timeout-ms, and its last attempt may start one backoff later
    (commit.retry.max-wait-ms, plus Iceberg's 10 % jitter); then the margin above."""
    policy = RetryPolicy.from_table_properties(table.properties)
    return (policy.total_timeout_ms + 1.1 * policy.max_wait_ms) / 1000 + ORPHAN_AGE_MARGIN_S


def check_orphan_age(table: Table, min_age_s: float, setting: str) -> None:
    """ValueError, naming `setting` and the table's commit window, when unreferenced files younger
    than the floor would be deleted: an ingest commit in flight may still reference them."""
    floor = orphan_age_floor_s(table)
    if min_age_s < floor:
        policy = RetryPolicy.from_table_properties(table.properties)
        raise ValueError(
            f"{setting}: {min_age_s:g} s is below {floor:g} s, the longest an ingest commit to table "
            f"{'.'.join(table.name())} may still reference files it wrote: its commit.retry.total-timeout-ms "
            f"{policy.total_timeout_ms} and commit.retry.max-wait-ms {policy.max_wait_ms} (plus 10 %), and "
            f"{ORPHAN_AGE_MARGIN_S:g} s for the batch's job and clocks; deleting younger files could break that commit"
        )


def find_orphans(table: Table, min_age_s: float = 3600.0, include_metadata: bool = False) -> list[Orphan]:
    """Unreferenced files in the table's data location (<table location>/data, or its
    write.data.path) and under <table location>/staging (and /metadata, with include_metadata)
    older than min_age_s (younger ones may belong to a commit in flight).
    Nothing in staging/ is ever referenced: it holds the sorted runs of a batch between its two
    passes (streaming/write/task.py), left behind only by a batch that died and never ran again."""
    location = table.location().rstrip("/")
    folders = {data_location(table): referenced_files, f"{location}/staging": lambda _: set()}
    if include_metadata:
        folders[f"{location}/metadata"] = referenced_metadata_files
    now = time.time()
    orphans = []
    for where, referenced_by in folders.items():
        # Listed before the table is read again: a file committed in between is then referenced.
        stored = list_files(table.io, where)
        table.refresh()
        referenced = referenced_by(table)
        for file in stored:
            path = _normalise(file.uri)
            age = now - file.mtime_s if file.mtime_s is not None else float("inf")
            if path not in referenced and age >= min_age_s:
                orphans.append(Orphan(path, file.size, age))
    return sorted(orphans, key=lambda o: o.path)


def delete_files(table: Table, paths: list[str]) -> None:
    for path in paths:
        table.io.delete(path)


def _normalise(path: str) -> str:
    return path.replace("file:///", "/").replace("file:/", "/")
