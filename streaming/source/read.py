"""Reading one offset range of a Kafka partition into Arrow batches, with librdkafka
(confluent-kafka), in the Python worker of the task that processes it."""

from __future__ import annotations

import atexit
import bisect
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import pyarrow as pa

from streaming.source.options import (
    FAIL_ON_DATA_LOSS_HINT,
    SKIP_ON_DATA_LOSS_HINT,
    KafkaDataLossError,
    KafkaSourceError,
    SourceSettings,
    UnmendableErrors,
)

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

log = logging.getLogger("geoingest.kafka_source")

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", _TIMESTAMP_TYPE),
    ]
)
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(pa.field("headers", HEADERS_TYPE))

# a range ending in a gap (compaction, transaction markers) costs one such wait.
_CONSUME_WAIT_S = 0.2
# Idle consumers kept per Python worker and configuration (a worker runs one task at a time).
_POOLED_CONSUMERS = 2
# A consumer that gets no record of its range for this long is replaced by a new one. After a
# broker restart an assign()ed librdkafka consumer sometimes never fetches again, although the
# broker is back (confluentinc/librdkafka#5153, open; seen in the broker-restart test, the read
# waiting out kafkaConsumer.pollTimeoutMs), and a new consumer fetches. The read still fails
# after kafkaConsumer.pollTimeoutMs without a record.
STALLED_CONSUMER_S = 20.0


@dataclass
class _PooledConsumer:
    consumer: Consumer
    errors: UnmendableErrors


