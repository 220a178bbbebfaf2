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
