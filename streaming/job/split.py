"""One topic's records split over tables by a value each carries (a field route, streaming/job/routes.py):
the foreachBatch function of the topic's one streaming query.

Each micro-batch's records are read once and kept (Spark's memory, then disk) while they are split.
The value that names a record's table (its key, or a header) is taken by a Spark expression, so the
records cross into Python only in the tables' own passes. The driver sees the batch's distinct values,
their counts and offset ranges, never a row: a value names its table through the route once per batch, however many
records carry it. Each table's share is handed to that table's BatchProcessor, which writes and
commits it under the table's own writer id and the query's batch id, the whole batch's offsets
recorded as done (the table has seen every record of them that is its own), so a replayed batch is skipped
by the tables that committed it and written by those that did not. A record whose value names no
table it may write goes to the topic's dead-letter topic as `no_route`, its detail saying why.

A table that fails its batch fails the query: the topic's tables share its offsets, so the others of
the topic wait for it (keeping what they committed) while the tables of other topics go on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.util import inheritable_thread_target

from streaming.decode.decoder import (
    RAW_HEADERS,
    RAW_KEY,
    RAW_VALUE,
    REJECT_DETAIL,
    REJECT_REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
)
from streaming.decode.rejects import Reason
from streaming.job.config import JobConfig, python_source_options
from streaming.job.processor import BatchProcessor, dead_letter_failure
from streaming.job.routes import RecordField, Route, RouteError, field_values
from streaming.source.options import RECORDS_DDL, SourceSettings
from streaming.source.read import ReadingRanges
from streaming.table.commit import Offsets
from streaming.write.dead_letter import DeadLetterConfig, dead_letter_fn

ROUTE_VALUE = "_route_value"
# Tables of one batch ingested at once. bench/routing.py, split shape, 50 tables: 8 measured no
# better than 4 (drain 13,373 against 14,853 events/s; p99 freshness 29.1 s against 24.6 s).
SHARE_THREADS = 4
_RECORD_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")


@dataclass(frozen=True)
class SplitReport:
    """What one micro-batch of a split topic did outside its tables: the records no table took."""

    batch_id: int
    consumed: int
    unrouted: int
    tables: tuple[str, ...]  # the tables the batch's records went to


def route_value(record_field: RecordField) -> Column:
    """The bytes that name a record's table, as a Spark column (null: the record has none); the
    same values `routes.field_values` takes from Arrow."""
    if record_field.kind == "key":
        return F.col("key")
    if record_field.kind == "json":
        path = "$." + ".".join(record_field.path)
        return F.get_json_object(F.col("value").cast("string"), path).cast("binary")
    name = record_field.path[0]
    matching = F.filter(F.col("headers"), lambda header: header["key"] == F.lit(name))
    return F.try_element_at(matching, F.lit(-1))["value"]  # the last of a repeated header wins


class RecordSplitter:
    """The foreachBatch of a topic a field route splits: each table's share to `processor_for(table)`,
    which opens (and creates) the table on its first record, or raises RouteError when the route
    may not write it; its records are then dead letters too."""

    def __init__(
        self,
        spark: SparkSession,
        route: Route,
        config: JobConfig,
        processor_for: Callable[[str], BatchProcessor],
        observers: tuple[Callable[[SplitReport], None], ...] = (),
    ):
        if route.field is None:
            raise RouteError(f"route {route.name}: it routes whole topics, not records")
        self.spark = spark
        self.route = route
        self.field: RecordField = route.field
        self.config = config
        self.processor_for = processor_for
        self.observers = observers
        self.ranges_source = (
            SourceSettings.parse(
                python_source_options(config, config.parallelism or spark.sparkContext.defaultParallelism, False)
            )
            if config.source == "python"
            else None
        )
        self.fatal_error: str | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        routed = self._records(batch).withColumn(ROUTE_VALUE, route_value(self.field))
        routed = routed.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            counts: dict[bytes | None, int] = {}
            covers: Offsets = {}
            for row in routed.groupBy(ROUTE_VALUE, "topic", "partition").agg(*_range()).collect():
                value = _as_bytes(row[ROUTE_VALUE])
                counts[value] = counts.get(value, 0) + row["n"]
                first, last = covers.setdefault(row["topic"], {}).get(row["partition"], (row["first"], row["last"]))
                covers[row["topic"]][row["partition"]] = (min(first, row["first"]), max(last, row["last"]))
            shares, unrouted = self._split(counts)
            processors: dict[str, BatchProcessor] = {}
            for name in sorted(shares):
                try:
                    processors[name] = self.processor_for(name)
                except RouteError as exc:
                    unrouted.update({value: str(exc) for value in shares.pop(name)})
            sent = self._dead_letter(routed, unrouted, shares) if unrouted else 0
            self._ingest_shares(routed, shares, processors, batch_id, covers)
            report = SplitReport(batch_id, sum(counts.values()), sent, tuple(sorted(shares)))
            for observe in self.observers:
                observe(report)
        finally:
            routed.unpersist()

    def _ingest_shares(
        self,
        routed: DataFrame,
        shares: dict[str, list[bytes]],
        processors: dict[str, BatchProcessor],
        batch_id: int,
        covers: Offsets,
    ) -> None:
        """Each table's share through its processor, up to `SHARE_THREADS` tables at once: a table's
        driver work (planning, its commit's round trips to the catalog) overlaps the others' jobs.
        Every table is tried; the first failure is raised once all are done."""
        names = sorted(shares)

        def ingest(name: str) -> Callable[[], None]:
            def run() -> None:
                processors[name](routed.where(_value_in(shares[name])).drop(ROUTE_VALUE), batch_id, covers)

            # The query's local properties (its job group: stopping the query cancels the tables' jobs
            # too), each table's a copy of its own: a table's task count property is not another's.
            return inheritable_thread_target(self.spark)(run)

        with ThreadPoolExecutor(max_workers=max(1, min(SHARE_THREADS, len(names)))) as pool:
            futures = [pool.submit(ingest(name)) for name in names]
        errors = [future.exception() for future in futures if future.exception() is not None]
        if errors:
            raise errors[0]  # type: ignore[misc]

    def _records(self, batch: DataFrame) -> DataFrame:
        """The batch's Kafka records: Spark's source hands them over; the Python source hands over
        offset ranges, read here by a pass over them."""
        if self.ranges_source is None:
            return batch.select(*_RECORD_COLUMNS)
        return batch.mapInArrow(ReadingRanges(self.ranges_source, _records_as_read), RECORDS_DDL)

    def _split(self, counts: dict[bytes | None, int]) -> tuple[dict[str, list[bytes]], dict[bytes | None, str]]:
        """The values of each table's share, and why each value left (null included) names none."""
        values = list(counts)
        slots, names, details = self.route.tables_for_values(pa.array(values, pa.binary()))
        shares: dict[str, list[bytes]] = {}
        unrouted: dict[bytes | None, str] = {}
        for value, slot, detail in zip(values, slots.tolist(), details.tolist(), strict=True):
            if slot < 0 or value is None:
                unrouted[value] = detail
            else:
                shares.setdefault(names[slot], []).append(value)
        return shares, unrouted

    def _dead_letter(self, routed: DataFrame, unrouted: dict[bytes | None, str], shares: dict[str, list[bytes]]) -> int:
        """The records no table takes, sent to the dead-letter topic as `no_route` (counted only
        when the service sends no dead letters); returns how many."""
        taken = [value for values in shares.values() for value in values]
        left = routed.where(F.col(ROUTE_VALUE).isNull() | ~_value_in(taken)) if taken else routed
        refused = {value: why for value, why in unrouted.items() if value is not None}
        if self.config.dead_letter is None:
            return left.count()
        send = NoRouteDeadLetters(self.route, self.config.dead_letter, refused)
        try:
            return sum(row["sent"] for row in left.mapInArrow(send, "sent long").collect())
        except Exception as exc:
            self.fatal_error = dead_letter_failure(exc)
            raise


class NoRouteDeadLetters:
    """A mapInArrow function over a split topic's records that no table takes: each sent to the
    dead-letter topic with reason `no_route` and why (`refused`: a value's reason when the route
    named a table it may not write). Picklable, for the executors."""

    def __init__(self, route: Route, config: DeadLetterConfig, refused: dict[bytes, str]):
        self.route = route
        self.config = config
        self.refused = refused

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return dead_letter_fn(self.config)(self.dead_letters(batch) for batch in batches if batch.num_rows)

    def dead_letters(self, records: pa.RecordBatch) -> pa.RecordBatch:
        """The records as the dead-letter writer takes rejected rows."""
        assert self.route.field is not None
        values = field_values(records, self.route.field)
        _, _, details = self.route.tables_for_values(values)
        detail = [
            self.refused.get(value, why) if value is not None else why
            for value, why in zip(values.to_pylist(), details.tolist(), strict=True)
        ]
        n = records.num_rows
        return pa.RecordBatch.from_pydict(
            {
                RAW_KEY: records.column("key"),
                RAW_VALUE: records.column("value"),
                RAW_HEADERS: records.column("headers"),
                SOURCE_TOPIC: records.column("topic"),
                SOURCE_PARTITION: records.column("partition"),
                SOURCE_OFFSET: records.column("offset"),
                SOURCE_TIMESTAMP: records.column("timestamp"),
                REJECT_REASON: pa.array([Reason.NO_ROUTE.value] * n, pa.string()),
                REJECT_DETAIL: pa.array(detail, pa.string()),
            }
        )


def _range() -> tuple[Column, ...]:
    return F.count(F.lit(1)).alias("n"), F.min("offset").alias("first"), F.max("offset").alias("last")


def _records_as_read(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
    return batches


def _value_in(values: list[bytes]) -> Column:
    return F.col(ROUTE_VALUE).isin([bytearray(value) for value in values])


def _as_bytes(value) -> bytes | None:
    return None if value is None else bytes(value)
