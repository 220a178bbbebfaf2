"""The snapshot producers pyiceberg 0.12 lacks.

- RowDelta: one snapshot that adds data files and equality delete files together, an upsert
  batch's commit. Iceberg's Java API calls it a row delta; pyiceberg 0.12 writes no delete files,
  so this producer extends its fast append (the same manifest list, summary and retry machinery)
  with a delete manifest. The equality deletes carry the batch's sequence number, so by the spec
  they remove the rows of the same keys in every older data file and none of the rows added beside
  them: one commit replaces the old versions of a batch's keys with the new ones, and drops the
  deleted keys.
- SpecAwareAppend: an append of data files of any of the table's specs.
- RewriteFiles: a compaction's "replace" snapshot, its new files on the sequence number of the
  snapshot the rewrite read when deletes overtook it.
"""

from __future__ import annotations

from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Transaction
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _FastAppendFiles, _OverwriteFiles
from pyiceberg.typedef import EMPTY_DICT, TableVersion
from pyiceberg.types import IntegerType, ListType, NestedField, StructType


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of delete files (pyiceberg's writer writes data manifests only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}

    def _with_partition(self, format_version: TableVersion) -> Schema:
        # pyiceberg 0.12 declares equality_ids a list<long>; the spec (and Java Iceberg, which
        # casts each id to Integer while planning) says list<int>. Avro encodes both alike, so only
        # the declared type changes.
        return _equality_ids_as_int(super()._with_partition(format_version))


def _equality_ids_as_int(schema: Schema) -> Schema:
    def fix(field: NestedField) -> NestedField:
        if field.name == "data_file" and isinstance(field.field_type, StructType):
            return NestedField(
                field.field_id,
                field.name,
                StructType(*(fix_id_list(f) for f in field.field_type.fields)),
                required=field.required,
                doc=field.doc,
            )
        return field

    def fix_id_list(field: NestedField) -> NestedField:
        if field.name == "equality_ids" and isinstance(field.field_type, ListType):
            element = field.field_type
            return NestedField(
                field.field_id,
                field.name,
                ListType(element.element_id, IntegerType(), element_required=element.element_required),
                required=field.required,
                doc=field.doc,
            )
        return field

    return Schema(*(fix(f) for f in schema.fields), schema_id=schema.schema_id)


class SpecAwareAppend(_FastAppendFiles):
    """A fast append of data files of any of the table's specs, each spec's in a manifest of its own
    (pyiceberg's writes every added file into one manifest of the default spec)."""

    def __init__(
        self,
        transaction: Transaction,
        snapshot_properties: dict[str, str] = EMPTY_DICT,
        operation: Operation = Operation.APPEND,
    ) -> None:
        super().__init__(
            operation=operation,
            transaction=transaction,
            io=transaction._table.io,
            snapshot_properties=snapshot_properties,
        )

    def _manifests(self) -> list[ManifestFile]:
        default = self._transaction.table_metadata.default_spec_id
        added = self._added_data_files
        others = [f for f in added if f.spec_id != default]
        if not others:
            return super()._manifests()
        self._added_data_files = [f for f in added if f.spec_id == default]
        try:
            manifests = super()._manifests()
        finally:
            self._added_data_files = added
        return manifests + _added_manifests(self, others, sequence_number=None)


class RowDelta(SpecAwareAppend):
    """A fast append that also adds equality delete files, in a delete manifest of its own."""

    def __init__(
        self,
        transaction: Transaction,
        snapshot_properties: dict[str, str] = EMPTY_DICT,
        delete_spec_id: int | None = None,
    ) -> None:
        super().__init__(transaction, snapshot_properties, Operation.OVERWRITE)
        self._added_delete_files: list[DataFile] = []
        # The spec of the delete files (the table's default if None)
        self._delete_spec_id = delete_spec_id

    def add_delete_file(self, delete_file: DataFile) -> RowDelta:
        if delete_file.content != DataFileContent.EQUALITY_DELETES:
            raise ValueError(f"{delete_file.file_path}: not an equality delete file ({delete_file.content})")
        self._added_delete_files.append(delete_file)
        return self

    def _manifests(self) -> list[ManifestFile]:
        manifests = super()._manifests()
        if not self._added_delete_files:
            return manifests
        writer = _DeleteManifestWriter(
            spec=(
                self._transaction.table_metadata.spec()
                if self._delete_spec_id is None
                else self._transaction.table_metadata.specs()[self._delete_spec_id]
            ),
            schema=self.schema(),
            output_file=self.new_manifest_output(),
            snapshot_id=self._snapshot_id,
            avro_compression=self._compression,
        )
        with writer:
            for delete_file in self._added_delete_files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=delete_file,
                    )
                )
        return [writer.to_manifest_file(), *manifests]

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # The summary collector counts delete files by their content; the data manifest must not
        # hold them, so they join the added files for the summary only.
        data_files = self._added_data_files
        self._added_data_files = [*data_files, *self._added_delete_files]
        try:
            return super()._summary(snapshot_properties)
        finally:
            self._added_data_files = data_files


