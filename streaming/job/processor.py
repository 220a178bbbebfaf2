"""The streaming query: Kafka -> decode -> Hilbert-sorted GeoParquet files -> one commit.

Spark glue around the pure core (streaming/write/task.py). A micro-batch is clustered one of three
ways (`clustering`):

  batch (default)  one pass per input partition: each task decodes its Kafka records, sends its
                   dead letters, sorts its valid rows by Hilbert key and stages them as sorted
                   runs; then one merge task per key range reads its slices of every run and
                   writes the files. Rows cross from the JVM to Python once; no Spark shuffle, no
                   persist, no second read of Kafka. The batch's files do not overlap in space.
                   A batch of at most `merge_in_task_max_rows` valid rows is merged by the last
                   of its tasks instead (its ranges on parallel threads), with no second job.
  task             the same pass, but each task writes its own runs as files: the cheapest, and
                   each file is a compact stretch of the curve, but the files of a batch's tasks
                   cover the same places (a window reads one per task), until compaction.
  shuffle          decode (persisted), tallies and dead letters, then Spark's range exchange on
                   the Hilbert key (a sampling pass, a shuffle) and a sort within partitions
                   before the write.

Either way the driver collects only tallies and file records, then commits the files once,
idempotently per (writer id, batch id). Rows never reach the driver.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.table import Table
from pyspark import StorageLevel, TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from streaming.contract import Contract
from streaming.decode.decoder import (
    HILBERT,
    REJECT_REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    DecodeOptions,
    Decoder,
    decoded_schema,
)
from streaming.decode.isolation import IsolatedDecoder, worker_crashed
from streaming.decode.properties import mapped_names
from streaming.job.config import (
    CLUSTERING_MODES,
    SOURCES,
    JobConfig,
    python_source_options,
)
from streaming.read.current import TableRows
from streaming.source.options import SourceSettings
from streaming.source.read import ReadingRanges
from streaming.storage import data_location, delete_folder
from streaming.table.catalog import partition_layout, table_contract
from streaming.table.commit import (
    BatchCommit,
    CommitOutcome,
    CommitRetriesExhausted,
    Committer,
    Offsets,
    WriterIdReusedError,
)
from streaming.write.data_files import (
    DATA_FILE_RECORD_DDL,
    DataFileRecord,
    FileSettings,
    parquet_write_options,
    records_to_arrow,
)
from streaming.write.dead_letter import DeadLetterFailed, send_dead_letters
from streaming.write.evolution import (
    PROPERTY_SCAN_SCHEMA,
    ColumnPlan,
    PropertyScan,
    SchemaMoved,
    plan_new_columns,
    seen_from_rows,
)
from streaming.write.merge import LastTaskMerge, plan_merge, range_count
from streaming.write.rejects_table import RejectsTableFiles, WriteRejects
from streaming.write.task import (
    RESULT_SCHEMA,
    BatchResults,
    MergeTask,
    PartitionTask,
    ReduceTask,
    Tally,
    prepare_worker_process,
)
from streaming.write.upsert import equality_field_ids
from streaming.write.versions import plan_reduce

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
    # Columns this batch added to the table (schema_evolution "add-columns")
    added_columns: tuple[str, ...] = ()
    # Kafka timestamps of the batch's valid records, binned: (first ms, width ms, records)
    event_times: tuple[tuple[int, int, int], ...] = ()


class BatchProcessor:
    """The foreachBatch function: one micro-batch in, one commit out."""

    def __init__(
        self,
        spark: SparkSession,
        table: Table,
        contract: Contract,
        config: JobConfig,
        observers: tuple[Callable[[BatchReport], None], ...] = (),
    ):
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
        self.committer = Committer(table)
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
        self._spark_result_schema = from_arrow_schema(RESULT_SCHEMA)
        self._spark_scan_schema = from_arrow_schema(PROPERTY_SCAN_SCHEMA)
        self.parallelism = config.parallelism or spark.sparkContext.defaultParallelism
        self.ranges_source = (
            SourceSettings.parse(python_source_options(config, self.parallelism, until_idle=False))
            if config.source == "python"
            else None
        )
        parquet_write_options(table.properties)  # a codec the writers cannot use stops the start, not a batch
        # Why the query stopped, in one line, when the cause is ours (a dead letter that could not
        # be written): Spark would report it as a Python traceback inside its own.
        self.fatal_error: str | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.running_since = time.time()
        try:
            self._with_schema_retries(batch, batch_id)
        finally:
            self.running_since = None

    def _with_schema_retries(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        for attempt in range(1, _SCHEMA_ATTEMPTS + 1):
            self._follow_table_schema()
            try:
                self._ingest_and_commit(batch, batch_id, started)
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

    def _ingest_and_commit(self, batch: DataFrame, batch_id: int, started: float) -> None:
        timings: dict[str, float] = {}
        plan = self._plan_columns(batch, timings)
        table_columns = self.contract
        if plan.added:
            self.contract = table_columns.with_added_columns(table_columns.added_columns + plan.added)
        try:
            self._write_and_commit(batch, batch_id, started, timings, plan)
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
        scan = PropertyScan(
            mapped_names(self.contract), registry, self.config.decode.schema_registry, debezium_contract=debezium
        )
        source, read_and_scan = self._records(batch, scan)
        rows = source.coalesce(self.parallelism).mapInArrow(read_and_scan, self._spark_scan_schema).collect()
        plan = plan_new_columns(self.contract, seen_from_rows(rows), self.table.metadata.last_column_id)
        timings["property_scan"] = time.monotonic() - step
        return plan

    def _write_and_commit(
        self, batch: DataFrame, batch_id: int, started: float, timings: dict[str, float], plan: ColumnPlan
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
            added_columns=plan.added,
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
            self._notify(BatchReport(batch_id, consumed, 0, rejected, files, offsets, failed, timings, oldest))
            raise
        except CommitRetriesExhausted as exc:
            # Refused for sure: the files are garbage. After an attempt without an answer the batch
            # may have landed, so they stay (a restart's replay check settles it; if it did not
            # land, `geoingest table orphans` finds them).
            if not exc.outcome_unknown:
                self._discard(files + delete_files)
            failed = CommitOutcome("failed", None, exc.attempts, exc.conflicts, time.monotonic() - step)
            self._notify(BatchReport(batch_id, consumed, 0, rejected, files, offsets, failed, timings, oldest))
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
            tuple(c.name for c in plan.added) if outcome.status == "committed" else (),
            tuple(results.event_times),
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
            if self.config.clustering == "shuffle":
                return self._shuffled(batch, batch_id, timings, isolate_decoder)
            return self._one_pass(batch, batch_id, timings, isolate_decoder)
        except Exception as exc:
            self.fatal_error = _dead_letter_failure(exc)
            if self.fatal_error is not None:
                log.error("dead letter failed", extra={"batch": {"batch_id": batch_id, "error": self.fatal_error}})
            raise

    def _one_pass(
        self, batch: DataFrame, batch_id: int, timings: dict[str, float], isolate_decoder: bool
    ) -> BatchResults:
        step = time.monotonic()
        upsert = self.contract.mode == "upsert"
        merging = self.config.clustering == "batch"
        staging = self._staging(batch_id) if merging or upsert else None
        if staging is not None:
            _clear_folder(staging, self.table.io)  # runs of an attempt that died
        files = self._file_settings(batch_id)  # one spec for all of the batch's files
        task = PartitionTask(
            self.contract,
            self.config.decode,
            files,
            self.config.dead_letter,
            self.config.rows_per_partition,
            isolate_decoder,
            staging,
            self._last_merge() if staging is not None else None,
            self._rejects_files(batch_id),
            self._current_rows() if upsert else None,
        )
        # At most one task per core (coalesce never adds partitions): fewer, longer runs (and, with
        # clustering "task", fewer files covering the same places).
        source, read_and_ingest = self._records(batch, task)
        ingested = source.coalesce(self.parallelism).mapInArrow(read_and_ingest, self._spark_result_schema)
        results = BatchResults.from_rows(_collect_with_task_count(self.spark, ingested, timings))
        timings["ingest"] = time.monotonic() - step
        try:
            if upsert:
                assert staging is not None
                step = time.monotonic()
                self._reduce(results, files, staging)
                timings["reduce"] = time.monotonic() - step
            if merging:
                step = time.monotonic()
                self._merge(results, files)
                timings["merge"] = time.monotonic() - step
        finally:
            if staging is not None:
                _clear_folder(staging, self.table.io)
        return results

    def _last_merge(self) -> LastTaskMerge | None:
        """How the last task of a stage merges a small batch itself (None: always a second job)."""
        if self.config.merge_in_task_max_rows <= 0:
            return None
        return LastTaskMerge(
            _stage_position,
            self.parallelism,
            self.config.rows_per_partition,
            self.config.merge_in_task_max_rows,
            threads=self.parallelism,
        )

    def _reduce(self, results: BatchResults, files: FileSettings, staging: str) -> None:
        """An upsert batch's versions brought together by key (streaming/write/versions.py): the
        whole batch as its last task reduced it, or a reduce job over groups of key buckets. For
        clustering "batch", the reduce job stages sorted runs for the merge that follows."""
        staged = sum(v.rows for v in results.versions)
        merged = self._one_merged_set(results, staged)
        if merged is not None:
            results.take_files(merged)
            return
        groups = plan_reduce(results.versions, range_count(staged, self.parallelism, self.config.rows_per_partition))
        if not groups:
            return
        reduced_runs = f"{staging}/reduced" if self.config.clustering == "batch" else None
        task = ReduceTask(
            self.contract,
            files,
            tuple(groups),
            reduced_runs,
            self._last_merge() if reduced_runs is not None else None,
            self._current_rows(),
        )
        frame = self.spark.range(0, len(groups), 1, len(groups)).mapInArrow(task, self._spark_result_schema)
        reduced = BatchResults.from_rows(_collect_with_task_count(self.spark, frame))
        results.take_files(reduced.files + reduced.delete_files)
        results.slices, results.merged, results.merged_inputs = reduced.slices, reduced.merged, reduced.merged_inputs
        results.unplaced += reduced.unplaced

    def _current_rows(self) -> TableRows:
        """The table as this batch found it, for the values a change event did not carry."""
        return TableRows(self.table.metadata_location, dict(self.table.io.properties))

    def _merge(self, results: BatchResults, files: FileSettings) -> None:
        """The staged sorted runs merged into the batch's files: as the last task merged them, or
        by a merge job over ranges of the batch's keys."""
        valid = sum(s.rows for s in results.slices)
        merged = self._one_merged_set(results, valid)
        if merged is not None:
            results.take_files(merged)
        else:
            ranges = plan_merge(results.slices, range_count(valid, self.parallelism, self.config.rows_per_partition))
            if ranges:
                merge = MergeTask(self.contract, files, tuple(ranges))
                merged_rows = (
                    self.spark.range(0, len(ranges), 1, len(ranges))
                    .mapInArrow(merge, self._spark_result_schema)
                    .collect()
                )
                results.take_files(BatchResults.from_rows(merged_rows).files)
        results.slices = []

    def _one_merged_set(self, results: BatchResults, staged: int) -> list[DataFileRecord] | None:
        """The files of one task's merge (or reduce) of the whole batch (the others' are deleted), or
        None when no task did one (a large batch) or none read all the stage staged."""
        chosen = None
        for number in sorted(results.merged):
            files = results.merged[number]
            if chosen is None and results.merged_inputs.get(number) == staged:
                chosen = files
                results.unplaced += results.merged_unplaced.get(number, 0)
            else:
                self._discard(tuple(files))
        results.merged, results.merged_inputs, results.merged_unplaced = {}, {}, {}
        return chosen

    def _records(self, batch: DataFrame, task: TaskFunction) -> tuple[DataFrame, TaskFunction]:
        """The batch's frame and a task function over its Kafka records: Spark's source hands the
        records over; the Python source ("python") hands over offset ranges, read in the task."""
        if self.ranges_source is None:
            return _source_columns(batch), task
        return batch, ReadingRanges(self.ranges_source, task)

    def _staging(self, batch_id: int) -> str:
        return f"{self.table.location().rstrip('/')}/staging/{self.config.writer_id}-b{batch_id:09d}"

    def _shuffled(
        self, batch: DataFrame, batch_id: int, timings: dict[str, float], isolate_decoder: bool
    ) -> BatchResults:
        started = time.monotonic()
        source, read_and_decode = self._records(batch, _decode_fn(self.contract, self.config.decode, isolate_decoder))
        decoded = source.mapInArrow(read_and_decode, from_arrow_schema(decoded_schema(self.contract)))
        decoded = decoded.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            tallies = [
                Tally(
                    r[SOURCE_TOPIC],
                    r[SOURCE_PARTITION],
                    r[REJECT_REASON],
                    r["first"],
                    r["last"],
                    r["n"],
                    r["oldest_ms"],
                )
                for r in decoded.groupBy(SOURCE_TOPIC, SOURCE_PARTITION, REJECT_REASON)
                .agg(
                    F.min(SOURCE_OFFSET).alias("first"),
                    F.max(SOURCE_OFFSET).alias("last"),
                    F.count(F.lit(1)).alias("n"),
                    (F.unix_micros(F.min(SOURCE_TIMESTAMP)) / 1000).cast("long").alias("oldest_ms"),
                )
                .collect()
            ]
            timings["read_decode"] = time.monotonic() - started
            rejected = any(t.reason is not None for t in tallies)
            if rejected and self.config.dead_letter is not None:
                step = time.monotonic()
                send_dead_letters(decoded, self.config.dead_letter)
                timings["dead_letter"] = time.monotonic() - step
            reject_files: list[DataFileRecord] = []
            rejects = self._rejects_files(batch_id)
            if rejected and rejects is not None:
                step = time.monotonic()
                reject_rows = decoded.where(F.col(REJECT_REASON).isNotNull())
                reject_files = [
                    DataFileRecord.from_row(r)
                    for r in reject_rows.mapInArrow(WriteRejects(rejects), DATA_FILE_RECORD_DDL).collect()
                ]
                timings["rejects_table"] = time.monotonic() - step

            step = time.monotonic()
            valid = sum(t.n for t in tallies if t.reason is None)
            files: list[DataFileRecord] = []
            if valid:
                partitions = range_count(valid, self.parallelism, self.config.rows_per_partition)
                valid_rows = decoded.where(F.col(REJECT_REASON).isNull())
                clustered = valid_rows.repartitionByRange(partitions, HILBERT).sortWithinPartitions(HILBERT)
                write = _write_fn(self.contract, self._file_settings(batch_id))
                files = [
                    DataFileRecord.from_row(r) for r in clustered.mapInArrow(write, DATA_FILE_RECORD_DDL).collect()
                ]
            timings["cluster_write"] = time.monotonic() - step
        finally:
            decoded.unpersist()
        return BatchResults(tallies, files, reject_files=reject_files)

    def _file_settings(self, batch_id: int) -> FileSettings:
        return FileSettings(
            table_properties=dict(self.table.properties),
            io_properties=dict(self.table.io.properties),
            data_location=data_location(self.table),
            file_prefix=f"{self.config.writer_id}-b{batch_id:09d}",
            partition=partition_layout(self.table),
        )

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
        for record in files:
            try:
                (table or self.table).io.delete(record.path)
            except OSError as exc:  # left for `geoingest table orphans`
                log.warning(
                    "could not delete an uncommitted file", extra={"batch": {"path": record.path, "error": str(exc)}}
                )

    def _notify(self, report: BatchReport) -> None:
        for observe in self.observers:
            observe(report)


