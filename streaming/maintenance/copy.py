"""`geoingest table copy`: a table's live rows written into a new table of another contract, the way
a v2 table's rows reach a native-geometry (v3) table.

Iceberg upgrades a table's format in place (v2 to v3), but promotes no column from `binary` to
`geometry`: a v2 table's geometry reaches Iceberg's type only by writing its files again. The copy
is compaction into another table: the source's live files, bin by bin along the Hilbert curve, read
by field id with an upsert table's equality deletes applied, sorted again and written by the target's
writer (its geometry, partitions and file sizes), then committed to the target in one snapshot.

That snapshot carries the source's writer histories (`geoingest.writers`), so the target knows every
batch the source holds: the service pointed at the target with `--resume-from-table` goes on from
the offsets the source reached, and a batch the source committed is recognised as a replay. Stop
the service on the source first; batches it commits after the copy began are not in the copy.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from pyiceberg.table import Table
from pyiceberg.types import GeometryType

from streaming.contract import Contract
from streaming.maintenance.commits import Progress, delete_quietly, no_progress
from streaming.maintenance.compaction import equality_deletes_of, live_files, rewrite_bin
from streaming.maintenance.plan import plan_bins
from streaming.read.query import table_contract
from streaming.table.commit import WRITERS, data_spec_id, to_data_file, writer_histories_json
from streaming.table.native import is_native, native_table

COPIED_FROM = "geoingest.copied-from"
# Rows of one bin held in memory at most, as compaction's bins.
COPY_BIN_BYTES = 512 * 1024 * 1024


class CopyError(ValueError):
    """A copy the tables cannot take; the message names the table or column."""


@dataclass(frozen=True)
class CopyReport:
    source: str
    target: str
    source_snapshot_id: int | None
    files_read: int
    rows: int
    files_written: int
    bytes_written: int
    snapshot_id: int | None
    seconds: float

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "seconds": round(self.seconds, 3)}


def copy_table(
    source: Table,
    target: Table,
    target_contract: Contract,
    progress: Progress = no_progress,
    max_bin_bytes: int = COPY_BIN_BYTES,
) -> CopyReport:
    """Copy the source's live rows into the empty `target`, made from `target_contract`, in one commit."""
    started = time.monotonic()
    source.refresh()
    target.refresh()
    names = (".".join(source.name()), ".".join(target.name()))
    if target.current_snapshot() is not None:
        raise CopyError(f"table {names[1]}: it holds data already; a copy goes into a new, empty table")
    contract = table_contract(source)
    missing = [n for n in target_contract.arrow_schema.names if n not in contract.arrow_schema.names]
    if missing:
        raise CopyError(
            f"table {names[1]}: its contract has columns {missing} that {names[0]} has not; copy to a contract "
            "of the source's columns, then add them with `geoingest table evolve`"
        )
    snapshot = source.current_snapshot()
    if snapshot is None:
        return CopyReport(*names, None, 0, 0, 0, 0, None, time.monotonic() - started)
    # Every live file, whatever its size or age; a file without bounds sorts first.
    files = [dataclasses.replace(f, hilbert_key=f.hilbert_key or 0) for f, _ in live_files(source, contract)]
    deletes, sequence_numbers, _ = equality_deletes_of(source)
    total = sum(f.file_size_in_bytes for f in files)

    def overall(step: str, advance: int, _bin_total: int, unit: str) -> None:
        progress(step.replace("compact", "copy"), advance, total, unit)

    written = []
    try:
        for bin_ in plan_bins(files, max_bin_bytes, 1):
            written += rewrite_bin(
                source, target_contract, bin_, overall, deletes, sequence_numbers, target=target, file_prefix="copied"
            )
        summary = {WRITERS: writer_histories_json(source.metadata.snapshots), COPIED_FROM: names[0]}
        snapshot_id = _commit(target, written, summary)
    except BaseException:
        delete_quietly(target, [r.path for r in written])
        raise
    return CopyReport(
        *names,
        snapshot.snapshot_id,
        len(files),
        sum(r.record_count for r in written),
        len(written),
        sum(r.file_size_in_bytes for r in written),
        snapshot_id,
        time.monotonic() - started,
    )


def _commit(target: Table, written: list, summary: dict[str, str]) -> int | None:
    if not written:
        return None
    metadata = target.metadata
    if is_native(target):
        geometry_id = next(f.field_id for f in target.schema().fields if isinstance(f.field_type, GeometryType))
        files = [(r, data_spec_id(r, metadata)) for r in written]
        return native_table(target).commit(files, (), (), geometry_id, summary, None)
    with target.transaction() as transaction:
        with transaction.update_snapshot(snapshot_properties=summary).fast_append() as append:
            for record in written:
                append.append_data_file(to_data_file(record, data_spec_id(record, metadata)))
    snapshot = target.current_snapshot()
    return None if snapshot is None else snapshot.snapshot_id
