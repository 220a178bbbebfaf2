"""Upsert: one current row per primary key, kept with Iceberg equality deletes.

A batch of an upsert table (contract `mode: upsert`) writes, in one snapshot:
  - the last version of every key it carries, as ordinary data files;
  - an equality delete file listing every key the batch touched (updated or deleted), on the
    contract's `primary_key` columns. Its sequence number is the batch's, so by the Iceberg spec
    it removes the rows of those keys from every older data file and none from the batch's own.
A tombstone (a record with a key and no value) deletes its key: the key is listed, no row written.

Order of versions: the Kafka order. Within a partition, the higher offset wins; between partitions
(a producer that sent one key to several, a topic whose partitions were added), the later Kafka
timestamp, then the higher partition and offset. Every version of a key in a batch meets in one
reducer, however the source split the partitions' ranges over tasks (streaming/write/versions.py):
a task first keeps the last record of each (key, partition) of its range (`last_per_partition`),
the reducer then chooses among those of every task (`latest_versions`).

Pure functions over Arrow and numpy, run by the tasks (streaming/write/task.py).
"""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO

from streaming.contract import Contract
from streaming.write.data_files import EQUALITY_DELETES, DataFileRecord, write_plain_file

# Columns of the Kafka source batch that place a record, and order versions (TIMESTAMP as int64 us).
TOPIC, PARTITION, OFFSET, TIMESTAMP = "topic", "partition", "offset", "timestamp"


def tombstone_key_column(contract: Contract) -> str | None:
    """The primary key column a tombstone's Kafka key fills, or None when tombstones cannot delete
    (a primary key of several columns, or one not fed by the Kafka key: then a tombstone is the
    `null_value` reject it is in append mode)."""
    if contract.mode != "upsert" or len(contract.primary_key) != 1:
        return None
    column = next(c for c in contract.columns if c.name == contract.primary_key[0])
    return column.name if "kafka.key" in column.sources and column.type in ("string", "binary") else None


def split_tombstones(batch: pa.RecordBatch, contract: Contract) -> tuple[pa.RecordBatch, pa.Table]:
    """(the records to decode, the tombstones as a table of their key column and Kafka position).

    A tombstone whose key is not valid UTF-8 for a string key stays with the records to decode,
    which reject it as `null_value` with the rest of its story in the dead letter."""
    name = tombstone_key_column(contract)
    empty = pa.table({})
    if name is None:
        return batch, empty
    key, value = batch.column("key"), batch.column("value")
    is_tombstone = pc.and_(pc.is_null(value), pc.is_valid(key))
    key_type = next(c for c in contract.columns if c.name == name).type
    if key_type == "string":
        is_tombstone = pc.and_(is_tombstone, _valid_utf8(key))
    if not pc.any(is_tombstone).as_py():
        return batch, empty
    tombstones = batch.filter(is_tombstone)
    keys = tombstones.column("key")
    if key_type == "string":
        keys = keys.cast(pa.string())
    timestamps = tombstones.column("timestamp")
    timestamps = timestamps.cast(pa.timestamp("us", tz=getattr(timestamps.type, "tz", None)))
    table = pa.table(
        {
            name: keys,
            TOPIC: tombstones.column("topic").cast(pa.string()),
            PARTITION: tombstones.column("partition").cast(pa.int32()),
            OFFSET: tombstones.column("offset").cast(pa.int64()),
            TIMESTAMP: timestamps.cast(pa.int64()),
        }
    )
    return batch.filter(pc.invert(is_tombstone)), table


def _valid_utf8(values: pa.Array) -> pa.Array:
    try:
        values.cast(pa.string())
        return pa.array(np.ones(len(values), dtype=bool))
    except pa.ArrowInvalid:
        return pa.array([v is None or _decodes(v) for v in values.to_pylist()], type=pa.bool_())


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def last_per_partition(rows: pa.Table, tombstones: pa.Table, key_columns: tuple[str, ...]) -> tuple[pa.Table, pa.Table]:
    """(the rows, the tombstones) that are the last record of their (key, partition): the highest
    offset, which stays the highest whatever other tasks read of the same partition, so a reducer
    that sees every task's last records chooses as if it saw every record.

    Both carry the key columns and PARTITION and OFFSET; the order of each is kept."""
    n_rows = rows.num_rows
    keys = keys_and_positions(rows, tombstones, key_columns)
    if keys.num_rows == 0:
        return rows, tombstones
    code = key_codes(keys, key_columns)
    partition = keys.column(PARTITION).to_numpy(zero_copy_only=False).astype(np.int64)
    offset = keys.column(OFFSET).to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.lexsort((offset, partition, code))
    last = order[_last_of_runs(code[order], partition[order])]
    kept_rows = np.sort(last[last < n_rows])
    kept_tombstones = np.sort(last[last >= n_rows] - n_rows)
    return rows.take(pa.array(kept_rows)), tombstones.take(
        pa.array(kept_tombstones)
    ) if tombstones.num_rows else tombstones


