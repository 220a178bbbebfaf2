"""Write Hilbert-sorted rows as GeoParquet data files; describe each file in one small record.

Runs on the executors. The driver never sees rows, only `DataFileRecord`s: path, size, record
count and the Iceberg column metrics, including the bbox.* bounds that pyiceberg does not
compute for fields nested in a struct.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import (
    _get_parquet_writer_kwargs,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.table import TableProperties
from pyiceberg.types import DoubleType

from streaming.contract import BBOX_FIELDS, Contract
from streaming.kernels.geoparquet import geo_metadata_bytes
from streaming.kernels.wkb import geometry_type_names, wkb_storage
from streaming.write.file_types import as_types, with_native_geometry
from streaming.write.partitions import PartitionLayout, partition_path, split_by_partition, with_cells

# Spark DDL of the rows the write stage returns to the driver.
DATA_FILE_RECORD_DDL = (
    "path string, file_size_in_bytes long, record_count long, "
    "xmin double, ymin double, xmax double, ymax double, metrics string, content string, partition_values string, "
    "spec_id int"
)
DATA = "data"
EQUALITY_DELETES = "equality_deletes"
_BOUND_KEYS = ("lower_bounds", "upper_bounds")
# In a native-geometry file's metrics: its geometries' planar extent (DataFileRecord.geometry_extent).
GEOMETRY_EXTENT = "geometry_extent"

# `{prefix}-t{write time, epoch ms}-{uuid}.parquet`
_WRITTEN_MS = re.compile(r"-t(\d{13})-[0-9a-f]{32}\.parquet$")


def data_file_name(prefix: str, now_ms: int | None = None) -> str:
    """A new data file's name, with the time it is written in it: the one record of a file's age
    that outlives the snapshot that added it (expiry removes that snapshot's time), which
    compaction's `min_file_age_s` needs."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{prefix}-t{ms:013d}-{uuid.uuid4().hex}.parquet"


def written_ms(path: str) -> int | None:
    """The write time `data_file_name` put in a file's name; None for a name without one (files
    written before names carried it, or by another writer)."""
    found = _WRITTEN_MS.search(path)
    return int(found.group(1)) if found else None


# Footer key: how many rows of the file have a bbox crossing the anti-meridian (short-way tables).
WRAPPED_ROWS_KEY = "geoingest.wrapped_rows"


@dataclass(frozen=True)
class DataFileRecord:
    """One written data file, as the committer needs it."""

    path: str
    file_size_in_bytes: int
    record_count: int
    bbox: tuple[float, float, float, float]
    # Iceberg DataFile statistics: column_sizes, value_counts, null_value_counts, nan_value_counts,
    # lower_bounds, upper_bounds (field id -> value; bounds hex-encoded) and split_offsets.
    metrics: dict
    # DATA, or EQUALITY_DELETES: the primary keys an upsert batch replaces or deletes (streaming/write/upsert.py)
    content: str = DATA
    # The values of the file's partition, in the order of its spec's fields (() unpartitioned)
    partition_values: tuple = ()
    # The partition spec the values were computed with (None: written without a spec in mind): the
    # spec the file is committed under, whatever the table's default is by then.
    spec_id: int | None = None

    def to_row(self) -> dict:
        return {
            "path": self.path,
            "file_size_in_bytes": self.file_size_in_bytes,
            "record_count": self.record_count,
            **dict(zip(BBOX_FIELDS, self.bbox)),
            "metrics": json.dumps(self.metrics, separators=(",", ":")),
            "content": self.content,
            "partition_values": json.dumps(list(self.partition_values)),
            "spec_id": self.spec_id,
        }

    @classmethod
    def from_row(cls, row) -> DataFileRecord:
        get = row.__getitem__
        xmin, ymin, xmax, ymax = (float(get(k)) for k in BBOX_FIELDS)
        return cls(
            path=get("path"),
            file_size_in_bytes=int(get("file_size_in_bytes")),
            record_count=int(get("record_count")),
            bbox=(xmin, ymin, xmax, ymax),
            metrics=json.loads(get("metrics")),
            content=get("content") or DATA,
            partition_values=tuple(json.loads(_optional(row, "partition_values") or "[]")),
            spec_id=_optional(row, "spec_id"),
        )

    @property
    def geometry_extent(self) -> tuple[float, float, float, float] | None:
        """(xmin, ymin, xmax, ymax) of the geometries' vertices, from Parquet's geospatial
        statistics (native-geometry files only; None where they are missing)."""
        extent = self.metrics.get(GEOMETRY_EXTENT)
        return None if extent is None else (extent[0], extent[1], extent[2], extent[3])

    def statistics(self) -> dict:
        """The metrics as pyiceberg's DataFile arguments (int keys, bytes bounds)."""
        out: dict = {}
        for key, value in self.metrics.items():
            if key == GEOMETRY_EXTENT:
                continue
            if key in _BOUND_KEYS:
                out[key] = {int(k): bytes.fromhex(v) for k, v in value.items()}
            elif isinstance(value, dict):
                out[key] = {int(k): v for k, v in value.items()}
            else:
                out[key] = value
        return out


def records_to_arrow(records: list[DataFileRecord]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([r.to_row() for r in records], schema=RECORD_SCHEMA)


RECORD_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("file_size_in_bytes", pa.int64()),
        ("record_count", pa.int64()),
        ("xmin", pa.float64()),
        ("ymin", pa.float64()),
        ("xmax", pa.float64()),
        ("ymax", pa.float64()),
        ("metrics", pa.string()),
        ("content", pa.string()),
        ("partition_values", pa.string()),
        ("spec_id", pa.int32()),
    ]
)


