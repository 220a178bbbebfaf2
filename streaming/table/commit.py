"""The one place that changes a table: an idempotent, retried append of one micro-batch's files.

A batch is identified by (writer id, batch id), both recorded in the snapshot summary with the
Kafka offset range of every partition the batch consumed. Before appending, the committer looks
for a snapshot carrying the same identity: a replayed batch (the job died after the Iceberg commit
but before Spark recorded the batch) is then skipped instead of committed twice. A replay reads
exactly the offsets it read before, so the identity alone is not trusted: a batch under a known
identity whose offsets differ (a writer id reused with a reset or restored checkpoint, which numbers
its batches from 0 again) is refused, since skipping it would drop its records in silence.

Snapshot expiry (streaming/maintenance/maintain.py) removes old snapshots, and their summaries with them.
Every maintenance snapshot therefore carries the history of every writer in `geoingest.writers`:
the batch ids it committed (as ranges), the snapshot of its last batch and the Kafka offsets it
covered. The replay check and the resume offsets read that history as well as the snapshots.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import requests
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    ServerError,
    ServiceUnavailableError,
    TooManyRequestsError,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record
from pyiceberg.types import GeometryType
from sqlalchemy.exc import InterfaceError, OperationalError

from streaming.table.catalog import unpartitioned_spec_id
from streaming.table.native import NativeTable, is_native, native_table
from streaming.table.row_delta import RowDelta, SpecAwareAppend
from streaming.table.turns import no_turn
from streaming.write.data_files import EQUALITY_DELETES, DataFileRecord
from streaming.write.evolution import ColumnPlan, add_columns, schema_changes

log = logging.getLogger("geoingest.commit")

# Errors that mean "the catalog was not there", not "the commit was refused": the SQL catalogs
# (SQLite file gone or locked, PostgreSQL down), network failures of the REST catalog (refused,
# reset, timed out: requests' own exceptions, which are not the built-in ones) and its answers
# that it is overloaded, failing or unsure whether the commit landed (5xx, 429).
CATALOG_UNAVAILABLE = (
    OperationalError,
    InterfaceError,
    ConnectionError,
    TimeoutError,
    requests.ConnectionError,
    requests.Timeout,
    ServiceUnavailableError,
    ServerError,
    TooManyRequestsError,
    CommitStateUnknownException,
)

WRITER_ID = "geoingest.writer-id"
BATCH_ID = "geoingest.batch-id"
KAFKA_OFFSETS = "geoingest.kafka-offsets"
ROWS = "geoingest.rows"
REJECTED = "geoingest.rejected"
# Written by maintenance snapshots only: what every writer committed before them (see WriterHistory).
WRITERS = "geoingest.writers"

# topic -> partition -> (first offset, last offset), both inclusive
Offsets = dict[str, dict[int, tuple[int, int]]]


@dataclass(frozen=True)
class BatchCommit:
    writer_id: str
    batch_id: int
    offsets: Offsets
    files: tuple[DataFileRecord, ...]
    rejected: int = 0
    # Upsert tables: equality delete files of the keys the batch replaces or deletes, on these field ids
    delete_files: tuple[DataFileRecord, ...] = ()
    equality_ids: tuple[int, ...] = ()
    # Columns, struct members and wider types the batch's files hold that the table may not have
    # yet (schema evolution): made the table's in the same commit as the files.
    schema_change: ColumnPlan = field(default_factory=ColumnPlan)

    @property
    def rows(self) -> int:
        return sum(f.record_count for f in self.files)

    def summary(self) -> dict[str, str]:
        return {
            WRITER_ID: self.writer_id,
            BATCH_ID: str(self.batch_id),
            KAFKA_OFFSETS: json.dumps(_offsets_to_json(self.offsets), separators=(",", ":")),
            ROWS: str(self.rows),
            REJECTED: str(self.rejected),
        }


@dataclass(frozen=True)
class CommitOutcome:
    status: str  # "committed" or "skipped_replay"
    snapshot_id: int | None
    attempts: int
    conflicts: int
    duration_s: float


@dataclass(frozen=True)
class RetryPolicy:
    """Iceberg's commit.retry.* table properties, with Iceberg's defaults."""

    num_retries: int = 4
    min_wait_ms: int = 100
    max_wait_ms: int = 60_000
    total_timeout_ms: int = 1_800_000

    @classmethod
    def from_table_properties(cls, props: dict[str, str]) -> RetryPolicy:
        d = cls()
        return cls(
            num_retries=int(props.get("commit.retry.num-retries", d.num_retries)),
            min_wait_ms=int(props.get("commit.retry.min-wait-ms", d.min_wait_ms)),
            max_wait_ms=int(props.get("commit.retry.max-wait-ms", d.max_wait_ms)),
            total_timeout_ms=int(props.get("commit.retry.total-timeout-ms", d.total_timeout_ms)),
        )

    def wait_ms(self, retry: int, rng: random.Random) -> float:
        """Iceberg's backoff: min_wait doubling per retry up to max_wait, plus up to 10 % jitter."""
        delay = min(self.max_wait_ms, self.min_wait_ms * (2 ** min(retry - 1, 30)))
        return delay + rng.uniform(0, 0.1 * delay)


