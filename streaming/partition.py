"""One input partition of a micro-batch, in one pass: decode, dead letters, Hilbert sort, write.

Runs on an executor over the Arrow batches Spark's Kafka source hands the Python worker, and
returns the few rows the driver needs: per (topic, partition, reject reason) the offset range,
count and oldest Kafka timestamp, and one row per data file written. Rows never leave the task.

Valid rows are kept (only the columns the files hold) until `rows_per_run` of them have arrived,
then sorted by Hilbert key and written as files of about the contract's target size, each a
contiguous stretch of the curve. A task's memory is therefore bounded by one run, whatever the
batch size. Pure Python over Arrow: no Spark import, so the benchmark's limit chain and the tests
run exactly this code.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming.contract import Contract
from streaming.dead_letter import DeadLetterConfig, DeadLetterWriter
from streaming.decode import (
    HILBERT,
    REJECT_REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    DecodeOptions,
    Decoder,
)
from streaming.isolation import IsolatedDecoder
from streaming.writer import DATA_FILE_RECORD_DDL, RECORD_SCHEMA, DataFileRecord, GeoParquetWriter

TALLY = "tally"
FILE = "file"

# The rows a task returns: a tally row (one per topic, partition and reject reason, null for the
# valid rows) or a file row (one per data file written), told apart by `kind`.
RESULT_SCHEMA = pa.schema([
    ("kind", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("reason", pa.string()),
    ("first", pa.int64()), ("last", pa.int64()), ("n", pa.int64()), ("oldest_ms", pa.int64()),
    *RECORD_SCHEMA,
])
RESULT_DDL = ("kind string, topic string, partition int, reason string, first long, last long, n long, "
              f"oldest_ms long, {DATA_FILE_RECORD_DDL}")


@dataclass(frozen=True)
class Tally:
    """Records of one topic-partition that share a fate (a reject reason, or None: valid)."""

    topic: str
    partition: int
    reason: str | None
    first: int
    last: int
    n: int
    oldest_ms: int | None


@dataclass(frozen=True)
class FileSettings:
    """Where and how a task writes its files (everything it needs of the table, no catalog)."""

    table_properties: dict[str, str]
    io_properties: dict[str, str]
    data_location: str
    file_prefix: str


@dataclass(frozen=True)
class PartitionTask:
    contract: Contract
    decode: DecodeOptions
    files: FileSettings
    dead_letter: DeadLetterConfig | None = None  # None: rejects are counted, not sent
    rows_per_run: int = 1_000_000
    # Decode in a child process, halving after a crash (a batch that crashed a worker: isolation.py)
    isolate_decoder: bool = False

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The mapInArrow function: Kafka source batches in, tally and file rows out."""
        decoder = IsolatedDecoder(self.contract, self.decode) if self.isolate_decoder else Decoder(self.contract,
                                                                                                   self.decode)
        keep = [*self.contract.arrow_schema().names, HILBERT]
        writer = GeoParquetWriter(self.contract, self.files.table_properties, self.files.io_properties,
                                  self.files.data_location, self.files.file_prefix)
        tallies: list[pa.Table] = []
        run: list[pa.RecordBatch] = []
        run_rows = 0
        records: list[DataFileRecord] = []
        dead_letters: DeadLetterWriter | None = None
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                decoded = decoder.decode(batch)
                tallies.append(tally_table(decoded))
                rejected = decoded.column(REJECT_REASON).null_count < decoded.num_rows
                if rejected and self.dead_letter is not None:
                    dead_letters = dead_letters or DeadLetterWriter(self.dead_letter)
                    dead_letters.send(decoded)
                valid = decoded.filter(pc.is_null(decoded.column(REJECT_REASON))).select(keep)
                if valid.num_rows:
                    run.append(valid)
                    run_rows += valid.num_rows
                if run_rows >= self.rows_per_run:
                    records += writer.write(hilbert_sorted(run))
                    run, run_rows = [], 0
            if run_rows:
                records += writer.write(hilbert_sorted(run))
        finally:
            if dead_letters is not None:
                dead_letters.close()
            if isinstance(decoder, IsolatedDecoder):
                decoder.close()
        yield results_batch(merge_tallies(tallies), records)


def tally_table(decoded: pa.RecordBatch) -> pa.Table:
    """Offset range, count and oldest timestamp per (topic, partition, reason) of a decoded batch."""
    table = pa.table({
        "topic": decoded.column(SOURCE_TOPIC), "partition": decoded.column(SOURCE_PARTITION),
        "reason": decoded.column(REJECT_REASON), "offset": decoded.column(SOURCE_OFFSET),
        "timestamp": decoded.column(SOURCE_TIMESTAMP).cast(pa.int64()),
    })
    grouped = table.group_by(["topic", "partition", "reason"], use_threads=False).aggregate(
        [("offset", "min"), ("offset", "max"), ("offset", "count"), ("timestamp", "min")])
    return pa.table({
        "topic": grouped.column("topic"), "partition": grouped.column("partition"),
        "reason": grouped.column("reason"), "first": grouped.column("offset_min"),
        "last": grouped.column("offset_max"), "n": grouped.column("offset_count"),
        # microseconds (Spark's timestamp unit) to the milliseconds Kafka speaks
        "oldest_ms": pc.divide(grouped.column("timestamp_min"), 1000),
    })


def merge_tallies(tables: list[pa.Table]) -> list[Tally]:
    if not tables:
        return []
    grouped = pa.concat_tables(tables).group_by(["topic", "partition", "reason"], use_threads=False).aggregate(
        [("first", "min"), ("last", "max"), ("n", "sum"), ("oldest_ms", "min")])
    return [Tally(r["topic"], r["partition"], r["reason"], r["first_min"], r["last_max"], r["n_sum"],
                  r["oldest_ms_min"]) for r in grouped.to_pylist()]


def hilbert_sorted(run: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The rows of a run in Hilbert key order (stable: equal keys keep their arrival order)."""
    table = pa.Table.from_batches(run)
    order = np.argsort(table.column(HILBERT).to_numpy(), kind="stable")
    return iter(table.take(pa.array(order)).to_batches())


def results_batch(tallies: list[Tally], records: list[DataFileRecord]) -> pa.RecordBatch:
    rows = [{"kind": TALLY, "topic": t.topic, "partition": t.partition, "reason": t.reason, "first": t.first,
             "last": t.last, "n": t.n, "oldest_ms": t.oldest_ms} for t in tallies]
    rows += [{"kind": FILE, **r.to_row()} for r in records]
    return pa.RecordBatch.from_pylist(rows, schema=RESULT_SCHEMA)


@dataclass
class BatchResults:
    """What the driver collected of a micro-batch: tallies and files of all its tasks."""

    tallies: list[Tally] = field(default_factory=list)
    files: list[DataFileRecord] = field(default_factory=list)

    @classmethod
    def from_rows(cls, rows: Iterable) -> BatchResults:
        out = cls()
        for row in rows:
            if row["kind"] == TALLY:
                out.tallies.append(Tally(row["topic"], row["partition"], row["reason"], row["first"], row["last"],
                                         row["n"], row["oldest_ms"]))
            else:
                out.files.append(DataFileRecord.from_row(row))
        return out
