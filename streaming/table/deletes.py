"""Reading an upsert table: the data files of a snapshot and the equality deletes that apply to them.

pyiceberg 0.12 refuses to plan a scan that meets an equality delete file, so `geoingest query` and
compaction plan upsert tables here. By the Iceberg spec an equality delete file applies to the data
files whose data sequence number is lower than its own: every key it lists removes the rows with
that key from those files (and none from the files of its own batch, which hold the new versions).
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

KEY_SEPARATOR = "\x1f"


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
                    {
                        "key": _joined_key(keys, columns),
                        "seq": pa.array(np.full(keys.num_rows, planned.sequence_number)),
                    }
                )
            )
        self.newest_sequence_number = max((p.sequence_number for p in deletes), default=0)
        # Keys listed over all files: each listing supersedes about one older row (its last version).
        self.listed = sum(int(p.file.record_count) for p in deletes)
        if parts:
            grouped = pa.concat_tables(parts).group_by("key", use_threads=False).aggregate([("seq", "max")])
            self._keys, self._seq = grouped.column("key").combine_chunks(), grouped.column("seq_max").combine_chunks()
        else:
            self._keys, self._seq = pa.array([], pa.string()), pa.array([], pa.int64())

    def __len__(self) -> int:
        return len(self._keys)

    def live(self, rows: pa.Table, sequence_number: int) -> pa.Table:
        """The rows of a data file of `sequence_number` that no later equality delete removes."""
        if not len(self) or rows.num_rows == 0:
            return rows
        applicable = self._keys.filter(pc.greater(self._seq, sequence_number))
        if len(applicable) == 0:
            return rows
        deleted = pc.is_in(_joined_key(rows, self.key_columns), value_set=applicable)
        return rows.filter(pc.invert(deleted))


def _joined_key(rows: pa.Table, columns: Sequence[str]) -> pa.Array:
    """One string per row for the key columns (joined by a separator no key column holds as text)."""
    texts = [pc.cast(rows.column(name), pa.string()).combine_chunks() for name in columns]
    if len(texts) == 1:
        return texts[0]
    return pc.binary_join_element_wise(*texts, KEY_SEPARATOR)