def _clear_folder(location: str, io) -> None:
    """Delete a staging folder and its files (never referenced by the table)."""
    delete_folder(io, location)


def _collect_with_task_count(spark: SparkSession, frame: DataFrame, timings: dict[str, float] | None = None) -> list:
    """Collect a frame's rows, its tasks told how many of them there are (STAGE_TASKS_PROPERTY):
    the count is known once the frame is planned, and local properties travel with the job.
    timings["ingest_plan"]: the planning (part of "ingest", which the collect completes)."""
    step = time.monotonic()
    rdd = frame.rdd  # planned once: the count and the rows come from the same plan
    if timings is not None:
        timings["ingest_plan"] = time.monotonic() - step
    context = spark.sparkContext
    context.setLocalProperty(STAGE_TASKS_PROPERTY, str(rdd.getNumPartitions()))
    try:
        return rdd.collect()
    finally:
        context.setLocalProperty(STAGE_TASKS_PROPERTY, None)  # type: ignore[arg-type]  # None unsets it


def _stage_position() -> tuple[int, int]:
    """This task's number and the number of tasks of its stage (LastTaskMerge.position)."""
    context = TaskContext.get()
    tasks = context.getLocalProperty(STAGE_TASKS_PROPERTY) if context is not None else None
    if context is None or tasks is None:
        raise RuntimeError(f"a batch task runs without Spark's task context or {STAGE_TASKS_PROPERTY}")
    return context.partitionId(), int(tasks)


def _source_columns(batch: DataFrame) -> DataFrame:
    """What the decoder reads of the Kafka source. Headers go as JSON text: Spark hands arrays to
    Python several times slower than strings (see decode.headers_from_json). One expression list,
    parsed by Spark: each column object built from Python is a round trip to the JVM, per batch."""
    headers = "to_json(headers)" if "headers" in batch.columns else "cast(null as string)"
    return batch.selectExpr("key", "value", "topic", "partition", "offset", "timestamp", f"{headers} as headers")


def _dead_letter_failure(exc: BaseException) -> str | None:
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


def _decode_fn(contract: Contract, options: DecodeOptions, isolate_decoder: bool):
    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare_worker_process()
        decoder = IsolatedDecoder(contract, options) if isolate_decoder else Decoder(contract, options)
        try:
            for batch in batches:
                yield decoder.decode(batch)
        finally:
            if isinstance(decoder, IsolatedDecoder):
                decoder.close()

    return decode


def _write_fn(contract: Contract, files: FileSettings):
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare_worker_process()
        writer = files.writer(contract)
        records = list(writer.write(batches))
        if records:
            yield records_to_arrow(records)

    return write


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
