"""The dead-letter topic: every rejected record, untouched, with where it came from and why.

A DLQ record keeps the original key, value and headers, and adds headers:
  geoingest.reason            stable reason code (see streaming.decode.Reason)
  geoingest.detail            a message naming the offending field or value
  geoingest.source.topic      \
  geoingest.source.partition   | where the record was consumed from; consumers dedupe on these,
  geoingest.source.offset      | since DLQ writes are at-least-once (a replayed batch resends)
  geoingest.source.timestamp  /  (milliseconds since the epoch)
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from streaming.decode import (
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

REASON_HEADER = "geoingest.reason"
DETAIL_HEADER = "geoingest.detail"
SOURCE_TOPIC_HEADER = "geoingest.source.topic"
SOURCE_PARTITION_HEADER = "geoingest.source.partition"
SOURCE_OFFSET_HEADER = "geoingest.source.offset"
SOURCE_TIMESTAMP_HEADER = "geoingest.source.timestamp"


def _source_headers() -> dict[str, Column]:
    return {
        SOURCE_TOPIC_HEADER: F.col(SOURCE_TOPIC),
        SOURCE_PARTITION_HEADER: F.col(SOURCE_PARTITION).cast("string"),
        SOURCE_OFFSET_HEADER: F.col(SOURCE_OFFSET).cast("string"),
        SOURCE_TIMESTAMP_HEADER: (F.unix_micros(F.col(SOURCE_TIMESTAMP)) / 1000).cast("long").cast("string"),
    }


def _header(key: str, value: Column) -> Column:
    return F.struct(F.lit(key).alias("key"), value.cast("binary").alias("value"))


def dead_letter_records(decoded: DataFrame) -> DataFrame:
    """The rejected rows of a decoded batch as Kafka records (key, value, headers)."""
    added = F.array(
        _header(REASON_HEADER, F.col(REJECT_REASON)),
        _header(DETAIL_HEADER, F.col(REJECT_DETAIL)),
        *(_header(k, v) for k, v in _source_headers().items()),
    )
    original = F.coalesce(F.col(RAW_HEADERS), F.array().cast("array<struct<key:string,value:binary>>"))
    return decoded.where(F.col(REJECT_REASON).isNotNull()).select(
        F.col(RAW_KEY).alias("key"),
        F.col(RAW_VALUE).alias("value"),
        F.concat(original, added).alias("headers"),
    )


def send_dead_letters(decoded: DataFrame, bootstrap_servers: str, topic: str,
                      kafka_options: dict[str, str]) -> None:
    writer = (
        dead_letter_records(decoded).write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("topic", topic)
    )
    for key, value in kafka_options.items():
        writer = writer.option(f"kafka.{key}", value)
    writer.save()
