"""The partition of every row: the table's partition spec applied to Arrow columns, and the split of
Hilbert-sorted rows into one stretch per partition (each still Hilbert-sorted).

A `PartitionLayout` is what a write task knows of the table's spec (the driver reads it from the
table: an existing table keeps its spec whatever the contract file says). The spatial cells are
columns of the rows, filled here from the bbox covering (streaming/kernels/geohash.py), and
partitioned by identity.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import IcebergType

from streaming.contract import Contract, primitive_type
from streaming.contract.terms import MAX_PARTITIONS_PER_BATCH
from streaming.kernels.geohash import enclosing_cells

_MICROS_PER = {"day": 86_400_000_000, "hour": 3_600_000_000}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class PartitionLimitError(ValueError):
    """A batch's rows fall in more partitions than a batch may write (MAX_PARTITIONS_PER_BATCH)."""


@dataclass(frozen=True)
class LayoutField:
    """One field of the table's partition spec, as a writer applies it."""

    field_id: int
    name: str
    transform: str  # identity, year, month, day, hour, bucket, truncate
    param: int | None
    source: str  # the row column it reads (a cell column for a spatial cell)
    source_type: str  # a contract column type


@dataclass(frozen=True)
class PartitionLayout:
    spec_id: int
    fields: tuple[LayoutField, ...] = ()


def with_cells(table: pa.Table, contract: Contract) -> pa.Table:
    """The rows with the table's cell columns (if any) filled from the bbox covering: every one
    the table holds, so that a column an evolution left behind stays exact in new files too."""
    if all(c.name in table.column_names for c in contract.cell_columns):
        return table  # none, or filled already from the same covering
    bbox = table.column(contract.bbox_name).combine_chunks()
    xmin, ymin, xmax, ymax = (
        bbox.field(name).to_numpy(zero_copy_only=False) for name in ("xmin", "ymin", "xmax", "ymax")
    )
    for cell in contract.cell_columns:
        if cell.name in table.column_names:
            continue  # filled already, from the same covering
        cells = enclosing_cells(xmin, ymin, xmax, ymax, cell.field.param or 1)
        table = table.append_column(cell.name, pa.array(cells, pa.string()))
    return table


def _field_values(table: pa.Table, field: LayoutField) -> pa.Array:
    column = table.column(field.source).combine_chunks()
    if field.source_type == "timestamptz":
        micros = column.cast(pa.int64())
        if field.transform in _MICROS_PER:
            values = np.floor_divide(micros.to_numpy(zero_copy_only=False), _MICROS_PER[field.transform])
            return pa.array(values, pa.int32(), mask=micros.is_null().to_numpy(zero_copy_only=False))
        if field.transform in ("year", "month"):
            years = pc.subtract(pc.year(column), 1970)
            if field.transform == "year":
                return years.cast(pa.int32())
            return pc.add(pc.multiply(years, 12), pc.subtract(pc.month(column), 1)).cast(pa.int32())
        if field.transform == "identity":
            return micros
    if field.transform == "identity":
        return column
    if field.transform == "truncate":
        width = field.param or 1
        if pa.types.is_string(column.type):
            return pc.utf8_slice_codeunits(column, 0, width)
        values = column.to_numpy(zero_copy_only=False)
        nulls = column.is_null().to_numpy(zero_copy_only=False)
        filled = np.where(nulls, 0, values).astype(np.int64)
        return pa.array(filled - np.mod(filled, width), column.type, mask=nulls)
    if field.transform == "bucket":
        source_type: IcebergType | None = primitive_type(field.source_type)
        assert source_type is not None, field.source_type  # partition_layout took only primitive sources
        bucket = BucketTransform(field.param or 1).transform(source_type)
        plain = column.cast(pa.int64()) if field.source_type == "timestamptz" else column
        distinct = pc.unique(plain)
        buckets = pa.array([None if v is None else bucket(v) for v in distinct.to_pylist()], pa.int32())
        return pc.take(buckets, pc.index_in(plain, value_set=distinct))
    raise ValueError(f"partition field {field.name}: transform {field.transform} of a {field.source_type} column")


def split_by_partition(table: pa.Table, layout: PartitionLayout | None) -> Iterator[tuple[tuple, pa.Table]]:
    """The rows of each partition, with the partition's values (in spec order), partitions in
    order of their values; a stable split, so sorted rows stay sorted within each partition."""
    if layout is None or not layout.fields or table.num_rows == 0:
        yield (), table
        return
    codes = []
    dictionaries = []
    for field in layout.fields:
        encoded = pc.dictionary_encode(_field_values(table, field))
        indices = encoded.indices.to_numpy(zero_copy_only=False)
        codes.append(np.where(encoded.is_null().to_numpy(zero_copy_only=False), -1, indices).astype(np.int64))
        dictionaries.append(encoded.dictionary.to_pylist())
    stacked = np.stack(codes, axis=1)
    if math.prod(len(d) + 1 for d in dictionaries) < 2**62:
        # One int64 key per row (mixed radix over the fields' codes, null's -1 shifted to 0), in
        # the order of the rows of codes: a 1-D unique is several times cheaper than one of rows.
        key = np.zeros(table.num_rows, np.int64)
        for field_codes, dictionary in zip(codes, dictionaries):
            key = key * (len(dictionary) + 1) + (field_codes + 1)
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        distinct = stacked[first]
    else:
        distinct, inverse = np.unique(stacked, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    if len(distinct) > MAX_PARTITIONS_PER_BATCH:
        # The contract bounds what it can (cells, buckets, time); identity and truncate fields have
        # no bound known in advance. Each partition is a file at least: stop rather than write them.
        widest = max(range(len(layout.fields)), key=lambda i: len(dictionaries[i]))
        field = layout.fields[widest]
        raise PartitionLimitError(
            f"partition field {field.name} ({field.transform} of {field.source}): these rows fall in "
            f"{len(distinct):,} partitions ({len(dictionaries[widest]):,} values of {field.name}), more than "
            f"{MAX_PARTITIONS_PER_BATCH:,} per batch; give the table a coarser spec with 'geoingest table evolve'"
        )
    if len(distinct) == 1:
        yield _values(distinct[0], dictionaries), table
        return
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=len(distinct))
    ordered = table.take(pa.array(order))
    start = 0
    for group, count in enumerate(counts.tolist()):
        yield _values(distinct[group], dictionaries), ordered.slice(start, count)
        start += count


def _values(codes: np.ndarray, dictionaries: list[list]) -> tuple:
    return tuple(None if code < 0 else dictionaries[i][code] for i, code in enumerate(codes.tolist()))


def partition_path(layout: PartitionLayout | None, values: tuple) -> str:
    """Hive-style folders of a partition (`event_time_day=2026-11-25/geometry_geohash3=u09`), '' for none."""
    if layout is None or not layout.fields:
        return ""
    parts = []
    for field, value in zip(layout.fields, values):
        parts.append(f"{quote(field.name, safe='')}={quote(_human(field, value), safe='')}")
    return "/".join(parts)


def _human(field: LayoutField, value) -> str:
    if value is None:
        return "null"
    if field.source_type == "timestamptz" and field.transform in ("day", "hour"):
        moment = _EPOCH + timedelta(microseconds=int(value) * _MICROS_PER[field.transform])
        return moment.strftime("%Y-%m-%d" if field.transform == "day" else "%Y-%m-%d-%H")
    if field.transform == "month":
        return f"{1970 + int(value) // 12:04d}-{int(value) % 12 + 1:02d}"
    if field.transform == "year":
        return f"{1970 + int(value):04d}"
    return str(value)
