"""Data files in a table's location that no snapshot references: written by a batch that never
committed (the process died between writing and committing). They are never read as data, since
readers follow the manifests; this finds them, and deletes them when asked."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyarrow import fs
from pyiceberg.table import Table


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


def find_orphans(table: Table, min_age_s: float = 3600.0) -> list[Orphan]:
    """Unreferenced files under <table location>/data older than min_age_s (younger ones may
    belong to a batch that is committing right now)."""
    data_dir = f"{table.location().rstrip('/')}/data"
    filesystem, root = fs.FileSystem.from_uri(data_dir if "://" in data_dir else f"file://{data_dir}")
    scheme = data_dir.split("://", 1)[0] + "://" if "://" in data_dir else ""
    referenced = referenced_files(table)
    now = time.time()
    orphans = []
    for info in filesystem.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != fs.FileType.File:
            continue
        path = _normalise(f"{scheme}{info.path}")
        age = now - info.mtime.timestamp() if info.mtime else float("inf")
        if path not in referenced and age >= min_age_s:
            orphans.append(Orphan(path, info.size or 0, age))
    return sorted(orphans, key=lambda o: o.path)


def delete_files(table: Table, paths: list[str]) -> None:
    for path in paths:
        table.io.delete(path)


def _normalise(path: str) -> str:
    return path.replace("file:///", "/").replace("file:/", "/")
