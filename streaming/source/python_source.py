"""A Kafka source for Spark Structured Streaming written in Python, on librdkafka (confluent-kafka).

Two ways to use it:

- rangesOnly=true, as the service does (source = "python"): the rows it gives Spark are offset
  ranges (topic, partition, start_offset, end_offset), and the task that processes a range reads
  its records itself (streaming/source/read.py ReadingRanges), in its Python worker: the records
  become Arrow once and never cross the JVM.
- rows: it reads the records in its own read() and gives Spark key, value, topic, partition,
  offset, timestamp (and headers). Measured inside Spark 4.0 (bench/kafka_source.py) this does
  not pay off: Spark turns a Python source's Arrow batches into rows in the JVM, at a fixed
  0.25-0.45 s per micro-batch and about 1 us per row, before the query ships them to Python
  again; it reached about 0.55 of Spark's source's events/s, at 1.5-1.75 times its CPU per event.

It is read as `spark.readStream.format("geoingest-kafka")` once `register(spark)` ran, or through
`python_kafka_stream(spark, options)`, with the option names `streaming.job.processor.kafka_source_options`
gives Spark's source, and it behaves as that source does where the service depends on it:

- columns: key, value, topic, partition, offset, timestamp and, with includeHeaders=true,
  headers (a record without headers has null there, as Spark gives it);
- offsets: Spark's JSON, {"topic": {"0": 123}}, the next offset to read of each partition;
  startingOffsets "earliest", "latest" (the default) or that JSON with -2 for earliest and -1 for
  latest (all the topic's partitions, as Spark demands); maxOffsetsPerTrigger spread over the
  partitions in proportion to what each has; partitions added to the topic read from their
  earliest offset; minPartitions splitting big ranges; failOnDataLoss;
- kafka.* options: the Java client's settings, mapped to librdkafka's (`librdkafka_config`);
  one that has no mapping is refused by name. `librdkafka.<property>` options pass a librdkafka
  property as it is.

What Spark 4.0 does not give a Python source, and what stands in for it:

- Trigger.AvailableNow: Spark falls back to one single batch for a Python source ("does not
  support Trigger.AvailableNow. Falling back to single batch execution"), which with
  maxOffsetsPerTrigger reads one capped batch and stops. Instead: the option endingOffsets
  ("latest": the offsets when the query starts, or a JSON) bounds the stream, any trigger but
  availableNow runs it, and `await_caught_up(query)` returns once a trigger found nothing new.
- Admission control: a Python reader's latestOffset() is not told where the batch starts. The
  reader keeps the end it planned last; after a restart Spark tells it the last planned end
  through partitions(end, end) (AcceptsLatestSeenOffset), before it asks for latestOffset().
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from streaming.source.options import (
    EARLIEST,
    FAIL_ON_DATA_LOSS_HINT,
    LATEST,
    SKIP_ON_DATA_LOSS_HINT,
    SOURCE_NAME,
    KafkaDataLossError,
    KafkaSourceError,
    PartitionOffsets,
    SourceSettings,
    TopicPartition,
    UnmendableErrors,
    offsets_spec,
)
from streaming.source.read import range_batch, read_range

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("geoingest.kafka_source")

# How long the planner retries a metadata or offsets request (librdkafka reconnects meanwhile),
# in slices: after each, an error no retry mends (a refused login) ends the wait.
_METADATA_SLICE_S = 2.0


# -- offsets ------------------------------------------------------------------------------------


def offsets_to_json(offsets: PartitionOffsets) -> dict[str, dict[str, int]]:
    """Spark's Kafka offset JSON, in one order: Spark compares offsets by their JSON text."""
    document: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        document.setdefault(topic, {})[str(partition)] = offsets[(topic, partition)]
    return document


def offsets_from_json(document: Mapping[str, Mapping[str, int]]) -> PartitionOffsets:
    return {(topic, int(p)): int(o) for topic, parts in document.items() for p, o in parts.items()}


def _describe(tps: Sequence[TopicPartition] | set[TopicPartition]) -> str:
    return ", ".join(f"{t}/{p}" for t, p in sorted(tps))