def latest_versions(rows: pa.Table, tombstones: pa.Table, key_columns: tuple[str, ...]) -> tuple[pa.Table, pa.Table]:
    """(the rows to write: each key's last version unless its last record is a tombstone,
    the keys touched: one row per key, the key columns only).

    `rows` and `tombstones` carry the key columns and PARTITION, OFFSET and TIMESTAMP (int64 us).
    Within a partition the higher offset wins; across partitions the later timestamp (then the
    higher partition, then offset), so the choice is the same whichever task order the batch had."""
    n_rows = rows.num_rows
    keys = keys_and_positions(rows, tombstones, key_columns)
    if keys.num_rows == 0:
        return rows, keys.select(list(key_columns))
    code = key_codes(keys, key_columns)
    partition = keys.column(PARTITION).to_numpy(zero_copy_only=False).astype(np.int64)
    offset = keys.column(OFFSET).to_numpy(zero_copy_only=False).astype(np.int64)
    timestamp = keys.column(TIMESTAMP).to_numpy(zero_copy_only=False).astype(np.int64)
    # The last record of each (key, partition), then the last of those per key.
    order = np.lexsort((offset, partition, code))
    last_in_partition = order[_last_of_runs(code[order], partition[order])]
    c, t, p, o = (a[last_in_partition] for a in (code, timestamp, partition, offset))
    order = np.lexsort((o, p, t, c))
    winners = last_in_partition[order[_last_of_runs(c[order])]]
    written = np.sort(winners[winners < n_rows])
    first_of_key = np.unique(code, return_index=True)[1]
    return rows.take(pa.array(written)), keys.select(list(key_columns)).take(pa.array(first_of_key))


def keys_and_positions(rows: pa.Table, tombstones: pa.Table, key_columns: tuple[str, ...]) -> pa.Table:
    """The key columns and the Kafka position of the rows, then of the tombstones, as one table."""
    positions = [*key_columns, PARTITION, OFFSET, TIMESTAMP]
    parts = [rows.select(positions)]
    if tombstones.num_rows:
        parts.append(tombstones.select(positions))
    return pa.concat_tables(parts, promote_options="permissive").combine_chunks()


def key_codes(keys: pa.Table, key_columns: tuple[str, ...]) -> np.ndarray:
    """One integer per distinct key (over all key columns), equal for equal keys."""
    codes = [
        np.asarray(pc.dictionary_encode(keys.column(name).combine_chunks()).indices.to_numpy(zero_copy_only=False))
        for name in key_columns
    ]
    if len(codes) == 1:
        return codes[0].astype(np.int64)
    return np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _last_of_runs(*sorted_keys: np.ndarray) -> np.ndarray:
    """Positions of the last element of each run of equal values (over all arrays) in sorted order."""
    n = len(sorted_keys[0])
    ends = np.zeros(n, dtype=bool)
    ends[-1] = True
    for values in sorted_keys:
        ends[:-1] |= values[1:] != values[:-1]
    return np.flatnonzero(ends)


def write_equality_deletes(
    keys: pa.Table,
    contract: Contract,
    io: FileIO,
    table_properties: dict[str, str],
    data_location: str,
    file_prefix: str,
) -> DataFileRecord:
    """The keys as an equality delete file on the primary key columns, with their Iceberg field ids."""
    file_schema = contract.data_file_schema
    schema = pa.schema([file_schema.field(name) for name in contract.primary_key])
    path = f"{data_location.rstrip('/')}/{file_prefix}-eq-deletes-{uuid.uuid4().hex}.parquet"
    table = keys.select(list(contract.primary_key)).cast(schema)
    return write_plain_file(io, path, table, contract.iceberg_schema, table_properties, EQUALITY_DELETES)


def equality_field_ids(contract: Contract) -> list[int]:
    ids = {c.name: c.id for c in contract.columns}
    return [ids[name] for name in contract.primary_key]
