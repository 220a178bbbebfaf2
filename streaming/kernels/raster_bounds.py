"""WGS84 bounds of rasters, Havasu's raster bounds: arrays in, arrays out.

A raster is its affine geotransform (a, b, c, d, e, f: x = a*col + b*row + c, y = d*col + e*row
+ f, GDAL's order rearranged as rasterio's Affine), its shape (width, height) and its CRS. Its
bounds are the envelope of its footprint in longitude and latitude: the four edges of the pixel
grid densified, transformed, and read by the short-way rule (streaming/kernels/antimeridian.py),
so a scene across ±180 gets a wrapped box (xmin > xmax). A scene that holds a pole spans every
longitude and reaches that pole's latitude.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streaming.kernels.antimeridian import covering_arcs, unwrap_paths

DENSIFY = 21  # points per edge, corners included (what rasterio's transform_bounds uses)


def envelope_rings(transform: np.ndarray, width: np.ndarray, height: np.ndarray, points: int = DENSIFY) -> np.ndarray:
    """The densified outline of each raster's pixel grid in its own CRS: (n, 4 * (points - 1), 2),
    counter-clockwise in pixel space from the top-left corner."""
    t = np.asarray(transform, dtype=np.float64).reshape(-1, 6)
    w = np.asarray(width, dtype=np.float64).reshape(-1)
    h = np.asarray(height, dtype=np.float64).reshape(-1)
    s = np.linspace(0.0, 1.0, points)[:-1]
    zero, one = np.zeros_like(s), np.ones_like(s)
    # (col, row) fractions of the grid along the four edges: top, right, bottom, left
    fc = np.r_[s, one, 1 - s, zero]
    fr = np.r_[zero, s, one, 1 - s]
    col = fc[None, :] * w[:, None]
    row = fr[None, :] * h[:, None]
    x = t[:, 0, None] * col + t[:, 1, None] * row + t[:, 2, None]
    y = t[:, 3, None] * col + t[:, 4, None] * row + t[:, 5, None]
    return np.stack([x, y], axis=-1)


def _inside(rings: np.ndarray, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """Whether point (px[i], py[i]) lies inside ring i (even-odd rule), vectorised."""
    x, y = rings[..., 0], rings[..., 1]
    x2, y2 = np.roll(x, -1, axis=1), np.roll(y, -1, axis=1)
    crosses = (y > py[:, None]) != (y2 > py[:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        at = x + (py[:, None] - y) * (x2 - x) / (y2 - y)
    return (np.sum(crosses & (px[:, None] < at), axis=1) % 2) == 1


def wgs84_bounds(
    transform: np.ndarray, width: np.ndarray, height: np.ndarray, crs: Any, points: int = DENSIFY
) -> np.ndarray:
    """(xmin, ymin, xmax, ymax) in EPSG:4326 of each raster of one CRS (anything pyproj takes for
    one: a pyproj CRS, an EPSG code, "EPSG:32660", WKT), wrapped across ±180; NaN where the outline
    does not transform."""
    from pyproj import Transformer

    rings = envelope_rings(transform, width, height, points)
    n, k, _ = rings.shape
    out = np.full((n, 4), np.nan)
    if n == 0:
        return out
    to_wgs84 = Transformer.from_crs(crs, "EPSG:4326", always_xy=True)
    lon, lat = to_wgs84.transform(rings[..., 0].ravel(), rings[..., 1].ravel(), errcheck=False)
    lon = np.asarray(lon, dtype=np.float64).reshape(n, k)
    lat = np.asarray(lat, dtype=np.float64).reshape(n, k)
    ok = np.isfinite(lon).all(axis=1) & np.isfinite(lat).all(axis=1)
    if not ok.any():
        return out
    good = np.flatnonzero(ok)
    # each outline as a closed path: its longitudes unwrapped the short way along the edges
    closed = np.concatenate([lon[good], lon[good, :1]], axis=1)
    path = np.repeat(np.arange(good.size), k + 1)
    xu, _ = unwrap_paths(closed.ravel(), path)
    xu = xu.reshape(good.size, k + 1)
    lo, hi = covering_arcs(xu.min(axis=1), xu.max(axis=1), np.arange(good.size), good.size)
    ymin, ymax = lat[good].min(axis=1), lat[good].max(axis=1)
    # a pole inside the footprint: every longitude, and the pole's latitude
    from_wgs84 = Transformer.from_crs("EPSG:4326", crs, always_xy=True)
    for pole_lat in (90.0, -90.0):
        px, py = from_wgs84.transform(np.zeros(good.size), np.full(good.size, pole_lat), errcheck=False)
        px, py = np.asarray(px, dtype=np.float64), np.asarray(py, dtype=np.float64)
        finite = np.isfinite(px) & np.isfinite(py)
        holds = np.zeros(good.size, dtype=bool)
        holds[finite] = _inside(rings[good][finite], px[finite], py[finite])
        lo[holds], hi[holds] = -180.0, 180.0
        if pole_lat > 0:
            ymax[holds] = 90.0
        else:
            ymin[holds] = -90.0
    out[good] = np.c_[lo, ymin, hi, ymax]
    return out
