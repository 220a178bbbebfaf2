"""One micro-batch, decode to commit: the foreachBatch function of the streaming query.

The batch's files are laid out as `clustering` says (streaming/job/layout.py); the driver then
commits them once, idempotently per (writer id, batch id), after the batch's rejects if the
service keeps a rejects table, and reports the batch to its observers (logs, metrics, the demo).
Under `schema_evolution: add-columns` a scan of the batch's properties first plans the columns the
batch adds, committed with its files. Rows never reach the driver.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.table import Table
from pyiceberg.types import DecimalType, FloatType, IntegerType, ListType, MapType, StructType
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from streaming.contract import Contract
from streaming.decode.isolation import worker_crashed
from streaming.decode.properties import mapped_names
from streaming.job.config import (
    CLUSTERING_MODES,
    SOURCES,
    JobConfig,
)
from streaming.job.layout import BatchLayout, discard
from streaming.storage import data_location
from streaming.table.catalog import table_contract
from streaming.table.commit import (
    BatchCommit,
    CommitOutcome,
    CommitRetriesExhausted,
    Committer,
    Offsets,
    WriterIdReusedError,
)
from streaming.table.turns import CommitTurns
from streaming.write.data_files import (
    DataFileRecord,
    parquet_write_options,
)
from streaming.write.dead_letter import DeadLetterFailed
from streaming.write.evolution import (
    PROPERTY_SCAN_SCHEMA,
    ColumnPlan,
    PropertyScan,
    SchemaMoved,
    plan_new_columns,
    seen_from_rows,
)
from streaming.write.rejects_table import RejectsTableFiles
from streaming.write.task import (
    BatchResults,
    Tally,
)
from streaming.write.upsert import equality_field_ids

# Writes of one batch when other writers keep changing the table's schema under it
_SCHEMA_ATTEMPTS = 3
# The Spark local property that tells a batch's tasks how many of them there are
STAGE_TASKS_PROPERTY = "geoingest.stage.tasks"

log = logging.getLogger("geoingest.job")


TaskFunction = Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch did; handed to observers (logs, metrics, the demo summary)."""

    batch_id: int
    consumed: int
    committed_rows: int
    rejected: dict[str, int]
    files: tuple[DataFileRecord, ...]
    offsets: Offsets
    outcome: CommitOutcome | None
    seconds: dict[str, float]
    # "topic/partition" -> Kafka timestamp (ms) of the oldest record in the batch
    oldest_event_ms: dict[str, int] = field(default_factory=dict)
    # Property names no column maps, and why (under schema_evolution "off": in the decoders' sample)
    ignored_properties: dict[str, str] = field(default_factory=dict)
    # Columns (and struct members, by path) this batch added to the table (schema_evolution "add-columns")
    added_columns: tuple[str, ...] = ()
    # Kafka timestamps of the batch's valid records, binned: (first ms, width ms, records)
    event_times: tuple[tuple[int, int, int], ...] = ()
    table: str = ""  # the table the batch is for (a service of many tables reports them all)