def _optional(row, key: str):
    try:
        return row[key]
    except (KeyError, ValueError, IndexError):
        return None


def parquet_write_options(table_properties: dict[str, str]) -> dict:
    """The Parquet writer options the table's write.parquet.* properties ask for (codec, level,
    page size, page row limit), read by the rules of pyiceberg's own writer (a private helper of
    the pinned pyiceberg) so that both write a table alike. A codec or level this pyarrow cannot
    write is an error that names the property, raised before any file is opened."""
    options = _get_parquet_writer_kwargs(table_properties)
    codec, level = options["compression"], options["compression_level"]
    try:
        if codec != "none":
            pa.Codec(codec, level)
    except (ValueError, pa.ArrowException) as exc:
        asked = f"{TableProperties.PARQUET_COMPRESSION}={codec!r}"
        if level is not None:
            asked += f", {TableProperties.PARQUET_COMPRESSION_LEVEL}={level}"
        raise ValueError(f"table properties {asked}: {exc}") from None
    return options


@dataclass(frozen=True)
class FileSettings:
    """Where and how a task writes its files (everything it needs of the table, no catalog)."""

    table_properties: dict[str, str]
    io_properties: dict[str, str]
    data_location: str
    file_prefix: str
    # The table's partition spec (None: unpartitioned)
    partition: PartitionLayout | None = None

    def writer(self, contract: Contract) -> GeoParquetWriter:
        return GeoParquetWriter(
            contract, self.table_properties, self.io_properties, self.data_location, self.file_prefix, self.partition
        )