class RewriteFiles(_OverwriteFiles):
    """Data files replaced by files of the same rows rewritten, the new files on the data sequence
    number `data_sequence_number`: the snapshot's the rewrite read when equality deletes were
    committed while it ran (Iceberg's rewrite does the same, `use-starting-sequence-number`), None
    for the commit's own, as pyiceberg gives every added file.

    Those deletes have a newer sequence number than the snapshot read, so they reach the rewritten
    rows as they reached the files replaced, and a retried commit needs no second rewrite; the
    deletes the rewrite applied are no newer than it, so they reach none of its files. Committed on
    the commit's own sequence number instead, the new files would escape the deletes of every batch
    that landed during the rewrite, and versions those batches replaced or deleted would come
    back."""

    def __init__(
        self,
        transaction: Transaction,
        data_sequence_number: int | None,
        snapshot_properties: dict[str, str] = EMPTY_DICT,
    ) -> None:
        # Built as an overwrite, committed as a replace (see _summary).
        super().__init__(
            operation=Operation.OVERWRITE,
            transaction=transaction,
            io=transaction._table.io,
            snapshot_properties=snapshot_properties,
        )
        self._data_sequence_number = data_sequence_number

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # A "replace" snapshot, as Java's RewriteFiles commits: streaming readers (Iceberg's Spark
        # source among them) skip it as rows they already read, where they stop at an overwrite.
        # pyiceberg 0.12 totals the summary of append, overwrite and delete snapshots only, so it
        # is totalled as the overwrite it is in content (the same files added and removed) and
        # then named a replace.
        summary = super()._summary(snapshot_properties)
        return Summary(Operation.REPLACE, **summary.additional_properties)

    def _manifests(self) -> list[ManifestFile]:
        added = self._added_data_files
        self._added_data_files = []
        try:
            manifests = super()._manifests()
        finally:
            self._added_data_files = added
        return manifests + _added_manifests(self, added, self._data_sequence_number)


def _added_manifests(
    producer: _FastAppendFiles | _OverwriteFiles, files: list[DataFile], sequence_number: int | None
) -> list[ManifestFile]:
    """One manifest per spec of the files the producer adds, their entries on `sequence_number`
    (None: the commit's own, inherited from the manifest)."""
    manifests = []
    specs = producer._transaction.table_metadata.specs()
    for spec_id in sorted({f.spec_id for f in files}):
        with producer.new_manifest_writer(spec=specs[spec_id]) as writer:
            for data_file in files:
                if data_file.spec_id == spec_id:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=producer._snapshot_id,
                            sequence_number=sequence_number,
                            file_sequence_number=None,
                            data_file=data_file,
                        )
                    )
        manifests.append(writer.to_manifest_file())
    return manifests