class BatchProcessor:
    """The foreachBatch function: one micro-batch in, one commit out."""

    def __init__(
        self,
        spark: SparkSession,
        table: Table,
        contract: Contract,
        config: JobConfig,
        observers: tuple[Callable[[BatchReport], None], ...] = (),
        turns: CommitTurns | None = None,
        records_given: bool = False,
    ):
        """records_given: the batches handed over hold Kafka records whatever the source (a split
        topic's share, streaming/job/split.py), not the Python source's offset ranges."""
        if config.clustering not in CLUSTERING_MODES:
            raise ValueError(f"clustering: {config.clustering!r} is not one of {list(CLUSTERING_MODES)}")
        if config.source not in SOURCES:
            raise ValueError(f"source: {config.source!r} is not one of {list(SOURCES)}")
        if contract.mode == "upsert" and config.clustering == "shuffle":
            raise ValueError(
                f"clustering: 'shuffle' cannot write the upsert table {contract.table} (its versions are "
                "chosen per input partition); use 'batch' or 'task'"
            )
        self.spark = spark
        self.table = table
        self.config = config
        self.observers = observers
        self.committer = Committer(table, turn=turns.turn) if turns is not None else Committer(table)
        # Rejects are committed to their own table (setting rejects_table) before the batch's data.
        self.rejects_table = table.catalog.load_table(config.rejects_table) if config.rejects_table else None
        self.rejects_committer = Committer(self.rejects_table) if self.rejects_table is not None else None
        # The contract file's columns, and the ones the table gained since (schema evolution):
        # refreshed when the table's schema changes, and per batch when it adds columns.
        self._file_contract = contract
        self.contract = table_contract(table, contract)
        self._schema_id = table.metadata.current_schema_id
        self._ignored_logged: set[str] = set()
        # Unix time the batch in progress started (None between batches): readiness watches it.
        self.running_since: float | None = None
        # A StructType, not a DDL string: Spark parses a DDL string in the JVM, once per batch.
        self._spark_scan_schema = from_arrow_schema(PROPERTY_SCAN_SCHEMA)
        self.parallelism = config.parallelism or spark.sparkContext.defaultParallelism
        self.layout = BatchLayout(spark, table, config, self.parallelism, records_given)
        parquet_write_options(table.properties)  # a codec the writers cannot use stops the start, not a batch
        # Why the query stopped, in one line, when the cause is ours (a dead letter that could not
        # be written): Spark would report it as a Python traceback inside its own.
        self.fatal_error: str | None = None

    def __call__(self, batch: DataFrame, batch_id: int, covers: Offsets | None = None) -> None:
        """covers: the offsets the commit records as done, when the batch is a share of a larger one
        (a split topic's: its other records went to other tables or were dead letters)."""
        self.running_since = time.time()
        try:
            self._with_schema_retries(batch, batch_id, covers)
        finally:
            self.running_since = None

    def _with_schema_retries(self, batch: DataFrame, batch_id: int, covers: Offsets | None) -> None:
        started = time.monotonic()
        for attempt in range(1, _SCHEMA_ATTEMPTS + 1):
            self._follow_table_schema()
            try:
                self._ingest_and_commit(batch, batch_id, started, covers)
                return
            except SchemaMoved as exc:
                if attempt == _SCHEMA_ATTEMPTS:
                    raise
                # Another writer changed the schema under this batch: write it again on the new one.
                log.warning(
                    "the table's schema moved under the batch; writing it again",
                    extra={"batch": {"batch_id": batch_id, "error": str(exc)}},
                )
                self.table.refresh()

    def _follow_table_schema(self) -> None:
        if self.table.metadata.current_schema_id != self._schema_id:
            self.contract = table_contract(self.table, self._file_contract)
            self._schema_id = self.table.metadata.current_schema_id

    def _ingest_and_commit(self, batch: DataFrame, batch_id: int, started: float, covers: Offsets | None) -> None:
        timings: dict[str, float] = {}
        plan = self._plan_columns(batch, timings)
        table_columns = self.contract
        if plan:
            self.contract = plan.applied(table_columns)
        try:
            self._write_and_commit(batch, batch_id, started, timings, plan, covers)
        finally:
            # The table has the new columns only once the commit made them its own.
            self.contract = table_columns

    def _plan_columns(self, batch: DataFrame, timings: dict[str, float]) -> ColumnPlan:
        """Under "add-columns", the batch's new columns: from a scan of its properties."""
        if self.contract.schema_evolution.mode != "add-columns":
            return ColumnPlan()
        step = time.monotonic()
        registry = self.contract if self.contract.registry is not None else None
        debezium = self.contract if self.contract.debezium is not None else None
        # A nested column's property is scanned too: the members its structs' values hold may be new.
        nested = {
            src.removeprefix("properties.")
            for c in self.contract.all_columns
            if isinstance(c.iceberg_type, StructType | ListType | MapType)
            for src in c.sources
            if src.startswith("properties.")
        }
        # A registry topic's writer schemas declare their fields' types: a column may widen to one.
        declared = frozenset(
            src.removeprefix("properties.")
            for c in self.contract.all_columns
            if registry is not None and isinstance(c.iceberg_type, IntegerType | FloatType | DecimalType)
            for src in c.sources
            if src.startswith("properties.")
        )
        scan = PropertyScan(
            mapped_names(self.contract) - nested,
            registry,
            self.config.decode.schema_registry,
            debezium_contract=debezium,
            declared=declared,
        )
        source, read_and_scan = self.layout.records(batch, scan)
        rows = source.coalesce(self.parallelism).mapInArrow(read_and_scan, self._spark_scan_schema).collect()
        plan = plan_new_columns(self.contract, seen_from_rows(rows), self.table.metadata.last_column_id)
        timings["property_scan"] = time.monotonic() - step
        return plan

    def _write_and_commit(
        self,
        batch: DataFrame,
        batch_id: int,
        started: float,
        timings: dict[str, float],
        plan: ColumnPlan,
        covers: Offsets | None,
    ) -> None:
        try:
            results = self._clustered(batch, batch_id, timings, isolate_decoder=False)
        except Exception as exc:
            if not worker_crashed(exc):
                raise
            # A record crashed native code in the decoder, and would on every replay: decode this
            # batch again with each part in a child process, which finds and rejects the record.
            log.warning(
                "a Python worker crashed on this batch; decoding it again in isolation",
                extra={"batch": {"batch_id": batch_id}},
            )
            timings = {}
            results = self._clustered(batch, batch_id, timings, isolate_decoder=True)
        offsets, consumed, rejected, oldest = _summarise(results.tallies)
        if covers is not None:
            offsets = covers
        if results.unplaced:
            # docs/debezium.md: the connector settings that send every value
            log.warning(
                "upsert rows left out: their change events carried no geometry, and neither an earlier "
                "record nor the table holds one for their keys",
                extra={"batch": {"batch_id": batch_id, "rows": results.unplaced}},
            )
        files = tuple(results.files)
        delete_files = tuple(results.delete_files)
        ignored = {**{name: "schema_evolution is off" for name in results.unmapped}, **plan.ignored}
        self._log_ignored(batch_id, ignored)

        step = time.monotonic()
        commit = BatchCommit(
            writer_id=self.config.writer_id,
            batch_id=batch_id,
            offsets=offsets,
            files=files,
            rejected=sum(rejected.values()),
            delete_files=delete_files,
            equality_ids=tuple(equality_field_ids(self.contract)) if delete_files else (),
            schema_change=plan,
        )
        reject_files = tuple(results.reject_files)
        if reject_files:
            # The data table's refusal first: a batch it refuses must leave no rejects behind, which
            # the run under a new writer id that reads these records again would commit twice.
            try:
                self.committer.refuse_if_reused(commit)
            except WriterIdReusedError as exc:
                self._discard(reject_files, self.rejects_table)
                self._refused(exc, files + delete_files)
                raise
            try:
                self._commit_rejects(batch_id, offsets, reject_files)
            except Exception:
                self._discard(files + delete_files)
                raise
            timings["rejects_commit"] = time.monotonic() - step
            step = time.monotonic()
        try:
            outcome = self.committer.commit(commit)
        except SchemaMoved:
            self._discard(files + delete_files)
            raise
        except WriterIdReusedError as exc:
            self._refused(exc, files + delete_files)
            failed = CommitOutcome("failed", None, 1, 0, time.monotonic() - step)
            self._notify(
                BatchReport(
                    batch_id, consumed, 0, rejected, files, offsets, failed, timings, oldest, table=self.contract.table
                )
            )
            raise
        except CommitRetriesExhausted as exc:
            # Refused for sure: the files are garbage. After an attempt without an answer the batch
            # may have landed, so they stay (a restart's replay check settles it; if it did not
            # land, `geoingest table orphans` finds them).
            if not exc.outcome_unknown:
                self._discard(files + delete_files)
            failed = CommitOutcome("failed", None, exc.attempts, exc.conflicts, time.monotonic() - step)
            self._notify(
                BatchReport(
                    batch_id, consumed, 0, rejected, files, offsets, failed, timings, oldest, table=self.contract.table
                )
            )
            log.error("commit failed", extra={"batch": {"batch_id": batch_id, "error": str(exc)}})
            raise
        if outcome.status == "skipped_replay":
            # The batch landed before the crash; this replay's files are copies nobody references.
            self._discard(files + delete_files)
        timings["commit"] = time.monotonic() - step
        timings["total"] = time.monotonic() - started
        report = BatchReport(
            batch_id,
            consumed,
            sum(f.record_count for f in files),
            rejected,
            files,
            offsets,
            outcome,
            timings,
            oldest,
            ignored,
            tuple([*(c.name for c in plan.added), *(".".join(m.path) for m in plan.members)])
            if outcome.status == "committed"
            else (),
            tuple(results.event_times),
            table=self.contract.table,
        )
        log.info("batch", extra={"batch": _log_fields(report)})
        self._notify(report)
        if self.config.hold_after_commit_file and outcome.status == "committed":
            _hold(self.config.hold_after_commit_file, batch_id)

    def _log_ignored(self, batch_id: int, ignored: dict[str, str]) -> None:
        """One line per name the first time this process ignores it (the metric counts every batch)."""
        for name in sorted(set(ignored) - self._ignored_logged):
            self._ignored_logged.add(name)
            log.warning(
                "property ignored",
                extra={"batch": {"batch_id": batch_id, "property": name, "why": ignored[name]}},
            )

    def _clustered(
        self, batch: DataFrame, batch_id: int, timings: dict[str, float], isolate_decoder: bool
    ) -> BatchResults:
        try:
            return self.layout.files(
                batch, batch_id, self.contract, self._rejects_files(batch_id), timings, isolate_decoder
            )
        except Exception as exc:
            self.fatal_error = dead_letter_failure(exc)
            if self.fatal_error is not None:
                log.error("dead letter failed", extra={"batch": {"batch_id": batch_id, "error": self.fatal_error}})
            raise

    def _rejects_files(self, batch_id: int) -> RejectsTableFiles | None:
        if self.rejects_table is None:
            return None
        return RejectsTableFiles(
            target_table=self.contract.table,
            data_location=data_location(self.rejects_table),
            file_prefix=f"{self.config.writer_id}-b{batch_id:09d}",
            io_properties=dict(self.rejects_table.io.properties),
            table_properties=dict(self.rejects_table.properties),
        )

    def _commit_rejects(self, batch_id: int, offsets: Offsets, files: tuple[DataFileRecord, ...]) -> None:
        """The batch's rejects, committed to the rejects table under the batch's identity (a replay
        skips them) before its data: a batch is never in the table without its rejects."""
        assert self.rejects_committer is not None
        try:
            outcome = self.rejects_committer.commit(
                BatchCommit(
                    self.config.writer_id, batch_id, offsets, files, rejected=sum(f.record_count for f in files)
                )
            )
        except WriterIdReusedError as exc:
            self._refused(exc, files, self.rejects_table)
            raise
        except CommitRetriesExhausted as exc:
            if not exc.outcome_unknown:
                self._discard(files, self.rejects_table)
            raise
        if outcome.status == "skipped_replay":
            self._discard(files, self.rejects_table)

    def _refused(self, exc: WriterIdReusedError, files: tuple[DataFileRecord, ...], table: Table | None = None) -> None:
        """A batch the table refused as no replay: its files are garbage, and the query stops with the
        reason in one line, since only a new writer id (not a restart on this checkpoint) can fix it."""
        self._discard(files, table)
        self.fatal_error = str(exc)
        log.error("batch refused", extra={"batch": {"batch_id": exc.batch_id, "error": self.fatal_error}})

    def _discard(self, files: tuple[DataFileRecord, ...], table: Table | None = None) -> None:
        discard(table or self.table, files)

    def _notify(self, report: BatchReport) -> None:
        for observe in self.observers:
            observe(report)


