"""The one place that changes a table: an idempotent, retried append of one micro-batch's files.

A batch is identified by (writer id, batch id), both recorded in the snapshot summary with the
Kafka offset range of every partition the batch consumed. Before appending, the committer looks
for a snapshot carrying the same identity: a replayed batch (the job died after the Iceberg commit
but before Spark recorded the batch) is then skipped instead of committed twice.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record

from streaming.writer import DataFileRecord

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
        """Exponential backoff with full jitter: retry 1 waits up to min_wait, doubling to max_wait."""
        ceiling = min(self.max_wait_ms, self.min_wait_ms * (2 ** (retry - 1)))
        return rng.uniform(self.min_wait_ms / 2, max(ceiling, self.min_wait_ms / 2))


class CommitRetriesExhausted(RuntimeError):
    def __init__(self, message: str, attempts: int, conflicts: int):
        super().__init__(message)
        self.attempts = attempts
        self.conflicts = conflicts


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
        policy = RetryPolicy.from_table_properties(self.table.properties)
        conflicts = 0
        attempt = 0
        while True:
            attempt += 1
            self.table.refresh()
            existing = committed_snapshot(self.table, batch.writer_id, batch.batch_id)
            if existing is not None:
                return CommitOutcome("skipped_replay", existing.snapshot_id, attempt, conflicts,
                                     time.monotonic() - started)
            try:
                snapshot_id = self._append(batch)
                return CommitOutcome("committed", snapshot_id, attempt, conflicts, time.monotonic() - started)
            except CommitFailedException as exc:
                conflicts += 1
                elapsed_ms = (time.monotonic() - started) * 1000
                if conflicts > policy.num_retries or elapsed_ms > policy.total_timeout_ms:
                    raise CommitRetriesExhausted(
                        f"batch {batch.batch_id} of writer {batch.writer_id} could not be committed to "
                        f"{'.'.join(self.table.name())} after {attempt} attempts in {elapsed_ms:.0f} ms: {exc}",
                        attempts=attempt, conflicts=conflicts,
                    ) from exc
                self.sleep(policy.wait_ms(conflicts, self.rng) / 1000)

    def _append(self, batch: BatchCommit) -> int:
        spec_id = self.table.metadata.default_spec_id
        with _single_attempt(self.table).transaction() as tx:
            with tx.update_snapshot(snapshot_properties=batch.summary()).fast_append() as append:
                for record in batch.files:
                    append.append_data_file(to_data_file(record, spec_id))
        self.table.refresh()
        snapshot = committed_snapshot(self.table, batch.writer_id, batch.batch_id)
        return snapshot.snapshot_id


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
