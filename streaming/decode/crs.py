"""Coordinate reference systems: reprojection of geometry arrays and valid areas."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import shapely
from pyproj import CRS, Transformer
from pyproj.exceptions import CRSError

from streaming.contract import crs_area_of_use


class UnknownSrid(ValueError):
    pass


@lru_cache(maxsize=64)
def known_crs(epsg: int) -> CRS:
    try:
        return CRS.from_epsg(epsg)
    except CRSError:
        raise UnknownSrid(f"SRID {epsg} is not an EPSG code known to PROJ") from None


@lru_cache(maxsize=64)
def transformer(src_epsg: int, dst_epsg: int) -> Transformer:
    return Transformer.from_crs(known_crs(src_epsg), known_crs(dst_epsg), always_xy=True)


@lru_cache(maxsize=64)
def valid_area(epsg: int) -> tuple[float, float, float, float]:
    """Where coordinates of this CRS may lie: its area of use, in its own units, with a small margin."""
    xmin, ymin, xmax, ymax = crs_area_of_use(epsg)
    if known_crs(epsg).is_geographic:
        # Geographic areas of use are the whole globe or a part of it; never cut inside it.
        return (max(xmin - 1e-9, -180.0), max(ymin - 1e-9, -90.0), min(xmax + 1e-9, 180.0), min(ymax + 1e-9, 90.0))
    pad_x = (xmax - xmin) * 1e-6
    pad_y = (ymax - ymin) * 1e-6
    return (xmin - pad_x, ymin - pad_y, xmax + pad_x, ymax + pad_y)


def reproject(geoms: np.ndarray, src_epsg: int, dst_epsg: int) -> np.ndarray:
    """Geometries from src to dst CRS, Z transformed along where present.

    Coordinates PROJ cannot transform come back as inf; callers check finiteness.
    """
    if src_epsg == dst_epsg or geoms.size == 0:
        return geoms
    tr = transformer(src_epsg, dst_epsg)
    out = np.empty_like(geoms)
    has_z = shapely.has_z(geoms)
    for mask, include_z in ((has_z, True), (~has_z, False)):
        if mask.any():
            out[mask] = shapely.transform(geoms[mask], lambda c: _transform_coords(tr, c), include_z=include_z)
    return out


def _transform_coords(tr: Transformer, coords: np.ndarray) -> np.ndarray:
    if coords.shape[1] == 3:
        x, y, z = tr.transform(coords[:, 0], coords[:, 1], coords[:, 2], errcheck=False)
        return np.column_stack([x, y, z])
    x, y = tr.transform(coords[:, 0], coords[:, 1], errcheck=False)
    return np.column_stack([x, y])