def dead_letter_failure(exc: BaseException) -> str | None:
    """The one-line reason of a DeadLetterFailed raised in a task, found in Spark's error text."""
    marker = f"{DeadLetterFailed.__name__}: "
    for line in reversed(str(exc).splitlines()):
        if marker in line:
            return line.split(marker, 1)[1].strip()
    return None


def _hold(marker: str, batch_id: int) -> None:
    with open(marker, "w") as f:
        f.write(str(batch_id))
    while True:
        time.sleep(3600)


def _summarise(tallies: list[Tally]) -> tuple[Offsets, int, dict[str, int], dict[str, int]]:
    """Offsets per topic-partition, records consumed, rejects per reason, oldest event per partition."""
    offsets: Offsets = {}
    consumed = 0
    rejected: dict[str, int] = {}
    oldest: dict[str, int] = {}
    for t in tallies:
        where = f"{t.topic}/{t.partition}"
        if t.oldest_ms is not None:
            oldest[where] = min(oldest.get(where, t.oldest_ms), t.oldest_ms)
        parts = offsets.setdefault(t.topic, {})
        first, last = parts.get(t.partition, (t.first, t.last))
        parts[t.partition] = (min(first, t.first), max(last, t.last))
        consumed += t.n
        if t.reason is not None:
            rejected[t.reason] = rejected.get(t.reason, 0) + t.n
    return offsets, consumed, rejected, oldest


def _log_fields(report: BatchReport) -> dict:
    return {
        "batch_id": report.batch_id,
        "consumed": report.consumed,
        "committed_rows": report.committed_rows,
        "rejected": report.rejected,
        "files": len(report.files),
        "ignored_properties": len(report.ignored_properties),
        **({"added_columns": list(report.added_columns)} if report.added_columns else {}),
        "commit": None if report.outcome is None else report.outcome.status,
        "snapshot_id": None if report.outcome is None else report.outcome.snapshot_id,
        "commit_conflicts": 0 if report.outcome is None else report.outcome.conflicts,
        "seconds": {k: round(v, 3) for k, v in report.seconds.items()},
    }
