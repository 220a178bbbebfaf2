"""The dead-letter topic: every rejected record, untouched, with where it came from and why.

A DLQ record keeps the original key, value and headers, and adds headers:
  geoingest.reason            stable reason code (see streaming.decode.rejects.Reason)
  geoingest.detail            a message naming the offending field or value
  geoingest.source.topic      \
  geoingest.source.partition   | where the record was consumed from; consumers dedupe on these,
  geoingest.source.offset      | since DLQ writes are at-least-once (a replayed batch resends)
  geoingest.source.timestamp  /  (milliseconds since the epoch)

The `geoingest.` header namespace is the service's: a header the producer itself named so (a forged
`geoingest.reason`, say) is kept, value untouched, under `producer.` + its name, so each name above
appears once, with the service's value, whichever header a consumer reads (first or last).

A record of any size the source topic accepted is dead-lettered. One whose key, value and headers
together exceed `max_record_bytes` (or that the dead-letter topic refuses as too large), or that
kafka-python cannot produce as it was (neither key nor value; a header without a value), is stored
byte-exact as a one-row Arrow IPC file (columns key, value, headers) under `spill_location`; its
DLQ record then has no key, an empty value, none of the original headers, and two more headers:
  geoingest.payload.uri       where the original record is stored
  geoingest.payload.bytes     its key + value + headers size
The file's name is the record's source coordinates, so a replayed batch rewrites the same file.

The records are produced by the executors with kafka-python, each acknowledged before the batch
commits; a record that cannot be written after the producer's retries stops the job with
DeadLetterFailed, naming the record. (Spark's own Kafka sink would report the failure without
saying which record, and cannot spill.)
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from streaming.decode.decoder import (
    HEADERS_TYPE,
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
from streaming.source.admin import client_config
from streaming.storage import file_io, read_bytes, write_bytes

REASON_HEADER = "geoingest.reason"
DETAIL_HEADER = "geoingest.detail"
SOURCE_TOPIC_HEADER = "geoingest.source.topic"
SOURCE_PARTITION_HEADER = "geoingest.source.partition"
SOURCE_OFFSET_HEADER = "geoingest.source.offset"
SOURCE_TIMESTAMP_HEADER = "geoingest.source.timestamp"
PAYLOAD_URI_HEADER = "geoingest.payload.uri"
PAYLOAD_BYTES_HEADER = "geoingest.payload.bytes"
SERVICE_HEADER_PREFIX = "geoingest."
# Where a producer's own header in the service's namespace is moved (see the module docstring).
PRODUCER_HEADER_PREFIX = "producer."

SPILL_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("headers", HEADERS_TYPE)])
# Room for the added headers and the record batch framing above the payload itself.
_ENVELOPE_BYTES = 64 * 1024
_BOOTSTRAP_ATTEMPT_MS = 5000


@dataclass(frozen=True)
class DeadLetterConfig:
    bootstrap_servers: str
    topic: str
    # Kafka client options in Kafka's spelling (sasl.mechanism, ...); producer options apply.
    kafka_options: dict[str, str] = field(default_factory=dict)
    # Key + value + headers above this are stored under spill_location instead of inline.
    max_record_bytes: int = 8 * 1024 * 1024
    # A folder URI the table's FileIO can write (file://, s3://, ...).
    spill_location: str = ""
    io_properties: dict[str, str] = field(default_factory=dict)

    def topic_config(self) -> dict[str, str]:
        """Topic settings that let the dead-letter topic hold every inline record."""
        return {"max.message.bytes": str(self.max_record_bytes + _ENVELOPE_BYTES)}


class DeadLetterFailed(RuntimeError):
    """A rejected record could not be dead-lettered: the batch must not commit."""


def record_bytes(key: bytes | None, value: bytes | None, headers: list[dict] | None) -> int:
    return (
        len(key or b"")
        + len(value or b"")
        + sum(len(h["key"].encode("utf-8")) + len(h["value"] or b"") for h in headers or ())
    )


class DeadLetterWriter:
    """Produces the rejected rows of decoded batches to the dead-letter topic (executor side)."""

    def __init__(self, config: DeadLetterConfig):
        from kafka import KafkaProducer  # the executors import it only when there is something to send
        from kafka.errors import KafkaError

        self.config = config
        options = _typed_producer_options(
            {k: v for k, v in client_config(config.kafka_options).items() if k in KafkaProducer.DEFAULT_CONFIG}
        )
        options.update(
            bootstrap_servers=config.bootstrap_servers,
            acks="all",
            max_request_size=config.max_record_bytes + _ENVELOPE_BYTES,
            # An idempotent kafka-python producer fails every later record once the topic refused
            # one (too large), so the spilled pointer sent next would fail too. Dead letters are
            # at-least-once whatever the producer: a replayed batch sends them again.
            enable_idempotence=False,
        )
        # A broker that restarts while the batch runs is waited for as long as a send would block
        # (max.block.ms). One client's reconnect backoff grows to reconnect_backoff_max_ms (30 s),
        # which can overshoot a broker back after seconds; a new client every attempt starts over.
        deadline = time.monotonic() + options.get("max_block_ms", KafkaProducer.DEFAULT_CONFIG["max_block_ms"]) / 1000
        attempt_ms = options.get("bootstrap_timeout_ms", _BOOTSTRAP_ATTEMPT_MS)
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            try:
                self._producer = KafkaProducer(
                    **{**options, "bootstrap_timeout_ms": max(1000, min(attempt_ms, remaining_ms))}
                )
                break
            except KafkaError as exc:
                if time.monotonic() + 1 >= deadline:
                    raise DeadLetterFailed(
                        f"no producer for the dead-letter topic {config.topic!r} at "
                        f"{config.bootstrap_servers}: {type(exc).__name__}: {exc}"
                    ) from exc
                time.sleep(1)

    def send(self, decoded: pa.RecordBatch) -> int:
        """Send the rows of `decoded` that carry a reject reason; returns how many were sent.
        Every record is acknowledged by the broker before this returns. Rows are taken one at a
        time from Arrow, so a batch of large rejects is not held twice."""
        rejected = decoded.filter(pc.is_valid(decoded.column(REJECT_REASON)))
        pending = [(i, self._send(self._row(rejected, i))) for i in range(rejected.num_rows)]
        self._flush(rejected, pending)
        for i, future in pending:
            error = future.exception if future.failed() else None
            if error is not None and _too_large(error):
                # The topic's own size cap is below max_record_bytes (made by someone else): spill.
                row = self._row(rejected, i)
                retry = self._send(row, spill=True)
                self._flush(rejected, [(i, retry)])
                error = retry.exception if retry.failed() else None
            if error is not None:
                row = self._row(rejected, i)
                raise DeadLetterFailed(
                    f"the rejected record {_where(row)} ({row[REJECT_REASON]}) could not be written to the "
                    f"dead-letter topic {self.config.topic!r}: {type(error).__name__}: {error}"
                )
        return len(pending)

    def close(self) -> None:
        self._producer.close()

    @staticmethod
    def _row(rejected: pa.RecordBatch, i: int) -> dict:
        return rejected.slice(i, 1).to_pylist()[0]

    def _send(self, row: dict, spill: bool = False):
        """The future of one dead letter: inline, or a pointer to the record stored under the spill location."""
        from kafka.errors import KafkaError

        size = record_bytes(row[RAW_KEY], row[RAW_VALUE], row[RAW_HEADERS])
        try:
            if spill or size > self.config.max_record_bytes or not _writable_as_it_was(row):
                uri = self._spill(row)
                headers = _added_headers(row) + [
                    (PAYLOAD_URI_HEADER, uri.encode()),
                    (PAYLOAD_BYTES_HEADER, str(size).encode()),
                ]
                return self._producer.send(self.config.topic, key=None, value=b"", headers=headers)
            headers = _original_headers(row) + _added_headers(row)
            return self._producer.send(self.config.topic, key=row[RAW_KEY], value=row[RAW_VALUE], headers=headers)
        except KafkaError as exc:  # raised by send itself: no metadata for the topic in time, buffer full
            raise DeadLetterFailed(
                f"the rejected record {_where(row)} ({row[REJECT_REASON]}) could not be sent to "
                f"the dead-letter topic {self.config.topic!r}: {type(exc).__name__}: {exc}"
            ) from exc

    def _flush(self, rejected: pa.RecordBatch, pending: list) -> None:
        from kafka.errors import KafkaError

        try:
            self._producer.flush()
        except KafkaError as exc:
            first = self._row(rejected, pending[0][0]) if pending else None
            where = f" (from {_where(first)} on)" if first else ""
            raise DeadLetterFailed(
                f"the dead-letter topic {self.config.topic!r} did not take the rejected "
                f"records{where}: {type(exc).__name__}: {exc}"
            ) from exc

    def _spill(self, row: dict) -> str:
        if not self.config.spill_location:
            raise DeadLetterFailed(
                f"the rejected record {_where(row)} ({row[REJECT_REASON]}) must be stored beside "
                f"the dead-letter topic {self.config.topic!r}, and no spill location is set"
            )
        uri = (
            f"{self.config.spill_location.rstrip('/')}/{row[SOURCE_TOPIC]}/{row[SOURCE_PARTITION]}/"
            f"{row[SOURCE_OFFSET]}.arrow"
        )
        table = pa.Table.from_pylist(
            [{"key": row[RAW_KEY], "value": row[RAW_VALUE], "headers": row[RAW_HEADERS]}], schema=SPILL_SCHEMA
        )
        sink = io.BytesIO()
        with pa.ipc.new_file(sink, SPILL_SCHEMA) as writer:
            writer.write_table(table)
        try:
            write_bytes(file_io(self.config.io_properties, uri), uri, sink.getvalue())
        except (OSError, ValueError) as exc:  # what pyarrow's file systems raise (ValueError: an unknown scheme)
            raise DeadLetterFailed(
                f"the rejected record {_where(row)} ({row[REJECT_REASON]}) could not be stored at {uri}: {exc}"
            ) from exc
        return uri


def read_spilled(uri: str, io_properties: Mapping[str, str] | None = None) -> dict:
    """The original record (key, value, headers) a spilled dead letter points at. On an object
    store, `io_properties` are the catalog's (or `table.io.properties`): its endpoint and keys."""
    data = read_bytes(file_io(io_properties or {}, uri), uri)
    return pa.ipc.open_file(pa.BufferReader(data)).read_all().to_pylist()[0]