class WriterIdReusedError(RuntimeError):
    """A batch's identity is in the table, over other Kafka offsets: not a replay, and not committable."""

    def __init__(self, table_name: str, batch: BatchCommit, recorded: RecordedBatch):
        if recorded.own:
            held = (
                f"it holds this writer's batch {batch.batch_id} over Kafka offsets {format_offsets(recorded.offsets)}"
            )
        else:
            held = (
                f"its history of this writer (batch {batch.batch_id}'s own snapshot has expired) covers Kafka offsets "
                f"{format_offsets(recorded.offsets)}"
            )
        super().__init__(
            f"batch {batch.batch_id} of writer {batch.writer_id} is not a replay of what {table_name} holds: {held}, "
            f"this batch read {format_offsets(batch.offsets)}. The writer id was reused with a reset or restored "
            "checkpoint; nothing of this batch was committed. Start with a new writer id (a new checkpoint folder, "
            "or another writer_id setting) and --resume-from-table to continue after the offsets the table holds"
        )
        self.writer_id = batch.writer_id
        self.batch_id = batch.batch_id


class CommitRetriesExhausted(RuntimeError):
    def __init__(self, message: str, attempts: int, conflicts: int, outcome_unknown: bool = False):
        super().__init__(message)
        self.attempts = attempts
        self.conflicts = conflicts
        # An attempt failed without an answer: the batch may be in the table after all.
        self.outcome_unknown = outcome_unknown


@dataclass(frozen=True)
class WriterHistory:
    """What a table records of one writer: the batch ids it committed, as sorted disjoint inclusive
    ranges; the snapshot of its newest batch; per topic-partition the offsets its batches covered."""

    batches: tuple[tuple[int, int], ...]
    last_batch_snapshot_id: int | None
    offsets: Offsets

    def has_batch(self, batch_id: int) -> bool:
        return any(first <= batch_id <= last for first, last in self.batches)

    def with_batch(self, batch_id: int, snapshot_id: int | None, offsets: Offsets) -> WriterHistory:
        newest = not self.batches or batch_id >= self.batches[-1][1]
        return WriterHistory(
            batches=_add_to_ranges(self.batches, batch_id),
            last_batch_snapshot_id=snapshot_id if newest else self.last_batch_snapshot_id,
            offsets=_merge_offsets(self.offsets, offsets),
        )

    def to_json(self) -> dict:
        return {
            "batches": [list(r) for r in self.batches],
            "last-batch-snapshot-id": self.last_batch_snapshot_id,
            "kafka-offsets": _offsets_to_json(self.offsets),
        }

    @classmethod
    def from_json(cls, raw: dict) -> WriterHistory:
        return cls(
            batches=tuple((int(a), int(b)) for a, b in raw.get("batches", [])),
            last_batch_snapshot_id=raw.get("last-batch-snapshot-id"),
            offsets=_offsets_from_json(raw.get("kafka-offsets", {})),
        )


def _add_to_ranges(ranges: tuple[tuple[int, int], ...], value: int) -> tuple[tuple[int, int], ...]:
    """The ranges with `value` added, adjacent and overlapping ranges merged."""
    merged: list[list[int]] = []
    for first, last in sorted([*ranges, (value, value)]):
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return tuple((a, b) for a, b in merged)


def _merge_offsets(a: Offsets, b: Offsets) -> Offsets:
    out: Offsets = {t: dict(parts) for t, parts in a.items()}
    for topic, parts in b.items():
        for partition, (first, last) in parts.items():
            known = out.setdefault(topic, {}).get(partition)
            out[topic][partition] = (first, last) if known is None else (min(known[0], first), max(known[1], last))
    return out


