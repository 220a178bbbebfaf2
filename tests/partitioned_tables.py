"""Partitioned tables written without a partitioning writer: rows of one time and kind made up,
written by the project's GeoParquetWriter and committed with the partition values given, one fast
append per batch (each file in the manifest of the table's current spec)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import shapely

from streaming.kernels.hilbert import hilbert_keys_of_bounds
from streaming.storage import data_location
from streaming.table.commit import to_data_file
from streaming.write.data_files import GeoParquetWriter

DAY_US = 86400 * 1_000_000
HOUR_US = 3600 * 1_000_000


def rows(
    contract, day: int, kind: str, n: int, seed: int, first_id: int = 0, hour_of_day: int | None = None
) -> pa.Table:
    """n points of one day (and kind), spread over it (or within one hour of it)."""
    rng = np.random.default_rng(seed)
    points = shapely.points(rng.uniform(-170, 170, n), rng.uniform(-80, 80, n))
    b = shapely.bounds(points)
    if hour_of_day is None:
        times = day * DAY_US + rng.integers(0, DAY_US, n)
    else:
        times = day * DAY_US + hour_of_day * HOUR_US + rng.integers(0, HOUR_US, n)
    keys = hilbert_keys_of_bounds(
        b[:, 0], b[:, 1], b[:, 2], b[:, 3], contract.clustering.extent, contract.clustering.hilbert_bits
    )
    table = pa.table(
        {
            "event_id": [f"{kind}-{day}-{first_id + i:06d}" for i in range(n)],
            "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
            "kind": [kind] * n,
            "name": pa.nulls(n, pa.string()),
            "speed": rng.uniform(0, 30, n),
            "population": pa.nulls(n, pa.int64()),
            "source_partition": pa.array([0] * n, pa.int32()),
            "source_offset": pa.array(range(first_id, first_id + n), pa.int64()),
            "geometry": shapely.to_wkb(points),
            "bbox": pa.StructArray.from_arrays([pa.array(b[:, i]) for i in range(4)], ["xmin", "ymin", "xmax", "ymax"]),
        }
    )
    return table.cast(contract.arrow_schema).take(pa.array(np.argsort(keys)))


def append(table, contract, parts: list[tuple[tuple, pa.Table]]) -> None:
    """One batch: each part written as its own files with its partition values, one fast append."""
    table.refresh()
    spec_id = table.metadata.default_spec_id
    files = []
    for partition, data in parts:
        writer = GeoParquetWriter(
            contract, dict(table.properties), dict(table.io.properties), data_location(table), "b"
        )
        for record in writer.write(data.to_batches()):
            files.append(to_data_file(dataclasses.replace(record, partition_values=tuple(partition)), spec_id))
    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as fast_append:
            for data_file in files:
                fast_append.append_data_file(data_file)