def _writable_as_it_was(row: dict) -> bool:
    """Whether kafka-python can produce the record unchanged: it refuses a record with neither key
    nor value (a tombstone without a key) and a header without a value, which other clients send."""
    has_key_or_value = row[RAW_KEY] is not None or row[RAW_VALUE] is not None
    return has_key_or_value and all(h["value"] is not None for h in row[RAW_HEADERS] or ())


def _original_headers(row: dict) -> list[tuple[str, bytes]]:
    return [
        (PRODUCER_HEADER_PREFIX + h["key"] if h["key"].startswith(SERVICE_HEADER_PREFIX) else h["key"], h["value"])
        for h in row[RAW_HEADERS] or ()
    ]


def _added_headers(row: dict) -> list[tuple[str, bytes]]:
    timestamp = row[SOURCE_TIMESTAMP]
    millis = "" if timestamp is None else str(int(timestamp.timestamp() * 1000))
    return [
        (REASON_HEADER, row[REJECT_REASON].encode()),
        (DETAIL_HEADER, (row[REJECT_DETAIL] or "").encode("utf-8", "backslashreplace")),
        (SOURCE_TOPIC_HEADER, (row[SOURCE_TOPIC] or "").encode()),
        (SOURCE_PARTITION_HEADER, str(row[SOURCE_PARTITION]).encode()),
        (SOURCE_OFFSET_HEADER, str(row[SOURCE_OFFSET]).encode()),
        (SOURCE_TIMESTAMP_HEADER, millis.encode()),
    ]


