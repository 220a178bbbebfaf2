"""How a micro-batch's Kafka records become the batch's files (the `clustering`), run from the driver.

Spark glue around the pure core (streaming/write/task.py). A micro-batch is clustered one of three
ways:

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

An upsert table's batch brings every version of a key to one reducer first (streaming/write/versions.py),
the batch's last task or a reduce job, whose rows then go on as above (`batch`, `task`).
Either way the driver collects only tallies and file records. Rows never reach the driver.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator

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
from streaming.decode.isolation import IsolatedDecoder
from streaming.job.config import JobConfig, python_source_options
from streaming.read.current import TableRows
from streaming.source.options import SourceSettings
from streaming.source.read import ReadingRanges
from streaming.storage import data_location, delete_folder
from streaming.table.catalog import partition_layout
from streaming.write.data_files import DATA_FILE_RECORD_DDL, DataFileRecord, FileSettings, records_to_arrow
from streaming.write.dead_letter import send_dead_letters
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
from streaming.write.versions import plan_reduce

# The Spark local property that tells a batch's tasks how many of them there are
STAGE_TASKS_PROPERTY = "geoingest.stage.tasks"

log = logging.getLogger("geoingest.job")

TaskFunction = Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]


class BatchLayout:
    """The files of a micro-batch, laid out as `config.clustering` says, in `table`'s location."""

    def __init__(
        self, spark: SparkSession, table: Table, config: JobConfig, parallelism: int, records_given: bool = False
    ):
        self.spark = spark
        self.table = table
        self.config = config
        self.parallelism = parallelism
        # A StructType, not a DDL string: Spark parses a DDL string in the JVM, once per batch.
        self.result_schema = from_arrow_schema(RESULT_SCHEMA)
        self.ranges_source = (
            SourceSettings.parse(python_source_options(config, parallelism, until_idle=False))
            if config.source == "python" and not records_given
            else None
        )

    def files(
        self,
        batch: DataFrame,
        batch_id: int,
        contract: Contract,
        rejects: RejectsTableFiles | None,
        timings: dict[str, float],
        isolate_decoder: bool,
    ) -> BatchResults:
        """Tallies, dead letters sent, and the records of the files written (rejects' too)."""
        if self.config.clustering == "shuffle":
            return self._shuffled(batch, batch_id, contract, rejects, timings, isolate_decoder)
        return self._one_pass(batch, batch_id, contract, rejects, timings, isolate_decoder)

    def _one_pass(
        self,
        batch: DataFrame,
        batch_id: int,
        contract: Contract,
        rejects: RejectsTableFiles | None,
        timings: dict[str, float],
        isolate_decoder: bool,
    ) -> BatchResults:
        step = time.monotonic()
        upsert = contract.mode == "upsert"
        merging = self.config.clustering == "batch"
        staging = self._staging(batch_id) if merging or upsert else None
        if staging is not None:
            _clear_folder(staging, self.table.io)  # runs of an attempt that died
        files = self.file_settings(batch_id)  # one spec for all of the batch's files
        task = PartitionTask(
            contract,
            self.config.decode,
            files,
            self.config.dead_letter,
            self.config.rows_per_partition,
            isolate_decoder,
            staging,
            self._last_merge() if staging is not None else None,
            rejects,
            self._current_rows() if upsert else None,
        )
        # At most one task per core (coalesce never adds partitions): fewer, longer runs (and, with
        # clustering "task", fewer files covering the same places).
        source, read_and_ingest = self.records(batch, task)
        ingested = source.coalesce(self.parallelism).mapInArrow(read_and_ingest, self.result_schema)
        results = BatchResults.from_rows(_collect_with_task_count(self.spark, ingested, timings))
        timings["ingest"] = time.monotonic() - step
        try:
            if upsert:
                assert staging is not None
                step = time.monotonic()
                self._reduce(results, contract, files, staging)
                timings["reduce"] = time.monotonic() - step
            if merging:
                step = time.monotonic()
                self._merge(results, contract, files)
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

    def _reduce(self, results: BatchResults, contract: Contract, files: FileSettings, staging: str) -> None:
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
            contract,
            files,
            tuple(groups),
            reduced_runs,
            self._last_merge() if reduced_runs is not None else None,
            self._current_rows(),
        )
        frame = self.spark.range(0, len(groups), 1, len(groups)).mapInArrow(task, self.result_schema)
        reduced = BatchResults.from_rows(_collect_with_task_count(self.spark, frame))
        results.take_files(reduced.files + reduced.delete_files)
        results.slices, results.merged, results.merged_inputs = reduced.slices, reduced.merged, reduced.merged_inputs
        results.unplaced += reduced.unplaced

    def _current_rows(self) -> TableRows:
        """The table as this batch found it, for the values a change event did not carry."""
        return TableRows(self.table.metadata_location, dict(self.table.io.properties))

    def _merge(self, results: BatchResults, contract: Contract, files: FileSettings) -> None:
        """The staged sorted runs merged into the batch's files: as the last task merged them, or
        by a merge job over ranges of the batch's keys."""
        valid = sum(s.rows for s in results.slices)
        merged = self._one_merged_set(results, valid)
        if merged is not None:
            results.take_files(merged)
        else:
            ranges = plan_merge(results.slices, range_count(valid, self.parallelism, self.config.rows_per_partition))
            if ranges:
                merge = MergeTask(contract, files, tuple(ranges))
                merged_rows = (
                    self.spark.range(0, len(ranges), 1, len(ranges)).mapInArrow(merge, self.result_schema).collect()
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
                discard(self.table, tuple(files))
        results.merged, results.merged_inputs, results.merged_unplaced = {}, {}, {}
        return chosen

    def records(self, batch: DataFrame, task: TaskFunction) -> tuple[DataFrame, TaskFunction]:
        """The batch's frame and a task function over its Kafka records: Spark's source hands the
        records over; the Python source ("python") hands over offset ranges, read in the task."""
        if self.ranges_source is None:
            return _source_columns(batch), task
        return batch, ReadingRanges(self.ranges_source, task)

    def _staging(self, batch_id: int) -> str:
        return f"{self.table.location().rstrip('/')}/staging/{self.config.writer_id}-b{batch_id:09d}"

    def _shuffled(
        self,
        batch: DataFrame,
        batch_id: int,
        contract: Contract,
        rejects: RejectsTableFiles | None,
        timings: dict[str, float],
        isolate_decoder: bool,
    ) -> BatchResults:
        started = time.monotonic()
        source, read_and_decode = self.records(batch, _decode_fn(contract, self.config.decode, isolate_decoder))
        decoded = source.mapInArrow(read_and_decode, from_arrow_schema(decoded_schema(contract)))
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
                write = _write_fn(contract, self.file_settings(batch_id))
                files = [
                    DataFileRecord.from_row(r) for r in clustered.mapInArrow(write, DATA_FILE_RECORD_DDL).collect()
                ]
            timings["cluster_write"] = time.monotonic() - step
        finally:
            decoded.unpersist()
        return BatchResults(tallies, files, reject_files=reject_files)

    def file_settings(self, batch_id: int) -> FileSettings:
        return FileSettings(
            table_properties=dict(self.table.properties),
            io_properties=dict(self.table.io.properties),
            data_location=data_location(self.table),
            file_prefix=f"{self.config.writer_id}-b{batch_id:09d}",
            partition=partition_layout(self.table),
        )


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


def discard(table: Table | None, files: Iterable[DataFileRecord]) -> None:
    """Delete files no snapshot references (a batch's that did not land)."""
    if table is None:
        return
    for record in files:
        try:
            table.io.delete(record.path)
        except OSError as exc:  # left for `geoingest table orphans`
            log.warning(
                "could not delete an uncommitted file", extra={"batch": {"path": record.path, "error": str(exc)}}
            )