class GeoParquetWriter:
    """Cuts a stream of sorted rows into files of about `target_file_bytes`, in row groups of
    `row_group_rows`, each file with GeoParquet metadata and Iceberg field ids."""

    def __init__(
        self,
        contract: Contract,
        table_properties: dict[str, str],
        io_properties: dict[str, str],
        data_location: str,
        file_prefix: str,
        partition: PartitionLayout | None = None,
    ):
        self.contract = contract
        self.partition = partition
        self.schema = contract.data_file_schema
        if contract.geometry.native:
            self.schema = with_native_geometry(self.schema, contract.geometry.name, contract.geometry.native_crs)
        iceberg_schema = contract.iceberg_schema
        stats_properties = dict(table_properties)
        if contract.geometry.native:
            # Parquet's GEOMETRY has geospatial statistics, not the min/max pyiceberg reads (it
            # would warn on every file); the manifests' geometry bounds come from those statistics
            # (DataFileRecord.geometry_extent, streaming/table/native.py).
            stats_properties[f"write.metadata.metrics.column.{contract.geometry.name}"] = "none"
        self._stats_plan = compute_statistics_plan(iceberg_schema, stats_properties)
        self._parquet_options = parquet_write_options(table_properties)
        self._path_ids = parquet_path_to_id_mapping(iceberg_schema)
        self.io = load_file_io(properties=io_properties, location=data_location)
        self._data_location = data_location.rstrip("/")
        self._file_prefix = file_prefix
        self._bbox_ids = contract.bbox_field_ids

    def write(self, batches: Iterable[pa.RecordBatch]) -> Iterator[DataFileRecord]:
        """Files of the sorted rows: for a partitioned table, the rows of each partition apart
        (one stretch of files each, in the rows' order), for any other in one stretch. Under the
        short-way reading, rows whose bbox crosses the anti-meridian (xmin > xmax) go to files of
        their own, so that every file's manifest bounds describe either plain boxes or wrapped ones
        (docs/antimeridian.md)."""
        if self.partition is None or not self.partition.fields:
            yield from self._write_partition(batches, ())
            return
        rows = [b for b in batches if b.num_rows]
        if not rows:
            return
        table = with_cells(pa.Table.from_batches(rows), self.contract)
        # Whether any row wraps, asked once of the batch rather than of each partition's rows.
        plain = not self._wrapped(table.column(self.contract.bbox_name).combine_chunks()).any()
        for values, part in split_by_partition(table, self.partition):
            yield from self._write_partition(part.to_batches(), values, plain)

    def _write_partition(
        self, batches: Iterable[pa.RecordBatch], values: tuple, plain: bool = False
    ) -> Iterator[DataFileRecord]:
        """`plain`: no row of these wraps, known already."""
        rows = self.contract.clustering.row_group_rows
        folder = partition_path(self.partition, values)
        lanes = {False: _Lane(False), True: _Lane(True)}
        for batch in batches:
            for wrapped, part in [(False, batch)] if plain else self._lanes_of(batch):
                lane = lanes[wrapped]
                for group in lane.add(part, rows):
                    yield from self._write_group(lane, group, folder, values)
        for lane in lanes.values():
            group = lane.rest()
            if group is not None:
                yield from self._write_group(lane, group, folder, values)
            if lane.file is not None:
                yield self._finish(lane.file, values)
                lane.file = None

    def _wrapped(self, bbox: pa.StructArray) -> np.ndarray:
        """Which rows wrap (xmin > xmax, under the short-way reading only)."""
        if self.contract.geometry.antimeridian != "short" or len(bbox) == 0:
            return np.zeros(len(bbox), bool)
        xmin, xmax = (bbox.field(n).to_numpy(zero_copy_only=False) for n in ("xmin", "xmax"))
        return np.greater(xmin, xmax)  # a null (NaN here) is not a wrapped box

    def _lanes_of(self, batch: pa.RecordBatch) -> list[tuple[bool, pa.RecordBatch]]:
        wrapped = self._wrapped(batch.column(self.contract.bbox_name))
        if not wrapped.any():
            return [(False, batch)]
        return [(False, batch.filter(pa.array(~wrapped))), (True, batch.filter(pa.array(wrapped)))]

    def _write_group(self, lane: _Lane, group: pa.RecordBatch, folder: str, values: tuple) -> Iterator[DataFileRecord]:
        # The covering the rows carry: the file's bounds, whether or not the table stores it.
        covering = group.column(self.contract.bbox_name)
        table = with_cells(_with_flat_bbox(pa.Table.from_batches([group]), self.contract), self.contract)
        table = as_types(table, self.schema)
        if lane.file is None:
            lane.file = _OpenFile(self._new_path(folder), self.io, self.schema, self._parquet_options)
        lane.file.write(table, covering, self.contract, lane.wrapped)
        if lane.file.bytes_written() >= self.contract.clustering.target_file_bytes:
            yield self._finish(lane.file, values)
            lane.file = None

    def _new_path(self, folder: str = "") -> str:
        folder = f"/{folder}" if folder else ""
        return f"{self._data_location}{folder}/{data_file_name(self._file_prefix)}"

    def _finish(self, file: _OpenFile, values: tuple = ()) -> DataFileRecord:
        parquet_metadata = file.close(self.contract)
        stats = data_file_statistics_from_parquet_metadata(parquet_metadata, self._stats_plan, self._path_ids)
        metrics = stats.to_serialized_dict()
        record_count = metrics.pop("record_count")
        if self.contract.geometry.native:
            metrics[GEOMETRY_EXTENT] = geometry_extent(parquet_metadata, self.contract.geometry.name)
        for key in _BOUND_KEYS if self.contract.bbox_stored else ():
            bounds = dict(metrics.get(key) or {})
            for i, name in enumerate(BBOX_FIELDS):
                value = file.bbox_min[i] if key == "lower_bounds" else file.bbox_max[i]
                if file.wrapped_rows and file.bbox_min[0] <= file.bbox_max[2] and name in ("xmin", "xmax"):
                    # Wrapped rows whose least xmin is not above their greatest xmax: no wrapped
                    # MBR of the file can be read from these bounds, so they widen to the world
                    # (still true bounds: every xmin >= -180, every xmax <= 180).
                    value = -180.0 if name == "xmin" else 180.0
                bounds[self._bbox_ids[name]] = to_bytes(DoubleType(), value)
            metrics[key] = bounds
        return DataFileRecord(
            path=file.path,
            file_size_in_bytes=file.size,
            record_count=record_count,
            bbox=file.bbox(),
            metrics=serializable_metrics(metrics),
            partition_values=values,
            spec_id=None if self.partition is None else self.partition.spec_id,
        )