def format_offsets(offsets: Offsets) -> str:
    """Offset ranges as a line shows them: `topic/partition first-last`, comma separated."""
    ranges = [f"{t}/{p} {a}-{b}" for t, parts in sorted(offsets.items()) for p, (a, b) in sorted(parts.items())]
    return ", ".join(ranges) if ranges else "none"


def _offsets_to_json(offsets: Offsets) -> dict:
    return {t: {str(p): list(r) for p, r in sorted(parts.items())} for t, parts in sorted(offsets.items())}


def _offsets_from_json(raw: dict) -> Offsets:
    return {t: {int(p): (int(r[0]), int(r[1])) for p, r in parts.items()} for t, parts in raw.items()}


def _properties(snapshot: Snapshot) -> dict[str, str]:
    return snapshot.summary.additional_properties if snapshot.summary else {}


def history_carrier(snapshots: list[Snapshot]) -> Snapshot | None:
    """The newest snapshot carrying writer histories: it folds in everything committed before it."""
    carriers = [s for s in snapshots if WRITERS in _properties(s)]
    return max(carriers, key=lambda s: s.sequence_number or 0) if carriers else None


def writer_histories(snapshots: list[Snapshot]) -> dict[str, WriterHistory]:
    """Every writer's history: the newest carried one, plus the batches of the snapshots at hand."""
    carrier = history_carrier(snapshots)
    histories = (
        {w: WriterHistory.from_json(h) for w, h in json.loads(_properties(carrier)[WRITERS]).items()}
        if carrier is not None
        else {}
    )
    for snapshot in sorted(snapshots, key=lambda s: s.sequence_number or 0):
        props = _properties(snapshot)
        writer, batch = props.get(WRITER_ID), props.get(BATCH_ID)
        if writer is None or batch is None:
            continue
        offsets = _offsets_from_json(json.loads(props[KAFKA_OFFSETS])) if KAFKA_OFFSETS in props else {}
        empty = WriterHistory((), None, {})
        histories[writer] = histories.get(writer, empty).with_batch(int(batch), snapshot.snapshot_id, offsets)
    return histories


def writer_histories_json(snapshots: list[Snapshot]) -> str:
    """The `geoingest.writers` value a maintenance snapshot committed on top of `snapshots` carries."""
    return json.dumps({w: h.to_json() for w, h in sorted(writer_histories(snapshots).items())}, separators=(",", ":"))


@dataclass(frozen=True)
class RecordedBatch:
    """What the table records of one batch: its own snapshot and offsets; or, once that snapshot
    has expired, the maintenance snapshot whose carried history lists the batch id, and the offsets
    of all the writer's batches (per partition from its first to its last)."""

    snapshot: Snapshot
    offsets: Offsets
    own: bool

    def is_replay_of(self, offsets: Offsets) -> bool:
        """Whether a batch reading `offsets` replays this one. A replay reads the offsets Spark
        planned for the batch id before, so its own snapshot's must be equal. A carried history
        keeps only the writer's whole span, whose batches read every offset in it one after
        another: a batch within it holds records the table has, and skipping it loses nothing; a
        batch reaching beyond it would lose records, and is no replay."""
        mine = _offsets_from_json(_offsets_to_json(offsets))
        if self.own:
            return mine == self.offsets
        return all(
            p in self.offsets.get(t, {}) and self.offsets[t][p][0] <= a and b <= self.offsets[t][p][1]
            for t, parts in mine.items()
            for p, (a, b) in parts.items()
        )


def recorded_batch(table: Table, writer_id: str, batch_id: int) -> RecordedBatch | None:
    """The table's record of this batch, if any. Newest first: a replay is of a recent batch."""
    wanted = str(batch_id)
    for snapshot in reversed(table.metadata.snapshots):
        props = _properties(snapshot)
        if props.get(WRITER_ID) == writer_id and props.get(BATCH_ID) == wanted:
            offsets = _offsets_from_json(json.loads(props[KAFKA_OFFSETS])) if KAFKA_OFFSETS in props else {}
            return RecordedBatch(snapshot, offsets, own=True)
    carrier = history_carrier(table.metadata.snapshots)
    if carrier is not None:
        carried = json.loads(_properties(carrier)[WRITERS]).get(writer_id)
        if carried is not None:
            history = WriterHistory.from_json(carried)
            if history.has_batch(batch_id):
                return RecordedBatch(carrier, history.offsets, own=False)
    return None


