"""The bbox covering of geometries: the decoder's, and that of rows read back from a table that
does not store it (`bbox.stored: false`), which compaction, upserts and queries need again.

Computed once here so that a row's covering is the same whether the decoder made it or a later
step made it again from the stored geometry."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import shapely

from streaming.contract.core import Contract
from streaming.decode.validate import bounds_of
from streaming.kernels.antimeridian import short_way_bounds
from streaming.kernels.wkb import wkb_storage


def covering_bounds(geoms: np.ndarray, points_xy: np.ndarray, antimeridian: str) -> np.ndarray:
    """xmin, ymin, xmax, ymax of each geometry (NaN where none); read the short way, a geometry
    with an edge across ±180 gets a wrapped box (xmin > xmax), docs/antimeridian.md."""
    bounds = bounds_of(geoms, points_xy)
    if antimeridian == "short":
        # Only a geometry wider than 180 degrees can have an edge that long.
        wide = np.flatnonzero(bounds[:, 2] - bounds[:, 0] > 180.0)
        if wide.size:
            bounds[wide] = short_way_bounds(geoms[wide])[0]
    return bounds


def covering_array(bounds: np.ndarray, present: np.ndarray, kind: pa.DataType) -> pa.StructArray:
    """The covering column of `kind` (the bbox struct): null where not `present`. A null box
    has zeros, not nulls, in its fields, which the type declares never null."""
    return pa.StructArray.from_arrays(
        [pa.array(np.where(present, bounds[:, i], 0.0), pa.float64()) for i in range(4)],
        fields=list(kind),
        mask=pa.array(~present),
    )


def with_covering(rows: pa.Table, contract: Contract) -> pa.Table:
    """`rows` with the covering column, computed from their geometry if they lack it (rows of a
    table that does not store it); as they are if they have it."""
    if contract.bbox_name in rows.column_names:
        return rows
    geoms = shapely.from_wkb(wkb_storage(rows.column(contract.geometry.name)).to_numpy())
    present = ~shapely.is_missing(geoms)
    bounds = covering_bounds(geoms, np.full((len(geoms), 2), np.nan), contract.geometry.antimeridian)
    present &= np.isfinite(bounds).all(axis=1)
    kind = contract.arrow_schema.field(contract.bbox_name).type
    at = rows.schema.get_field_index(contract.geometry.name) + 1
    return rows.add_column(at, contract.arrow_schema.field(contract.bbox_name), covering_array(bounds, present, kind))
