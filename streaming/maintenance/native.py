"""Maintenance commits of native-geometry (v3) tables, made by Iceberg Java (streaming/table/native.py):
pyiceberg 0.12 plans them, as it does for v2 tables, and writes no v3 metadata.

Each commit is one attempt on the metadata it was built from: Iceberg's own operation (a rewrite, a
delete, an empty append) applied to the table as Iceberg Java last read it, then handed to the
catalog with `TableOperations.commit(base, new)`, which refuses it (CommitFailedException) when the
table changed since `base`. Iceberg Java's own retry, which re-applies an operation to the changed
table by itself, is not used: the maintenance step's Retrier plans again, with the table's
commit.retry.* backoff, exactly as for a pyiceberg commit.

The lease's fence (streaming/maintenance/lease.py) is checked on that same `base`: the holder's
generation tag must be where the holder last saw it, and a commit that makes a snapshot moves the
tag to it. So a SQLite catalog (whose commit swaps the metadata file only if it is still `base`)
and a REST catalog (which asserts the tag where the commit moves it) both refuse a commit of a
maintainer whose lease was taken over. An expiry makes no snapshot and moves no tag: a REST catalog
asserts nothing of the lease for it, and a maintainer that lost its lease can at most expire the
snapshots it planned to (the files it then deletes are the ones no snapshot left references).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.types import GeometryType

from streaming.table.native import NativeTable, java_commit_errors, native_table
from streaming.write.data_files import DataFileRecord

MAIN = "main"


@dataclass
class Fence:
    """The lease generation's tag and the snapshot it must point at for a commit to land;
    `moved_to`: where the commit moved it (the snapshot it made), once it landed."""

    tag: str
    snapshot_id: int | None
    moved_to: int | None = None


def geometry_field_id(table: Table) -> int:
    return next(f.field_id for f in table.schema().fields if isinstance(f.field_type, GeometryType))


def _java_long_set(native: NativeTable, values: Collection[int]) -> Any:
    """A java.util.Set<Long> (py4j hands a small Python int over as an Integer, which equals no Long)."""
    jvm = native.java.jvm
    array = native.java.gateway.new_array(jvm.long, len(values))
    for i, value in enumerate(values):
        array[i] = value
    return jvm.java.util.stream.LongStream.of(array).boxed().collect(jvm.java.util.stream.Collectors.toSet())


def _live_data_files(native: NativeTable, paths: Collection[str], what: str) -> dict[str, Any]:
    """Iceberg Java's DataFile of each of `paths` (a removal names the file by its entry);
    CommitFailedException when the current snapshot no longer holds one of the `what`."""
    table = native.table
    snapshot = table.currentSnapshot()
    found: dict[str, Any] = {}
    wanted = set(paths)
    for manifest in [] if snapshot is None else snapshot.dataManifests(table.io()):
        entries = native.java.iceberg.ManifestFiles.read(manifest, table.io(), table.specs()).iterator()
        try:
            while entries.hasNext():
                data_file = entries.next()
                path = str(data_file.location())
                if path in wanted:
                    found[path] = data_file.copy()
        finally:
            entries.close()
    missing = [p for p in paths if p not in found]
    if missing:
        raise CommitFailedException(f"{what} no longer in the table: {missing[:3]}")
    return found


def _commit(native: NativeTable, build: Any, fence: Fence | None, snapshot_id: int | None) -> None:
    """Hand the metadata `build` (a TableMetadata.Builder on the table's current metadata) to the
    catalog as one attempt, fenced, the fence's tag moved to `snapshot_id` if one was made."""
    base = native.table.operations().current()
    if fence is not None:
        ref = base.ref(fence.tag)
        if ref is None or int(ref.snapshotId()) != fence.snapshot_id:
            raise CommitFailedException(f"maintenance lease tag {fence.tag} is no longer where its holder put it")
        if snapshot_id is not None:
            build = build.setRef(fence.tag, native.java.iceberg.SnapshotRef.tagBuilder(snapshot_id).build())
    native.table.operations().commit(base, build.build())
    if fence is not None and snapshot_id is not None:
        fence.moved_to = snapshot_id


def _commit_snapshot(native: NativeTable, operation: Any, summary: Mapping[str, str], fence: Fence | None) -> int:
    """Apply a snapshot-making operation to the table as Iceberg Java reads it now and commit the snapshot."""
    for key, value in summary.items():
        operation.set(key, value)
    snapshot = native.java.unhurried(operation).apply()  # reads the table afresh: `current()` is then its base
    base = native.table.operations().current()
    snapshot_id = int(snapshot.snapshotId())
    build = native.java.iceberg.TableMetadata.buildFrom(base).setBranchSnapshot(snapshot, MAIN)
    _commit(native, build, fence, snapshot_id)
    return snapshot_id


def _refreshed(table: Table) -> NativeTable:
    native = native_table(table)
    native.table.refresh()
    return native


def rewrite(
    table: Table,
    sources: Sequence[str],
    outputs: Sequence[tuple[DataFileRecord, int]],
    summary: Mapping[str, str],
    validate_from: int | None,
    data_sequence_number: int | None,
    fence: Fence | None,
) -> int:
    """Replace the data files `sources` by `outputs` (each with its spec id) in one "replace" snapshot.
    Iceberg's RewriteFiles checks that every source is still live, and that no delete reaching a source
    was added since `validate_from`, unless the outputs take `data_sequence_number` (the planned
    snapshot's), which such deletes still reach."""
    with java_commit_errors():
        native = _refreshed(table)
        live = _live_data_files(native, sources, "compaction sources")
        geometry_id = geometry_field_id(table)
        operation = native.table.newRewrite()
        for path in sources:
            operation.deleteFile(live[path])
        for record, spec_id in outputs:
            operation.addFile(native.data_file(record, spec_id, geometry_id))
        if validate_from is not None:
            operation.validateFromSnapshot(validate_from)
        if data_sequence_number is not None:
            operation.dataSequenceNumber(data_sequence_number)
        return _commit_snapshot(native, operation, summary, fence)


def remove(table: Table, paths: Sequence[str], summary: Mapping[str, str], fence: Fence | None) -> int:
    """Remove data files from the table in one "delete" snapshot, no file read or written; refused
    (ValidationException) when one is gone meanwhile."""
    with java_commit_errors():
        native = _refreshed(table)
        live = _live_data_files(native, paths, "data files to remove")
        operation = native.table.newDelete()
        for path in paths:
            operation.deleteFile(live[path])
        operation.validateFilesExist()
        return _commit_snapshot(native, operation, summary, fence)


def carrier(table: Table, summary: Mapping[str, str], fence: Fence | None) -> int:
    """A snapshot of no new file, whose summary carries `summary` (the writers' histories expiry keeps)."""
    with java_commit_errors():
        native = _refreshed(table)
        return _commit_snapshot(native, native.table.newFastAppend(), summary, fence)


def expire(table: Table, snapshot_ids: Collection[int], fence: Fence | None) -> None:
    """Remove these snapshots from the table's metadata (their files are deleted by the caller, which
    knows what else still references them)."""
    with java_commit_errors():
        native = _refreshed(table)
        base = native.table.operations().current()
        build = native.java.iceberg.TableMetadata.buildFrom(base).removeSnapshots(_java_long_set(native, snapshot_ids))
        _commit(native, build, fence, None)


def change_refs(
    table: Table, remove_tags: Sequence[str], set_tags: Mapping[str, int], properties: Mapping[str, str]
) -> None:
    """One commit removing tags, setting tags (name: snapshot id) and table properties, on the
    metadata `table` holds (a change of the maintenance lease, decided on what it read): refused
    when the table changed since, by the catalog (a SQLite catalog on any change, a REST catalog
    asserts each set tag absent or where it was read) or here, when Iceberg Java already reads
    newer metadata."""
    with java_commit_errors():
        native = _refreshed(table)
        iceberg = native.java.iceberg
        base = native.table.operations().current()
        if str(base.metadataFileLocation()) != table.metadata_location:
            raise CommitFailedException(f"table {'.'.join(table.name())} changed since it was read")
        build = iceberg.TableMetadata.buildFrom(base)
        for tag in remove_tags:
            if base.ref(tag) is not None:
                build = build.removeRef(tag)
        for tag, snapshot_id in set_tags.items():
            build = build.setRef(tag, iceberg.SnapshotRef.tagBuilder(snapshot_id).build())
        build = build.setProperties(native.java.java_map(properties))
        native.table.operations().commit(base, build.build())