def committed_snapshot(table: Table, writer_id: str, batch_id: int) -> Snapshot | None:
    """The snapshot that committed this batch, if any; once that snapshot has expired, the
    maintenance snapshot whose carried history holds the batch."""
    recorded = recorded_batch(table, writer_id, batch_id)
    return None if recorded is None else recorded.snapshot


def recorded_offsets(table: Table, writer_id: str | None = None) -> Offsets:
    """Per topic-partition, the offsets committed to the table (by one writer, or by any): the
    first and the last, read from the snapshots and the histories maintenance carried over."""
    result: Offsets = {}
    for writer, history in writer_histories(table.metadata.snapshots).items():
        if writer_id is None or writer == writer_id:
            result = _merge_offsets(result, history.offsets)
    return result


def resume_offsets(table: Table, topic: str, partitions: list[int]) -> str:
    """Spark startingOffsets that continue right after what the table holds of this topic:
    the next offset of every partition recorded, the earliest of any partition never seen."""
    recorded = recorded_offsets(table).get(topic, {})
    return json.dumps({topic: {str(p): recorded[p][1] + 1 if p in recorded else -2 for p in partitions}})


def data_spec_id(record: DataFileRecord, metadata: TableMetadata) -> int:
    """The spec a data file is committed under: the one it was written with (its partition values
    are that spec's, whatever the table's default became meanwhile: `table evolve` while a batch
    writes). A file that names no spec: the table's default when the file carries a value for each
    of its fields, else (a file written without partition values) an unpartitioned spec."""
    if record.spec_id is not None:
        spec = metadata.specs().get(record.spec_id)
        if spec is None:
            raise ValueError(
                f"{record.path}: written under partition spec {record.spec_id}, which the table no longer has "
                f"(its specs: {sorted(metadata.specs())})"
            )
        if len(spec.fields) != len(record.partition_values):
            raise ValueError(
                f"{record.path}: {len(record.partition_values)} partition values for spec {record.spec_id}, "
                f"which has {len(spec.fields)} fields"
            )
        return record.spec_id
    default = metadata.spec()
    if len(record.partition_values) == len(default.fields):
        return default.spec_id
    if not record.partition_values:
        for spec_id, spec in sorted(metadata.specs().items()):
            if not spec.fields:
                return spec_id
    raise ValueError(
        f"{record.path}: {len(record.partition_values)} partition values, and the table's spec "
        f"{default.spec_id} has {len(default.fields)} fields"
    )


def to_data_file(record: DataFileRecord, spec_id: int, equality_ids: Sequence[int] | None = None) -> DataFile:
    deletes = record.content == EQUALITY_DELETES
    if deletes and not equality_ids:
        raise ValueError(f"{record.path}: an equality delete file needs the primary key's field ids")
    data_file = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES if deletes else DataFileContent.DATA,
        file_path=record.path,
        file_format=FileFormat.PARQUET,
        partition=Record(*record.partition_values),
        file_size_in_bytes=record.file_size_in_bytes,
        record_count=record.record_count,
        sort_order_id=None,
        spec_id=spec_id,
        equality_ids=list(equality_ids) if deletes and equality_ids else None,
        key_metadata=None,
        **record.statistics(),
    )
    # Not a field of the file's struct: pyiceberg keeps it beside, and groups manifests by it.
    data_file.spec_id = spec_id
    return data_file


