"""Reading an upsert table: the data files of a snapshot and the equality deletes that apply to them.

pyiceberg 0.12 refuses to plan a scan that meets an equality delete file, so `geoingest query` and
compaction plan upsert tables here. By the Iceberg spec an equality delete file applies to the data
files whose data sequence number is lower than its own: every key it lists removes the rows with
that key from those files (and none from the files of its own batch, which hold the new versions).

Keys are compared by value in their own Arrow type, over all their columns at once: a binary key
need not be text, and no joined form can make two different keys of several columns meet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

# Columns of the keys' table: positional names for the key columns, so none of them can take the
# name of the sequence number or the row index whatever the contract calls its columns.
_SEQUENCE = "sequence"
_ROW = "row"


def _key_names(count: int) -> list[str]:
    return [f"key{i}" for i in range(count)]


@dataclass(frozen=True)
class PlannedFile:
    """A live data file of a snapshot and its data sequence number."""

    file: DataFile
    sequence_number: int


@dataclass(frozen=True)
class SnapshotFiles:
    data: list[PlannedFile]
    equality_deletes: list[PlannedFile]

    def reaching_deletes(self) -> list[PlannedFile]:
        """The equality delete files that still reach a live data file (one with a lower sequence
        number). Once compaction has rewritten every file older than a delete file, that file
        reaches none, and readers need not load it."""
        if not self.data:
            return []
        oldest = min(p.sequence_number for p in self.data)
        return [d for d in self.equality_deletes if d.sequence_number > oldest]


def snapshot_files(table: Table, snapshot: Snapshot) -> SnapshotFiles:
    """Every live data and equality delete file of the snapshot, from its manifests."""
    data: list[PlannedFile] = []
    deletes: list[PlannedFile] = []
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            sequence = entry.sequence_number if entry.sequence_number is not None else manifest.sequence_number
            planned = PlannedFile(entry.data_file, int(sequence))
            if manifest.content == ManifestContent.DATA:
                data.append(planned)
            elif entry.data_file.content == DataFileContent.EQUALITY_DELETES:
                deletes.append(planned)
            else:
                raise ValueError(
                    f"table {'.'.join(table.name())}: {entry.data_file.file_path} is a position delete file, "
                    "which geoingest does not write or read"
                )
    return SnapshotFiles(data, deletes)


def has_delete_files(table: Table, snapshot: Snapshot | None) -> bool:
    return snapshot is not None and any(m.content == ManifestContent.DELETES for m in snapshot.manifests(table.io))


class EqualityDeletes:
    """The keys the equality delete files list, each with the highest sequence number that lists it."""

    def __init__(self, table: Table, deletes: Sequence[PlannedFile]):
        self.key_columns: tuple[str, ...] = ()
        parts: list[pa.Table] = []
        schema = table.schema()
        for planned in deletes:
            ids = planned.file.equality_ids or []
            columns = tuple(schema.find_field(i).name for i in ids)
            if self.key_columns and columns != self.key_columns:
                raise ValueError(
                    f"{planned.file.file_path}: equality deletes on {list(columns)}, others on {list(self.key_columns)}"
                )
            self.key_columns = columns
            with table.io.new_input(planned.file.file_path).open() as stream:
                keys = pq.read_table(stream, columns=list(columns))
            parts.append(
                pa.table(
                    [*keys.columns, pa.array(np.full(keys.num_rows, planned.sequence_number, dtype=np.int64))],
                    names=[*_key_names(len(columns)), _SEQUENCE],
                )
            )
        self.newest_sequence_number = max((p.sequence_number for p in deletes), default=0)
        # Keys listed over all files: each listing supersedes about one older row (its last version).
        self.listed = sum(int(p.file.record_count) for p in deletes)
        self._keys: pa.Table | None = None
        if parts:
            names = _key_names(len(self.key_columns))
            grouped = (
                pa.concat_tables(parts, promote_options="permissive")
                .group_by(names, use_threads=False)
                .aggregate([(_SEQUENCE, "max")])
            )
            if grouped.num_rows:
                self._keys = grouped.select([*names, f"{_SEQUENCE}_max"]).rename_columns([*names, _SEQUENCE])
                self._keys = self._keys.combine_chunks()

    def __len__(self) -> int:
        return 0 if self._keys is None else self._keys.num_rows

    def live(self, rows: pa.Table, sequence_number: int) -> pa.Table:
        """The rows of a data file of `sequence_number` that no later equality delete removes."""
        if self._keys is None or rows.num_rows == 0:
            return rows
        applicable = self._keys.filter(pc.greater(self._keys.column(_SEQUENCE), sequence_number))
        if applicable.num_rows == 0:
            return rows
        return rows.filter(pc.invert(pa.array(listed_mask(rows, self.key_columns, applicable.drop([_SEQUENCE])))))


def listed_mask(rows: pa.Table, key_columns: Sequence[str], listed: pa.Table) -> np.ndarray:
    """Per row of `rows`, whether its key (the values of `key_columns`) is one of the rows of
    `listed` (the same columns, by position). Compared by value in the rows' own types: is_in on
    one column, a hash semi-join on several (which returns rows in no set order, hence the index)."""
    names = _key_names(len(key_columns))
    types = [rows.schema.field(name).type for name in key_columns]
    listed = pa.table([listed.column(i).cast(t) for i, t in enumerate(types)], names=names)
    if len(key_columns) == 1:
        found = pc.is_in(rows.column(key_columns[0]), value_set=listed.column(0).combine_chunks())
        return pc.fill_null(found, False).to_numpy(zero_copy_only=False)
    probe = pa.table(
        [*(rows.column(name) for name in key_columns), pa.array(np.arange(rows.num_rows, dtype=np.int64))],
        names=[*names, _ROW],
    )
    hits = probe.join(listed, keys=names, join_type="left semi", use_threads=False)
    mask = np.zeros(rows.num_rows, dtype=bool)
    mask[hits.column(_ROW).to_numpy()] = True
    return mask
