"""Rejects as an Iceberg table, beside the dead-letter topic: users query them with SQL.

With the setting `rejects_table`, every task writes the rows its decoder rejected to Parquet files
of that table (one per day of their Kafka timestamps, the table's partitions), and hands the driver
their `DataFileRecord`s (content REJECTS) with its data files. The driver commits them to the
rejects table first, then the batch to the data table, each under the batch's identity: a replayed
batch finds its rejects committed and skips them, as it skips its data files (streaming/table/commit.py).
A batch is thus never in the data table without its rejects.

A row is the record as it came (key, value, headers: the raw bytes, as the dead-letter topic
keeps them), where it came from (topic, partition, offset, Kafka timestamp), why it was rejected
(the stable reason code and the detail naming the field or value), the table it was meant for and
when it was rejected.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import (
    schema_to_pyarrow,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

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
from streaming.write.data_files import DataFileRecord, records_to_arrow, write_plain_file

REJECTS = "rejects"  # DataFileRecord.content of a rejects table's file

# The field ids are those Iceberg assigns when it creates the table (fields of a struct first, then
# what nests in them), so the writers' files and the created table agree.
REJECTS_SCHEMA = Schema(
    NestedField(1, "reason", StringType(), required=True),
    NestedField(2, "detail", StringType(), required=False),
    NestedField(3, "source_topic", StringType(), required=True),
    NestedField(4, "source_partition", IntegerType(), required=True),
    NestedField(5, "source_offset", LongType(), required=True),
    NestedField(6, "source_timestamp", TimestamptzType(), required=True),
    NestedField(7, "key", BinaryType(), required=False),
    NestedField(8, "value", BinaryType(), required=False),
    NestedField(
        9,
        "headers",
        ListType(
            12,
            StructType(
                NestedField(13, "key", StringType(), required=False),
                NestedField(14, "value", BinaryType(), required=False),
            ),
            element_required=False,
        ),
        required=False,
    ),
    NestedField(10, "target_table", StringType(), required=True),
    NestedField(11, "rejected_at", TimestamptzType(), required=True),
)
# By day of the Kafka timestamp: retention and time windows prune as on a data table.
REJECTS_SPEC = PartitionSpec(
    PartitionField(source_id=6, field_id=1000, transform=DayTransform(), name="source_timestamp_day")
)
_ARROW_SCHEMA = schema_to_pyarrow(REJECTS_SCHEMA)
_US_PER_DAY = 86_400_000_000


@dataclass(frozen=True)
class RejectsTableFiles:
    """Where a task writes the rejects of one batch (everything it needs of the rejects table)."""

    target_table: str  # the data table the records were meant for
    data_location: str
    file_prefix: str
    io_properties: dict[str, str] = field(default_factory=dict)
    table_properties: dict[str, str] = field(default_factory=dict)


class RejectsWriter:
    """Collects a task's rejected rows and writes them as the rejects table's files (executor side)."""

    def __init__(self, files: RejectsTableFiles):
        self.files = files
        self._pending: list[pa.Table] = []

    def add(self, decoded: pa.RecordBatch) -> None:
        """Keep the rows of `decoded` that carry a reject reason, as rows of the rejects table."""
        rejected = decoded.filter(pc.is_valid(decoded.column(REJECT_REASON)))
        if rejected.num_rows:
            self._pending.append(rejects_rows(rejected, self.files.target_table))

    def write(self) -> list[DataFileRecord]:
        """One file per day partition of the rows added; their records for the committer."""
        if not self._pending:
            return []
        rows = pa.concat_tables(self._pending)
        self._pending = []
        io = load_file_io(self.files.io_properties, self.files.data_location)
        days = _days(rows.column("source_timestamp"))
        records = []
        for day in np.unique(days):
            records.append(self._write_day(rows.filter(pa.array(days == day)), int(day), io))
        return records

    def _write_day(self, rows: pa.Table, day: int, io) -> DataFileRecord:
        date = time.strftime("%Y-%m-%d", time.gmtime(day * 86_400))
        path = (
            f"{self.files.data_location.rstrip('/')}/source_timestamp_day={date}/"
            f"{self.files.file_prefix}-rejects-{uuid.uuid4().hex}.parquet"
        )
        return write_plain_file(io, path, rows, REJECTS_SCHEMA, self.files.table_properties, REJECTS, (day,))


def rejects_rows(rejected: pa.RecordBatch, target_table: str) -> pa.Table:
    """The decoder's reject rows as rows of the rejects table."""
    n = rejected.num_rows
    now = pa.scalar(int(time.time() * 1_000_000), pa.timestamp("us", tz="UTC"))
    columns = {
        "reason": rejected.column(REJECT_REASON),
        "detail": rejected.column(REJECT_DETAIL),
        "source_topic": rejected.column(SOURCE_TOPIC),
        "source_partition": rejected.column(SOURCE_PARTITION),
        "source_offset": rejected.column(SOURCE_OFFSET),
        "source_timestamp": rejected.column(SOURCE_TIMESTAMP),
        "key": rejected.column(RAW_KEY),
        "value": rejected.column(RAW_VALUE),
        "headers": rejected.column(RAW_HEADERS),
        "target_table": pa.array([target_table] * n, pa.string()),
        "rejected_at": pa.array([now] * n, now.type),
    }
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in _ARROW_SCHEMA], schema=_ARROW_SCHEMA)


def _days(timestamps: pa.ChunkedArray) -> np.ndarray:
    micros = timestamps.cast(pa.int64()).to_numpy()
    return micros // _US_PER_DAY


@dataclass(frozen=True)
class WriteRejects:
    """The mapInArrow function of the shuffle clustering: decoded reject rows in, the rejects
    table's file records out."""

    files: RejectsTableFiles

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writer = RejectsWriter(self.files)
        for batch in batches:
            writer.add(batch)
        yield records_to_arrow(writer.write())