def geometry_extent(metadata: pq.FileMetaData, column: str) -> list[float] | None:
    """[xmin, ymin, xmax, ymax] of the column's geometries over the file's row groups, from the
    geospatial statistics Parquet keeps for a GEOMETRY column: the vertices' planar extent, which
    holds the geometries as a planar engine reads them (an edge from 179 to -179 crosses 0 there).
    None when a row group with values has none (every geometry empty, or no statistics)."""
    index = next(i for i in range(metadata.num_columns) if metadata.schema.column(i).name == column)
    low, high = [np.inf, np.inf], [-np.inf, -np.inf]
    for r in range(metadata.num_row_groups):
        chunk = metadata.row_group(r).column(index)
        if not chunk.is_geo_stats_set:
            return None
        stats = chunk.geo_statistics
        if None in (stats.xmin, stats.ymin, stats.xmax, stats.ymax):
            return None
        low = [min(low[0], stats.xmin), min(low[1], stats.ymin)]
        high = [max(high[0], stats.xmax), max(high[1], stats.ymax)]
    values = [low[0], low[1], high[0], high[1]]
    return values if all(np.isfinite(values)) else None


def write_plain_file(
    io,
    path: str,
    table: pa.Table,
    iceberg_schema,
    table_properties: dict[str, str],
    content: str,
    partition_values: tuple = (),
) -> DataFileRecord:
    """`table` as one Parquet file without geometry (a delete file, a rejects table's file), with
    the Iceberg statistics of its columns by field id; its record has no bbox."""
    with io.new_output(path).create(overwrite=False) as stream:
        writer = pq.ParquetWriter(
            stream, table.schema, write_statistics=True, **parquet_write_options(table_properties)
        )
        writer.write_table(table)
        writer.close()
        metadata = writer.writer.metadata
    stats = data_file_statistics_from_parquet_metadata(
        metadata, compute_statistics_plan(iceberg_schema, table_properties), parquet_path_to_id_mapping(iceberg_schema)
    )
    metrics = stats.to_serialized_dict()
    record_count = metrics.pop("record_count")
    nan = float("nan")
    return DataFileRecord(
        path=path,
        file_size_in_bytes=len(io.new_input(path)),
        record_count=record_count,
        bbox=(nan, nan, nan, nan),
        metrics=serializable_metrics(metrics),
        content=content,
        partition_values=partition_values,
    )


def serializable_metrics(metrics: dict) -> dict:
    """pyiceberg's serialized statistics as JSON: field ids as strings, bounds hex-encoded."""
    return {
        key: (
            {str(k): (v.hex() if isinstance(v, bytes) else v) for k, v in value.items()}
            if isinstance(value, dict)
            else value
        )
        for key, value in metrics.items()
    }


