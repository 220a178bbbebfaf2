"""The one place that changes a table: an idempotent, retried append of one micro-batch's files.

A batch is identified by (writer id, batch id), both recorded in the snapshot summary with the
Kafka offset range of every partition the batch consumed. Before appending, the committer looks
for a snapshot carrying the same identity: a replayed batch (the job died after the Iceberg commit
but before Spark recorded the batch) is then skipped instead of committed twice.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyiceberg.exceptions import CommitFailedException
from sqlalchemy.exc import OperationalError, InterfaceError
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record

from streaming.writer import DataFileRecord

log = logging.getLogger("geoingest.commit")

# Errors that mean "the catalog was not there", not "the commit was refused": the SQL catalogs
# (SQLite file gone or locked, PostgreSQL down) and network failures of the REST catalog.
CATALOG_UNAVAILABLE = (OperationalError, InterfaceError, ConnectionError, TimeoutError)

WRITER_ID = "geoingest.writer-id"
BATCH_ID = "geoingest.batch-id"
KAFKA_OFFSETS = "geoingest.kafka-offsets"
ROWS = "geoingest.rows"
REJECTED = "geoingest.rejected"

# topic -> partition -> (first offset, last offset), both inclusive
Offsets = dict[str, dict[int, tuple[int, int]]]


@dataclass(frozen=True)
class BatchCommit:
    writer_id: str
    batch_id: int
    offsets: Offsets
    files: tuple[DataFileRecord, ...]
    rejected: int = 0

    @property
    def rows(self) -> int:
        return sum(f.record_count for f in self.files)

    def summary(self) -> dict[str, str]:
        return {
            WRITER_ID: self.writer_id,
            BATCH_ID: str(self.batch_id),
            KAFKA_OFFSETS: json.dumps(
                {t: {str(p): list(r) for p, r in sorted(parts.items())} for t, parts in sorted(self.offsets.items())},
                separators=(",", ":"),
            ),
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


class CommitRetriesExhausted(RuntimeError):
    def __init__(self, message: str, attempts: int, conflicts: int, outcome_unknown: bool = False):
        super().__init__(message)
        self.attempts = attempts
        self.conflicts = conflicts
        # An attempt failed without an answer: the batch may be in the table after all.
        self.outcome_unknown = outcome_unknown


def committed_snapshot(table: Table, writer_id: str, batch_id: int) -> Snapshot | None:
    """The snapshot that committed this batch, if any. Newest first: a replay is of a recent batch."""
    wanted = str(batch_id)
    for snapshot in reversed(table.metadata.snapshots):
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get(WRITER_ID) == writer_id and props.get(BATCH_ID) == wanted:
            return snapshot
    return None


def recorded_offsets(table: Table, writer_id: str | None = None) -> Offsets:
    """Per topic-partition, the last offset committed to the table (by one writer, or by any)."""
    result: Offsets = {}
    for snapshot in table.metadata.snapshots:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if KAFKA_OFFSETS not in props or (writer_id is not None and props.get(WRITER_ID) != writer_id):
            continue
        for topic, parts in json.loads(props[KAFKA_OFFSETS]).items():
            for partition, (first, last) in parts.items():
                known = result.setdefault(topic, {}).get(int(partition))
                if known is None or last > known[1]:
                    result[topic][int(partition)] = (first if known is None else known[0], last)
    return result


def resume_offsets(table: Table, topic: str, partitions: list[int]) -> str:
    """Spark startingOffsets that continue right after what the table holds of this topic:
    the next offset of every partition recorded, the earliest of any partition never seen."""
    recorded = recorded_offsets(table).get(topic, {})
    return json.dumps({topic: {str(p): recorded[p][1] + 1 if p in recorded else -2 for p in partitions}})


def to_data_file(record: DataFileRecord, spec_id: int) -> DataFile:
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=record.path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        file_size_in_bytes=record.file_size_in_bytes,
        record_count=record.record_count,
        sort_order_id=None,
        spec_id=spec_id,
        equality_ids=None,
        key_metadata=None,
        **record.statistics(),
    )


@dataclass
class Committer:
    table: Table
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def commit(self, batch: BatchCommit) -> CommitOutcome:
        started = time.monotonic()
        conflicts = unavailable = 0
        attempt = 0
        while True:
            attempt += 1
            elapsed_ms = (time.monotonic() - started) * 1000
            try:
                self.table.refresh()
                policy = RetryPolicy.from_table_properties(self.table.properties)
                existing = committed_snapshot(self.table, batch.writer_id, batch.batch_id)
                if existing is not None:
                    # After an attempt whose outcome was unknown, the snapshot may be our own.
                    status = "committed" if attempt > 1 and _added_files(self.table, existing) == {
                        f.path for f in batch.files} else "skipped_replay"
                    return CommitOutcome(status, existing.snapshot_id, attempt, conflicts,
                                         time.monotonic() - started)
                snapshot_id = self._append(batch)
                return CommitOutcome("committed", snapshot_id, attempt, conflicts, time.monotonic() - started)
            except CommitFailedException as exc:
                conflicts += 1
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
                log.warning("catalog unavailable, retrying the commit",
                            extra={"batch": {"batch_id": batch.batch_id, "attempt": attempt, "error": str(exc)[:300]}})
                self.sleep(policy.wait_ms(unavailable, self.rng) / 1000)

    def _exhausted(self, batch: BatchCommit, attempts: int, conflicts: int, elapsed_ms: float,
                   exc: Exception, outcome_unknown: bool) -> CommitRetriesExhausted:
        return CommitRetriesExhausted(
            f"batch {batch.batch_id} of writer {batch.writer_id} could not be committed to "
            f"{'.'.join(self.table.name())}: {attempts} attempt(s) in {elapsed_ms:.0f} ms, "
            f"{conflicts} conflict(s); last error: {exc}",
            attempts=attempts, conflicts=conflicts, outcome_unknown=outcome_unknown,
        )

    def _append(self, batch: BatchCommit) -> int:
        spec_id = self.table.metadata.default_spec_id
        view = _single_attempt(self.table)
        with view.transaction() as tx:
            with tx.update_snapshot(snapshot_properties=batch.summary()).fast_append() as append:
                for record in batch.files:
                    append.append_data_file(to_data_file(record, spec_id))
        # The view now holds the metadata the catalog answered with: our snapshot is its current one.
        self.table.metadata, self.table.metadata_location = view.metadata, view.metadata_location
        return view.current_snapshot().snapshot_id


def _added_files(table: Table, snapshot: Snapshot) -> set[str]:
    paths = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io):
            paths.add(entry.data_file.file_path)
    return paths


def _single_attempt(table: Table) -> Table:
    """The table as a transaction sees it, with pyiceberg's own commit retry turned off.

    pyiceberg retries a conflicting append by itself, re-applying it to the refreshed table
    without asking whether the batch landed meanwhile (another instance replaying it). The
    committer must check that before every attempt, so each transaction makes exactly one
    attempt. Only this local view changes: the catalog builds the committed metadata from its
    own current table plus the snapshot update, so the table keeps its properties.
    """
    props = {**table.metadata.properties, "commit.retry.num-retries": "0"}
    return Table(
        identifier=table.name(),
        metadata=table.metadata.model_copy(update={"properties": props}),
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=table.catalog,
    )