class _ConsumerPool:
    """Idle consumers of this Python worker, by configuration. Spark reuses Python workers
    across tasks: a task takes a connected consumer (connecting, TLS and SASL cost more than a
    small range's records) and gives it back unassigned, so that it fetches nothing while idle
    (pausing instead costs 0.2-0.7 s when resumed, measured). A forked worker starts empty."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._idle: dict[tuple, list[_PooledConsumer]] = {}

    def take(self, key: tuple) -> _PooledConsumer | None:
        if self._pid != os.getpid():
            self._idle = {}  # librdkafka's threads do not survive a fork: never touch these
            self._pid = os.getpid()
        idle = self._idle.get(key)
        return idle.pop() if idle else None

    def give_back(self, key: tuple, pooled: _PooledConsumer) -> None:
        try:
            pooled.consumer.unassign()
        except Exception:
            _close_quietly(pooled.consumer)
            raise
        idle = self._idle.setdefault(key, [])
        idle.append(pooled)
        while len(idle) > _POOLED_CONSUMERS:
            _close_quietly(idle.pop(0).consumer)

    def close(self) -> None:
        if self._pid == os.getpid():
            for idle in self._idle.values():
                for pooled in idle:
                    _close_quietly(pooled.consumer)
        self._idle = {}


def _close_quietly(consumer: Consumer) -> None:
    try:
        consumer.close()
    except Exception as exc:  # closing is tidying up: a consumer that cannot close is dropped
        log.debug("closing a Kafka consumer failed: %s", exc)


_POOL = _ConsumerPool()
atexit.register(_POOL.close)


def close_pooled_consumers() -> None:
    """Close the consumers this process keeps between reads (a process that read ranges
    itself, not through Spark, and is done with the broker)."""
    _POOL.close()


RANGES_SCHEMA = pa.schema(
    [("topic", pa.string()), ("partition", pa.int32()), ("start_offset", pa.int64()), ("end_offset", pa.int64())]
)


def range_batch(ranges: list[tuple[str, int, int, int]]) -> pa.RecordBatch:
    """(topic, partition, start, end) offset ranges as the rangesOnly source hands them to Spark."""
    topics, partitions, starts, ends = zip(*ranges) if ranges else ((), (), (), ())
    return pa.RecordBatch.from_arrays(
        [
            pa.array(topics, pa.string()),
            pa.array(partitions, pa.int32()),
            pa.array(starts, pa.int64()),
            pa.array(ends, pa.int64()),
        ],
        schema=RANGES_SCHEMA,
    )


class ReadingRanges:
    """A task function over Kafka records (mapInArrow's: Arrow batches in, Arrow batches out), fed
    instead with the offset ranges of the rangesOnly source: it reads each range here, in the
    Python worker that runs the task, and hands its records on as Spark's source gives them
    (key, value, topic, partition, offset, timestamp, headers). Picklable, for the executors."""

    def __init__(self, settings: SourceSettings, task: Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]):
        self.settings = settings
        self.task = task

    def __call__(self, ranges: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        return self.task(self._records(ranges))

    def _records(self, ranges: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in ranges:
            columns = [batch.column(name).to_pylist() for name in RANGES_SCHEMA.names]
            for topic, partition, start, end in zip(*columns):
                yield from read_range(self.settings, topic, partition, start, end)


def read_range(settings: SourceSettings, topic: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """The records of offsets [start, end) of topic/partition, in Arrow batches of at most
    settings.records_per_batch records; none beyond the range. Offsets that do not exist
    (compaction, transaction markers) are skipped; offsets deleted from Kafka are reported
    as failOnDataLoss says."""
    config = settings.consumer_config()
    key = tuple(sorted(config.items()))
    read = _RangeRead(settings, _POOL.take(key) or _new_consumer(config), topic, partition, start, end)
    finished = False
    try:
        yield from read.batches()
        finished = True
    finally:
        if finished:
            _POOL.give_back(key, read.pooled)
        else:  # failed, or Spark stopped reading the iterator: the consumer's state is unknown
            _close_quietly(read.pooled.consumer)


def _new_consumer(config: dict[str, str]) -> _PooledConsumer:
    from confluent_kafka import Consumer

    errors = UnmendableErrors()
    return _PooledConsumer(Consumer({**config, "error_cb": errors}), errors)


# Consumer errors that no retry of librdkafka's will mend: the read fails at once with them
# rather than after kafkaConsumer.pollTimeoutMs.
_FATAL_ERROR_CODES = frozenset(
    {
        "_AUTHENTICATION",
        "SASL_AUTHENTICATION_FAILED",
        "TOPIC_AUTHORIZATION_FAILED",
        "CLUSTER_AUTHORIZATION_FAILED",
        "_UNKNOWN_PARTITION",
        "_UNKNOWN_TOPIC",
        "UNKNOWN_TOPIC_OR_PART",
    }
)
_OUT_OF_RANGE_CODES = frozenset({"OFFSET_OUT_OF_RANGE", "_AUTO_OFFSET_RESET"})


class _RangeRead:
    """One task's read of [start, end) of a partition."""

    def __init__(
        self, settings: SourceSettings, pooled: _PooledConsumer, topic: str, partition: int, start: int, end: int
    ) -> None:
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        self._settings = settings
        self.pooled = pooled
        self._topic = topic
        self._partition = partition
        self._start = start
        self._end = end
        self._where = f"topic {topic} partition {partition}"
        self._assignment = KafkaTopicPartition(topic, partition)

    def batches(self) -> Iterator[pa.RecordBatch]:
        # Offsets deleted before the batch was planned were dealt with then (the partitions'
        # earliest offsets are asked once for all on the driver: asked here, the request would
        # wait behind the broker's answer to this consumer's last fetch, up to fetch.wait.max.ms).
        # Those deleted since come back as an out-of-range error (auto.offset.reset=error).
        start, end = self._start, self._end
        self._assign(start)
        position = start
        idle_since = fetched_since = time.monotonic()
        while position < end:
            # No more than the range can still hold: consume(n) waits for n messages or the timeout.
            wanted = min(self._settings.records_per_batch, end - position)
            messages = self.pooled.consumer.consume(num_messages=wanted, timeout=_CONSUME_WAIT_S)
            records, offsets, past_end, partition_end, out_of_range = self._sorted_out(messages, position, end)
            if out_of_range:
                # Deleted between the check above and the fetch (retention, delete-records).
                low = self._watermarks()[0]
                if low <= position:
                    raise KafkaSourceError(
                        f"{self._where}: offset {position} is out of the partition's range ({low} and up)"
                    )
                self._data_loss(
                    f"offsets {position} to {min(end, low) - 1} are gone from Kafka (the partition now starts at offset {low})"
                )
                if low >= end:
                    break
                position = low
                self._assign(position)
                continue
            if records:
                position = offsets[-1] + 1
                idle_since = fetched_since = time.monotonic()
                yield _record_batch(records, offsets, self._topic, self._partition, self._settings.include_headers)
            if past_end:
                break  # offsets up to the first record past the range do not exist: the range is read
            if partition_end is not None and position < end:
                if partition_end >= end:
                    break  # what is left of the range are offsets without a record
                # The partition ends before `end`: records gone since the batch was planned.
                high = self._watermarks()[1]
                if high <= position:
                    self._data_loss(
                        f"offsets {position} to {end - 1} are not in Kafka (the partition ends at offset {high})"
                    )
                    break
            elif not records and self.pooled.errors.last is not None:
                raise KafkaSourceError(f"{self._where}: reading at offset {position} failed: {self.pooled.errors.last}")
            elif not records and time.monotonic() - idle_since > self._settings.poll_timeout_s:
                raise KafkaSourceError(
                    f"{self._where}: no record arrived in {self._settings.poll_timeout_s:g} s at offset {position} "
                    f"of the range [{self._start}, {self._end}) (kafkaConsumer.pollTimeoutMs)"
                )
            elif not records and time.monotonic() - fetched_since > STALLED_CONSUMER_S:
                log.warning(
                    "%s: no record in %g s at offset %d; reading on with a new consumer",
                    self._where,
                    STALLED_CONSUMER_S,
                    position,
                )
                self._replace_consumer()
                self._assign(position)
                fetched_since = time.monotonic()

    def _replace_consumer(self) -> None:
        _close_quietly(self.pooled.consumer)
        self.pooled = _new_consumer(self._settings.consumer_config())

    def _assign(self, offset: int) -> None:
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        self.pooled.consumer.assign([KafkaTopicPartition(self._topic, self._partition, offset)])

    def _sorted_out(
        self, messages: list[Message], position: int, end: int
    ) -> tuple[list[Message], list[int], list[Message], int | None, bool]:
        """(records in [position, end), their offsets, records at or past end, the offset where the
        partition ended if an end-of-partition event came, whether the position is out of the
        partition's range). Other errors are raised if no retry of librdkafka's mends them, else logged."""
        from confluent_kafka import KafkaError

        partition_end: int | None = None
        out_of_range = False
        if any(m.error() is not None for m in messages):
            for event in messages:
                error = event.error()
                if error is None:
                    continue
                code = error.code()
                if code == KafkaError._PARTITION_EOF:
                    partition_end = event.offset()
                elif code in {getattr(KafkaError, name) for name in _OUT_OF_RANGE_CODES}:
                    out_of_range = True
                elif error.fatal() or code in {getattr(KafkaError, name) for name in _FATAL_ERROR_CODES}:
                    raise KafkaSourceError(f"{self._where}: reading at offset {position} failed: {error.str()}")
                else:
                    log.warning("%s: %s (librdkafka retries)", self._where, error.str())
            messages = [m for m in messages if m.error() is None]
        if not messages or out_of_range:
            return [], [], [], partition_end, out_of_range
        offsets = cast(list[int], [m.offset() for m in messages])
        # A partition's records come in offset order; `position` cuts what an earlier read of
        # this consumer left, `end` what lies past the range.
        first = bisect.bisect_left(offsets, position)
        last = bisect.bisect_left(offsets, end)
        if first == 0 and last == len(messages):
            return messages, offsets, [], partition_end, False
        return messages[first:last], offsets[first:last], messages[last:], partition_end, False

    def _watermarks(self) -> tuple[int, int]:
        from confluent_kafka import KafkaException

        timeout = min(self._settings.poll_timeout_s, self._settings.metadata_timeout_s)
        try:
            offsets = self.pooled.consumer.get_watermark_offsets(self._assignment, timeout=timeout, cached=False)
        except KafkaException as exc:
            raise KafkaSourceError(f"{self._where}: cannot get the partition's offsets: {exc}") from exc
        if offsets is None:
            raise KafkaSourceError(f"{self._where}: the partition's offsets did not arrive in {timeout:g} s")
        return offsets

    def _data_loss(self, what: str) -> None:
        message = f"{self._where}: of the range [{self._start}, {self._end}) to read, {what}"
        if self._settings.fail_on_data_loss:
            raise KafkaDataLossError(f"{message}. {FAIL_ON_DATA_LOSS_HINT}")
        log.warning("%s. %s", message, SKIP_ON_DATA_LOSS_HINT)


def _record_batch(
    records: list[Message], offsets: list[int], topic: str, partition: int, include_headers: bool
) -> pa.RecordBatch:
    n = len(records)
    timestamps_ms = np.fromiter((m.timestamp()[1] for m in records), dtype=np.int64, count=n)
    columns = [
        pa.array([m.key() for m in records], pa.binary()),
        pa.array([m.value() for m in records], pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(np.array(offsets, dtype=np.int64)),
        pa.array(timestamps_ms * 1000, _TIMESTAMP_TYPE),
    ]
    if include_headers:
        # confluent-kafka gives a record's headers as a list of (key, value) or None.
        columns.append(_headers_array(cast(list[_Headers], [m.headers() for m in records])))
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA_WITH_HEADERS)
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


_Headers = list[tuple[str, bytes | None]] | None


def _headers_array(headers: list[_Headers]) -> pa.Array:
    """Null for a record without headers, as Spark's source gives it; most records have none."""
    if not any(headers):
        return pa.nulls(len(headers), HEADERS_TYPE)
    offsets = [0]
    keys: list[str] = []
    values: list[bytes | None] = []
    missing = []
    for record_headers in headers:
        missing.append(not record_headers)
        if record_headers:
            for key, value in record_headers:
                keys.append(key)
                values.append(value)
        offsets.append(len(keys))
    entries = pa.StructArray.from_arrays(
        [pa.array(keys, pa.string()), pa.array(values, pa.binary())], fields=list(HEADERS_TYPE.value_type)
    )
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), entries, type=HEADERS_TYPE, mask=pa.array(missing))