@dataclass
class Committer:
    table: Table
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)
    # Each attempt in its turn among the service's writers (streaming/table/turns.py).
    turn: Callable[[str], AbstractContextManager[None]] = no_turn
    # A native-geometry table as Iceberg Java loaded it, kept between commits.
    _native: NativeTable | None = field(default=None, init=False, repr=False)

    def refuse_if_reused(self, batch: BatchCommit) -> None:
        """Raise WriterIdReusedError when the table holds the batch's identity over other offsets.
        For a batch that commits elsewhere first (its rejects to the rejects table): refused here,
        it must not land there. An unreachable catalog defers the question to `commit`."""
        try:
            self.table.refresh()
        except CATALOG_UNAVAILABLE:
            return
        recorded = recorded_batch(self.table, batch.writer_id, batch.batch_id)
        if recorded is not None and not recorded.is_replay_of(batch.offsets):
            raise WriterIdReusedError(".".join(self.table.name()), batch, recorded)

    def commit(self, batch: BatchCommit) -> CommitOutcome:
        started = time.monotonic()
        conflicts = unavailable = 0
        attempt = 0
        while True:
            attempt += 1
            elapsed_ms = (time.monotonic() - started) * 1000
            try:
                with self.turn(f"batch {batch.batch_id}"):
                    return self._attempt(batch, attempt, conflicts, started)
            except CommitFailedException as exc:
                conflicts += 1
                policy = RetryPolicy.from_table_properties(self.table.properties)
                if conflicts > policy.num_retries or elapsed_ms > policy.total_timeout_ms:
                    raise self._exhausted(batch, attempt, conflicts, elapsed_ms, exc, unavailable > 0) from exc
                self.sleep(policy.wait_ms(conflicts, self.rng) / 1000)
            except CATALOG_UNAVAILABLE as exc:
                # The catalog could not be reached (or the answer was lost): wait for it as long as
                # commit.retry.total-timeout-ms allows; the replay check above settles a lost answer.
                unavailable += 1
                timeout_ms = RetryPolicy.from_table_properties(self.table.properties).total_timeout_ms
                if elapsed_ms > timeout_ms:
                    raise self._exhausted(batch, attempt, conflicts, elapsed_ms, exc, True) from exc
                policy = RetryPolicy.from_table_properties(self.table.properties)
                log.warning(
                    "catalog unavailable, retrying the commit",
                    extra={"batch": {"batch_id": batch.batch_id, "attempt": attempt, "error": str(exc)[:300]}},
                )
                self.sleep(policy.wait_ms(unavailable, self.rng) / 1000)

    def _attempt(self, batch: BatchCommit, attempt: int, conflicts: int, started: float) -> CommitOutcome:
        """One attempt: the replay check on a fresh table, then the append."""
        self.table.refresh()
        recorded = recorded_batch(self.table, batch.writer_id, batch.batch_id)
        if recorded is not None:
            if not recorded.is_replay_of(batch.offsets):
                raise WriterIdReusedError(".".join(self.table.name()), batch, recorded)
            # After an attempt whose outcome was unknown, the snapshot may be our own.
            if recorded.own:
                ours = attempt > 1 and _added_files(self.table, recorded.snapshot) == {
                    f.path for f in (*batch.files, *batch.delete_files)
                }
            else:
                # Known only from a carried history (the batch's snapshot has expired): its
                # files cannot be compared, and keeping ours is the side that loses nothing.
                ours = attempt > 1
            status = "committed" if ours else "skipped_replay"
            snapshot_id = recorded.snapshot.snapshot_id
            return CommitOutcome(status, snapshot_id, attempt, conflicts, time.monotonic() - started)
        snapshot_id = self._append(batch)
        return CommitOutcome("committed", snapshot_id, attempt, conflicts, time.monotonic() - started)

    def _exhausted(
        self,
        batch: BatchCommit,
        attempts: int,
        conflicts: int,
        elapsed_ms: float,
        exc: Exception,
        outcome_unknown: bool,
    ) -> CommitRetriesExhausted:
        return CommitRetriesExhausted(
            f"batch {batch.batch_id} of writer {batch.writer_id} could not be committed to "
            f"{'.'.join(self.table.name())}: {attempts} attempt(s) in {elapsed_ms:.0f} ms, "
            f"{conflicts} conflict(s); last error: {exc}",
            attempts=attempts,
            conflicts=conflicts,
            outcome_unknown=outcome_unknown,
        )

    def _append(self, batch: BatchCommit) -> int:
        if is_native(self.table):
            return self._append_native(batch)
        view = single_attempt_view(self.table)
        with view.transaction() as tx:
            if batch.schema_change:
                add_columns(tx, view.schema(), view.metadata.last_column_id, batch.schema_change)
            if batch.delete_files:
                # Unpartitioned deletes: a key's new version may land in another partition than its
                # old one (another day, another cell), and a partitioned delete reaches its own only.
                delete_spec_id = unpartitioned_spec_id(view)
                if delete_spec_id is None:
                    raise ValueError(
                        f"table {'.'.join(self.table.name())}: an upsert table needs an unpartitioned spec for its "
                        "equality deletes (geoingest creates one as spec 0)"
                    )
                delta = RowDelta(tx, snapshot_properties=batch.summary(), delete_spec_id=delete_spec_id)
                for record in batch.files:
                    delta.append_data_file(to_data_file(record, data_spec_id(record, view.metadata)))
                for record in batch.delete_files:
                    delta.add_delete_file(to_data_file(record, delete_spec_id, batch.equality_ids))
                delta.commit()
            else:
                append = SpecAwareAppend(tx, snapshot_properties=batch.summary())
                for record in batch.files:
                    append.append_data_file(to_data_file(record, data_spec_id(record, view.metadata)))
                append.commit()
        # The view now holds the metadata the catalog answered with: our snapshot is its current one.
        self.table.metadata, self.table.metadata_location = view.metadata, view.metadata_location
        snapshot = view.current_snapshot()
        if snapshot is None:
            raise RuntimeError(
                f"batch {batch.batch_id} of writer {batch.writer_id}: the catalog accepted the append to "
                f"{'.'.join(self.table.name())} but answered with a table that has no current snapshot"
            )
        return snapshot.snapshot_id

    def _append_native(self, batch: BatchCommit) -> int:
        """The batch's files committed by Iceberg Java (streaming/table/native.py), refused there
        if anything was appended since the snapshot the replay check saw. Data files under the
        spec they were written with, equality deletes under the unpartitioned one."""
        metadata = self.table.metadata
        added, widened = schema_changes(self.table.schema(), metadata.last_column_id, batch.schema_change)
        files = [(record, data_spec_id(record, metadata)) for record in batch.files]
        deletes = []
        if batch.delete_files:
            delete_spec_id = unpartitioned_spec_id(self.table)
            if delete_spec_id is None:
                raise ValueError(
                    f"table {'.'.join(self.table.name())}: an upsert table needs an unpartitioned spec for its "
                    "equality deletes (geoingest creates one as spec 0)"
                )
            deletes = [(record, delete_spec_id) for record in batch.delete_files]
        geometry_id = next(f.field_id for f in self.table.schema().fields if isinstance(f.field_type, GeometryType))
        checked = self.table.current_snapshot()
        if self._native is None:
            self._native = native_table(self.table)
        else:
            self._native.table.refresh()
        snapshot_id = self._native.commit(
            files,
            deletes,
            batch.equality_ids,
            geometry_id,
            batch.summary(),
            None if checked is None else checked.snapshot_id,
            [(path, kind.model_dump_json()) for path, kind in added],
            [(name, kind.model_dump_json()) for name, kind in widened],
        )
        self.table.refresh()
        return snapshot_id