class _OpenFile:
    """A data file being written: its Parquet writer and the running bbox and geometry types."""

    def __init__(self, path: str, io, schema: pa.Schema, parquet_options: dict):
        self.path = path
        # A fresh name (a UUID): no need to ask the store first whether it exists (a HEAD on S3), as
        # a partitioned batch opens a file per partition it touches.
        self._stream = io.new_output(path).create(overwrite=True)
        self.size = 0
        # No dictionary encoding: event ids, geometries and coordinates hardly repeat, so building
        # dictionaries is wasted work. Measured on 200k points: writes 2.1x faster and files 17 %
        # smaller than with Arrow's default; zstd (the default codec) still folds repeated short strings.
        self._writer = pq.ParquetWriter(
            self._stream, schema, use_dictionary=False, write_statistics=True, store_schema=True, **parquet_options
        )
        self.bbox_min = [np.inf] * 4
        self.bbox_max = [-np.inf] * 4
        self.geometry_types: set[str] = set()
        self.wrapped_rows = 0

    def write(self, table: pa.Table, bbox: pa.StructArray, contract: Contract, wrapped: bool) -> None:
        """`bbox`: the rows' covering. `wrapped`: the rows all wrap, or none does (the writer's
        lanes keep them apart)."""
        if contract.geometry.antimeridian == "short" and wrapped:
            self.wrapped_rows += table.num_rows
        for i, name in enumerate(BBOX_FIELDS):
            values = bbox.field(name).to_numpy(zero_copy_only=False)
            self.bbox_min[i] = min(self.bbox_min[i], float(np.fmin.reduce(values)))
            self.bbox_max[i] = max(self.bbox_max[i], float(np.fmax.reduce(values)))
        self.geometry_types.update(geometry_type_names(wkb_storage(table.column(contract.geometry.name))))
        self._writer.write_table(table, row_group_size=table.num_rows)

    def bytes_written(self) -> int:
        return self._stream.tell()

    def bbox(self) -> tuple[float, float, float, float]:
        # The file bbox: xmin/ymin are the least row minima, xmax/ymax the greatest row maxima.
        # A file of wrapped rows (the writer keeps them apart) covers [xmin, 180] and [-180, xmax]:
        # wrapped too, unless its least xmin is not above its greatest xmax (then the world).
        xmin, xmax = self.bbox_min[0], self.bbox_max[2]
        if self.wrapped_rows and xmin <= xmax:
            xmin, xmax = -180.0, 180.0
        return (xmin, self.bbox_min[1], xmax, self.bbox_max[3])

    def close(self, contract: Contract) -> pq.FileMetaData:
        metadata = {"geo": geo_metadata_bytes(contract, sorted(self.geometry_types), self.bbox())}
        if contract.geometry.antimeridian == "short":
            metadata[WRAPPED_ROWS_KEY] = str(self.wrapped_rows).encode()
        self._writer.add_key_value_metadata(metadata)
        self._writer.close()
        # The bytes written: the file's size, without asking the store again (a HEAD on S3).
        self.size = self._stream.tell()
        self._stream.close()
        return self._writer.writer.metadata


def _with_flat_bbox(table: pa.Table, contract: Contract) -> pa.Table:
    """The rows with the contract's flat bbox columns (if it has them) taken from the covering
    struct's fields, so they always agree with it, whatever the rows brought."""
    if not contract.flat_bbox_names:
        return table
    bbox = table.column(contract.bbox_name).combine_chunks()
    for flat_name, field in zip(contract.flat_bbox_names, BBOX_FIELDS):
        if flat_name in table.column_names:
            table = table.drop_columns([flat_name])
        table = table.append_column(flat_name, bbox.field(field))
    return table


class _Lane:
    """Rows on their way to one kind of file: whole row groups of them cut as they come."""

    def __init__(self, wrapped: bool) -> None:
        self.wrapped = wrapped  # every row of this lane wraps (xmin > xmax), or none does
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.file: _OpenFile | None = None

    def add(self, batch: pa.RecordBatch, rows: int) -> Iterator[pa.RecordBatch]:
        while batch.num_rows:
            take = min(rows - self.pending_rows, batch.num_rows)
            self.pending.append(batch.slice(0, take))
            self.pending_rows += take
            batch = batch.slice(take)
            if self.pending_rows == rows:
                group = self.rest()
                assert group is not None
                yield group

    def rest(self) -> pa.RecordBatch | None:
        if not self.pending_rows:
            return None
        group = pa.Table.from_batches(self.pending).combine_chunks().to_batches()[0]
        self.pending, self.pending_rows = [], 0
        return group