def rate_limited(
    limit: int,
    start: PartitionOffsets,
    until: PartitionOffsets,
    earliest_of: Callable[[list[TopicPartition]], PartitionOffsets],
) -> PartitionOffsets:
    """Spark's KafkaMicroBatchStream.rateLimit: at most about `limit` records in all, shared
    among the partitions in proportion to what each has to read, none starved (at least 1 each)."""
    new = [tp for tp in until if tp not in start]
    from_new = earliest_of(new) if new else {}
    sizes: dict[TopicPartition, int] = {}
    for tp, end in until.items():
        begin = start.get(tp, from_new.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(until)
    limited: PartitionOffsets = {}
    for tp, end in until.items():
        if tp not in sizes:
            limited[tp] = end
            continue
        begin = start[tp] if tp in start else from_new[tp]
        prorate = limit * (sizes[tp] / total)
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        limited[tp] = min(end, begin + share)
    return limited


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split_ranges(ranges: Sequence[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Spark's KafkaOffsetRangeCalculator.getRanges: empty ranges dropped; with fewer ranges than
    min_partitions, the big ones split so that there are about min_partitions in all."""
    ranges = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(ranges) >= min_partitions:
        return list(ranges)
    total = sum(r.size for r in ranges)

    def part_count(size: int, of_total: int, parts: int) -> int:
        return max(math.floor(size / of_total * parts + 0.5), 1)  # Scala's math.round

    unsplit = [r for r in ranges if part_count(r.size, total, min_partitions) == 1]
    unsplit_partitions = {(r.topic, r.partition) for r in unsplit}
    split_total = total - sum(r.size for r in unsplit)
    split_min_partitions = max(min_partitions - len(unsplit), 1)
    result: list[OffsetRange] = []
    for r in ranges:
        parts = (
            1 if (r.topic, r.partition) in unsplit_partitions else part_count(r.size, split_total, split_min_partitions)
        )
        remaining, start = r.size, r.start
        for part in range(parts):
            this_part = remaining // (parts - part)  # the last part takes the rounding
            remaining -= this_part
            end = min(start + this_part, r.end)
            result.append(OffsetRange(r.topic, r.partition, start, end))
            start = end
    return [r for r in result if r.size > 0]


# -- the driver's view of the topics ------------------------------------------------------------


class _Cluster:
    """Partitions and offsets of the subscribed topics, through librdkafka's admin client."""

    def __init__(self, settings: SourceSettings) -> None:
        from confluent_kafka.admin import AdminClient

        self._settings = settings
        self._errors = UnmendableErrors()
        config: dict[str, Any] = {**settings.admin_config(), "error_cb": self._errors}
        self._admin: AdminClient = AdminClient(config)

    def partitions(self) -> list[TopicPartition]:
        found: list[TopicPartition] = []
        for topic in self._settings.topics:
            metadata = self._retrying(
                f"listing the partitions of topic {topic}",
                functools.partial(self._admin.list_topics, topic=topic),
            )
            described = metadata.topics.get(topic)
            # A topic that does not exist has no partitions yet, as with Spark's subscribe.
            if described is not None and described.error is None:
                found.extend((topic, p) for p in described.partitions)
        return sorted(found)

    def earliest(self, tps: Sequence[TopicPartition]) -> PartitionOffsets:
        return self._list_offsets(tps, latest=False)

    def latest(self, tps: Sequence[TopicPartition]) -> PartitionOffsets:
        return self._list_offsets(tps, latest=True)

    def _list_offsets(self, tps: Sequence[TopicPartition], latest: bool) -> PartitionOffsets:
        if not tps:
            return {}
        from confluent_kafka import IsolationLevel
        from confluent_kafka import TopicPartition as KafkaTopicPartition
        from confluent_kafka.admin import OffsetSpec

        spec = OffsetSpec.latest() if latest else OffsetSpec.earliest()
        level = (
            IsolationLevel.READ_COMMITTED
            if self._settings.isolation_level == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )

        def list_offsets(timeout: float) -> PartitionOffsets:
            futures = self._admin.list_offsets(
                {KafkaTopicPartition(t, p): spec for t, p in tps},
                isolation_level=level,
                request_timeout=timeout,
            )
            return {(tp.topic, tp.partition): future.result().offset for tp, future in futures.items()}

        return self._retrying(
            f"listing the {'latest' if latest else 'earliest'} offsets of {_describe(tps)}", list_offsets
        )

    def _retrying(self, what: str, call: Callable[..., Any]) -> Any:
        """call(timeout=...) in slices until it answers or the settings' metadata_timeout_s pass."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self._settings.metadata_timeout_s
        while True:
            try:
                return call(timeout=_METADATA_SLICE_S)
            except KafkaException as exc:
                self._admin.poll(0)  # serves the error callback
                if self._errors.last is not None:
                    raise KafkaSourceError(
                        f"{what} at {self._settings.bootstrap_servers} failed: {self._errors.last}"
                    ) from exc
                if time.monotonic() > deadline:
                    raise KafkaSourceError(
                        f"{what} at {self._settings.bootstrap_servers} failed for {self._settings.metadata_timeout_s:g} s: {exc}"
                    ) from exc
                log.warning("%s failed, retrying: %s", what, exc)


# -- the Spark data source ----------------------------------------------------------------------


class KafkaRange(InputPartition):
    """One Spark task's read: offsets [start, end) of one topic-partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


class KafkaStreamReader(DataSourceStreamReader):
    """Plans the micro-batches on the driver (in the Python process Spark keeps for the query)
    and reads the ranges on the executors."""

    def __init__(self, settings: SourceSettings) -> None:
        self._settings = settings
        self._cluster_client: _Cluster | None = None
        self._initial: PartitionOffsets | None = None
        self._ending: PartitionOffsets | None = None
        # Where the next batch starts: the end this reader planned last (see the module's notes).
        self._next_start: PartitionOffsets | None = None

    @property
    def _cluster(self) -> _Cluster:
        if self._cluster_client is None:
            self._cluster_client = _Cluster(self._settings)
        return self._cluster_client

    def initialOffset(self) -> dict:
        # Asked for after latestOffset() on a new query, and must be the same then.
        if self._initial is None:
            self._initial = self._resolve("startingOffsets", self._settings.starting_offsets, allow_earliest=True)
            log.info("initial offsets %s", offsets_to_json(self._initial))
        return offsets_to_json(self._initial)

    def latestOffset(self) -> dict:
        start = self._next_start if self._next_start is not None else offsets_from_json(self.initialOffset())
        until = self._latest_after(start)
        if self._settings.ending_offsets is not None:
            until = self._bounded(until, start)
        limit = self._settings.max_offsets_per_trigger
        end = rate_limited(limit, start, until, self._cluster.earliest) if limit is not None else until
        self._next_start = end
        return offsets_to_json(end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        end_offsets = offsets_from_json(end)
        self._next_start = end_offsets
        if start == end:
            return []
        ranges = self._ranges(offsets_from_json(start), end_offsets)
        return [
            KafkaRange(r.topic, r.partition, r.start, r.end)
            for r in split_ranges(ranges, self._settings.min_partitions)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaRange):
            raise KafkaSourceError(f"{SOURCE_NAME} reads KafkaRange partitions, got {type(partition).__name__}")
        if self._settings.ranges_only:
            return iter([range_batch([(partition.topic, partition.partition, partition.start, partition.end)])])
        return read_range(self._settings, partition.topic, partition.partition, partition.start, partition.end)

    def commit(self, end: dict) -> None:
        """Nothing: the offsets read live in Spark's checkpoint, as with Spark's Kafka source."""

    def stop(self) -> None:
        self._cluster_client = None

    # -- planning ---------------------------------------------------------------------------

    def _resolve(self, name: str, value: str, allow_earliest: bool) -> PartitionOffsets:
        spec = offsets_spec(name, value, self._settings.topics, allow_earliest)
        partitions = self._cluster.partitions()
        if spec == "earliest":
            return self._cluster.earliest(partitions)
        if spec == "latest":
            return self._cluster.latest(partitions)
        assert isinstance(spec, dict)
        if set(spec) != set(partitions):
            raise KafkaSourceError(
                f"option {name} must give an offset for every partition of the topics (-1 for latest, "
                f"-2 for earliest), as with Spark's Kafka source; given: {_describe(set(spec)) or 'none'}; "
                f"the topics have: {_describe(partitions) or 'none'}"
            )
        special = {tp for tp, offset in spec.items() if offset in (EARLIEST, LATEST)}
        earliest = self._cluster.earliest([tp for tp in special if spec[tp] == EARLIEST])
        latest = self._cluster.latest([tp for tp in special if spec[tp] == LATEST])
        return {tp: earliest.get(tp, latest.get(tp, offset)) for tp, offset in spec.items()}

    def _latest_after(self, start: PartitionOffsets) -> PartitionOffsets:
        """The latest offsets; asked again when one is below where the batch starts (a broker
        that has not caught up: KAFKA-7703), as Spark's source does."""
        partitions = self._cluster.partitions()
        attempts = self._settings.fetch_offset_retries
        for attempt in range(1, attempts + 1):
            latest = self._cluster.latest(partitions)
            behind = [(tp, start[tp], o) for tp, o in latest.items() if tp in start and o < start[tp]]
            if not behind or attempt == attempts:
                return latest
            log.warning("latest offsets below the batch's start (partition, start, latest): %s; asking again", behind)
            time.sleep(self._settings.fetch_offset_retry_interval_s)
        raise AssertionError("unreachable")

    def _bounded(self, until: PartitionOffsets, start: PartitionOffsets) -> PartitionOffsets:
        """`until` no further than endingOffsets; partitions made after those were resolved are
        left out (they hold nothing that was there when the query started)."""
        if self._ending is None:
            self._ending = self._resolve(
                "endingOffsets", self._settings.ending_offsets or "latest", allow_earliest=False
            )
        bounded: PartitionOffsets = {}
        for tp, offset in until.items():
            if tp in self._ending:
                # An ending below where the query stands (a JSON older than the checkpoint) means
                # nothing more to read, not offsets gone back.
                bounded[tp] = min(offset, max(self._ending[tp], start.get(tp, 0)))
            elif tp in start:
                bounded[tp] = start[tp]
        return bounded

    def _ranges(self, start: PartitionOffsets, end: PartitionOffsets) -> list[OffsetRange]:
        """Spark's getOffsetRangesFromResolvedOffsets, with its data-loss checks."""
        new = sorted(set(end) - set(start))
        new_starts = self._cluster.earliest(new)
        if set(new_starts) != set(new):
            self._data_loss(f"cannot find the earliest offsets of {_describe(set(new) - set(new_starts))}")
        for (topic, partition), offset in sorted(new_starts.items()):
            if offset != 0:
                self._data_loss(f"added partition {topic}/{partition} starts from offset {offset} instead of 0")
        gone = set(start) - set(end)
        if gone:
            self._data_loss(f"partitions {_describe(gone)} are gone")
        ranges: list[OffsetRange] = []
        for tp in sorted(end):
            if tp not in start and tp not in new_starts:
                continue
            first = start[tp] if tp in start else new_starts[tp]
            if end[tp] < first:
                self._data_loss(f"partition {tp[0]}/{tp[1]}'s offset went back from {first} to {end[tp]}")
            if end[tp] > first:
                ranges.append(OffsetRange(tp[0], tp[1], first, end[tp]))
        return self._without_deleted(ranges, new_starts)

    def _without_deleted(self, ranges: list[OffsetRange], known_earliest: PartitionOffsets) -> list[OffsetRange]:
        """The ranges, checked against the partitions' earliest offsets: records below them were
        deleted (retention, delete-records), which failOnDataLoss=false skips."""
        earliest = {
            **self._cluster.earliest(
                [(r.topic, r.partition) for r in ranges if (r.topic, r.partition) not in known_earliest]
            ),
            **known_earliest,
        }
        checked: list[OffsetRange] = []
        for r in ranges:
            low = earliest.get((r.topic, r.partition), r.start)
            if r.start < low:
                self._data_loss(
                    f"topic {r.topic} partition {r.partition}: offsets {r.start} to {min(r.end, low) - 1} of the "
                    f"range [{r.start}, {r.end}) to read are gone from Kafka (the partition now starts at offset {low})"
                )
                r = OffsetRange(r.topic, r.partition, min(low, r.end), r.end)
            checked.append(r)
        return checked

    def _data_loss(self, message: str) -> None:
        if self._settings.fail_on_data_loss:
            raise KafkaDataLossError(f"{message}. {FAIL_ON_DATA_LOSS_HINT}")
        log.warning("%s. %s", message, SKIP_ON_DATA_LOSS_HINT)


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SourceSettings.parse(self.options).spark_schema

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(SourceSettings.parse(self.options))


# -- reading a range (executors) ----------------------------------------------------------------


# -- for the service ----------------------------------------------------------------------------


def register(spark: SparkSession) -> None:
    """Make `spark.readStream.format("geoingest-kafka")` this source in `spark`'s session."""
    spark.dataSource.register(KafkaDataSource)


def python_kafka_stream(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """The stream of the Kafka records `options` name, read by this source: the option names
    of Spark's Kafka source (streaming.job.processor.kafka_source_options, startingOffsets,
    maxOffsetsPerTrigger), plus endingOffsets (see await_caught_up)."""
    SourceSettings.parse(options)  # a wrong option fails here, not in the Python planner of a trigger
    register(spark)
    return spark.readStream.format(SOURCE_NAME).options(**dict(options)).load()


class LatestOffsets:
    """The end offsets of the source's topics, asked every `every_s` on a thread of its own (the
    Python source's progress reports only the end of the batch it planned, not what Kafka holds),
    so that a broker that does not answer never holds up whoever reads them."""

    def __init__(self, settings: SourceSettings, every_s: float = 5.0) -> None:
        self._settings = settings
        self._every_s = every_s
        self._latest: PartitionOffsets | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kafka-latest-offsets", daemon=True)
        self._thread.start()

    def get(self) -> PartitionOffsets | None:
        return self._latest

    def stop(self) -> None:
        self._stopped.set()

    def _poll(self) -> None:
        cluster = _Cluster(self._settings)
        failing = False
        while not self._stopped.is_set():
            try:
                self._latest = cluster.latest(cluster.partitions())
                failing = False
            except KafkaSourceError as exc:
                if not failing:  # once per spell: the query reports what stops it
                    log.warning("the topics' end offsets are unknown, so is the lag: %s", exc)
                failing = True
            self._stopped.wait(self._every_s)


# Spark's StreamingQueryStatus message after a trigger that found no new data.
_NO_DATA_MESSAGE = "Waiting for data to arrive"


def caught_up(query: StreamingQuery) -> bool:
    """Whether the last trigger of `query` found no new data, its batches done: with endingOffsets,
    every record up to them is processed."""
    status = query.status
    return not status["isDataAvailable"] and not status["isTriggerActive"] and status["message"] == _NO_DATA_MESSAGE


def await_caught_up(query: StreamingQuery, timeout_s: float | None = None, poll_interval_s: float = 0.1) -> None:
    """Wait until a trigger of `query` found no new data after its batches ran: with the source's
    endingOffsets, every record up to them is processed (what Trigger.AvailableNow would give,
    which Spark 4.0 does not run for a Python source). Raises the query's error if it stopped,
    TimeoutError after `timeout_s`. The caller stops the query."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        if not query.isActive:
            error = query.exception()
            if error is not None:
                raise KafkaSourceError(f"the query {query.name or query.id} failed: {error}")
            return
        if caught_up(query):
            return
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(
                f"the query {query.name or query.id} has not caught up in {timeout_s:g} s: {query.status}"
            )
        time.sleep(poll_interval_s)
