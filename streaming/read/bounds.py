"""Where a table bounds each data file's and each row group's geometries, without reading rows.

A table that stores the bbox covering is bounded by the statistics of its four fields: the lower
bounds of xmin and ymin, the upper bounds of xmax and ymax (x wrapped, xmin > xmax, for a file of
rows read the short way across ±180). A native-geometry table that does not store it
(`bbox.stored: false`) is bounded by the geometry column's own: the manifests' geometry bounds
(v3 spec appendix D: x and y as little-endian doubles) and Parquet's geospatial statistics of
each row group. Those are planar, the extent of the vertices; read the short way, a span wider
than 180 degrees may hold a row whose edge crosses ±180 beyond it, so its x is left unbounded.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.types import DoubleType

from streaming.contract import Contract
from streaming.read.predicate import XMAX, XMIN, BBox

# A span of longitudes wider than this may hold a row that crosses ±180 the short way.
_SHORT_WAY_SPAN = 180.0


@dataclass(frozen=True)
class FileBounds:
    """A data file's MBR (xmin, ymin, xmax, ymax) from its manifest entry, None without bounds.

    `covering_ids`: the field ids of the covering's xmin .. ymax, or None for a table whose
    geometry column (`geometry_id`) carries the bounds itself."""

    covering_ids: tuple[int, int, int, int] | None
    geometry_id: int
    short_way: bool

    @classmethod
    def of_contract(cls, contract: Contract) -> FileBounds:
        ids = tuple(contract.bbox_field_ids.values()) if contract.bbox_stored else None
        return cls(
            cast(tuple[int, int, int, int] | None, ids),
            contract.geometry.id,
            contract.geometry.antimeridian == "short",
        )

    def __call__(self, data_file) -> BBox | None:
        lower, upper = data_file.lower_bounds or {}, data_file.upper_bounds or {}
        try:
            if self.covering_ids is not None:
                xmin_id, ymin_id, xmax_id, ymax_id = self.covering_ids
                bbox = (
                    manifest_double(lower[xmin_id]),
                    manifest_double(lower[ymin_id]),
                    manifest_double(upper[xmax_id]),
                    manifest_double(upper[ymax_id]),
                )
            else:
                bbox = (*geometry_bound(lower[self.geometry_id]), *geometry_bound(upper[self.geometry_id]))
        except KeyError:
            return None
        if not all(math.isfinite(v) for v in bbox):
            return None
        if self.covering_ids is None and self.short_way and bbox[2] - bbox[0] > _SHORT_WAY_SPAN:
            return (-180.0, bbox[1], 180.0, bbox[3])
        return bbox


def manifest_double(value: bytes) -> float:
    """A manifest bound of a double column."""
    # from_bytes dispatches on the Iceberg type, but pyiceberg types its result with a type variable
    # no argument binds, which mypy reads as str.
    return cast(float, from_bytes(DoubleType(), value))


def geometry_bound(value: bytes) -> tuple[float, float]:
    """x and y of a manifest's geometry bound (any z and m after them are not used here)."""
    if len(value) < 16:
        raise KeyError("a geometry bound shorter than two doubles")
    x, y = struct.unpack_from("<dd", value)
    return x, y


def row_group_bounds(
    metadata: pq.FileMetaData, covering_paths: Sequence[str | None] | None, geometry_path: str, short_way: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Per row group, the minima and maxima of the covering's xmin, ymin, xmax, ymax (n x 4 each):
    -inf and +inf where unknown. `covering_paths`: the covering's columns in the file (None for
    a table without one: the geometry column's geospatial statistics give the least xmin and ymin
    and the greatest xmax and ymax)."""
    n = metadata.num_row_groups
    minima = np.full((n, 4), -np.inf)
    maxima = np.full((n, 4), np.inf)
    if n == 0:
        return minima, maxima
    column_of_path = {metadata.row_group(0).column(j).path_in_schema: j for j in range(metadata.num_columns)}
    if covering_paths is not None:
        for k, path in enumerate(covering_paths):
            j = None if path is None else column_of_path.get(path)
            if j is None:
                continue
            for g in range(n):
                stats = metadata.row_group(g).column(j).statistics
                if stats is not None and stats.has_min_max:
                    minima[g, k], maxima[g, k] = stats.min, stats.max
        return minima, maxima
    j = column_of_path.get(geometry_path)
    if j is None:
        return minima, maxima
    for g in range(n):
        chunk = metadata.row_group(g).column(j)
        if not chunk.is_geo_stats_set:
            continue
        stats = chunk.geo_statistics
        box = (stats.xmin, stats.ymin, stats.xmax, stats.ymax)
        if any(v is None or not math.isfinite(v) for v in box):
            continue
        minima[g, 0], minima[g, 1], maxima[g, 2], maxima[g, 3] = box
        if short_way and box[2] - box[0] > _SHORT_WAY_SPAN:
            minima[g, XMIN], maxima[g, XMAX] = -np.inf, np.inf
    return minima, maxima