def _where(row: dict) -> str:
    return f"{row[SOURCE_TOPIC]}/{row[SOURCE_PARTITION]}/{row[SOURCE_OFFSET]}"


def _too_large(error: BaseException) -> bool:
    from kafka.errors import MessageSizeTooLargeError, RecordListTooLargeError

    return isinstance(error, MessageSizeTooLargeError | RecordListTooLargeError)


def _typed_producer_options(options: dict) -> dict:
    """Settings come as strings; kafka-python wants numbers where its defaults are numbers."""
    from kafka import KafkaProducer

    typed = {}
    for key, value in options.items():
        default = KafkaProducer.DEFAULT_CONFIG.get(key)
        try:
            if isinstance(value, str) and isinstance(default, int) and not isinstance(default, bool):
                value = int(value)
            elif isinstance(value, str) and isinstance(default, float):
                value = float(value)
        except ValueError:
            pass  # a word where the default is a number (acks=all): the client reads it
        typed[key] = value
    return typed


def dead_letter_fn(config: DeadLetterConfig):
    """A mapInArrow function: sends the rejected rows of each partition, yields how many."""

    def send(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writer = None
        sent = 0
        try:
            for batch in batches:
                if batch.num_rows:
                    writer = writer or DeadLetterWriter(config)
                    sent += writer.send(batch)
        finally:
            if writer is not None:
                writer.close()
        yield pa.RecordBatch.from_pydict({"sent": [sent]}, schema=pa.schema([("sent", pa.int64())]))

    return send


def send_dead_letters(decoded, config: DeadLetterConfig) -> int:
    """Send the rejected rows of a decoded Spark DataFrame from the executors; returns how many."""
    from pyspark.sql import functions as F

    rejected = decoded.where(F.col(REJECT_REASON).isNotNull())
    return sum(row["sent"] for row in rejected.mapInArrow(dead_letter_fn(config), "sent long").collect())