def _added_files(table: Table, snapshot: Snapshot) -> set[str]:
    paths = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io):
            paths.add(entry.data_file.file_path)
    return paths


def single_attempt_view(table: Table, properties: dict[str, str] | None = None) -> Table:
    """The table as a transaction sees it, with pyiceberg's own commit retry turned off.

    pyiceberg retries a conflicting append by itself, re-applying it to the refreshed table
    without asking whether the batch landed meanwhile (another instance replaying it). The
    committer must check that before every attempt, so each transaction makes exactly one
    attempt. Only this local view changes: the catalog builds the committed metadata from its
    own current table plus the snapshot update, so the table keeps its properties; that is also
    why `properties` (e.g. manifest merging for one maintenance commit) stay with this view.
    """
    props = {**table.metadata.properties, **(properties or {}), "commit.retry.num-retries": "0"}
    return _SingleAttemptView(
        identifier=table.name(),
        metadata=table.metadata.model_copy(update={"properties": props}),
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=table.catalog,
    )


class _StagedMetadataTransaction(Transaction):
    """A transaction that builds the metadata it would commit once per staged change.

    pyiceberg's Transaction builds it afresh, as a deep copy of the whole table metadata (every
    snapshot and its summary), each time its snapshot producer asks for it: 15 times in one
    append. The cost grows with the snapshots the table keeps: measured on the demo table, a
    commit took 33 ms at 1 snapshot and 812 ms at 160 (79 % of it in those copies), so at the
    100 snapshots maintenance keeps it was most of a micro-batch's fixed cost. Staging replaces
    the updates tuple, never changes it, and a commit replaces the table's metadata: both by
    identity are the key. The metadata models are frozen; no caller changes what it gets."""

    _staged: tuple[TableMetadata, tuple, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        staged = self._staged
        if staged is not None and staged[0] is self._table.metadata and staged[1] is self._updates:
            return staged[2]
        metadata = super().table_metadata
        self._staged = (self._table.metadata, self._updates, metadata)
        return metadata


class _SingleAttemptView(Table):
    """The table view single_attempt_view makes: its transactions build their metadata once per change."""

    def transaction(self) -> Transaction:
        return _StagedMetadataTransaction(self)
