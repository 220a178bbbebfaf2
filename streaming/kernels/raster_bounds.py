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
# An extreme lies between densified points as often as on one (the point of a polar scene's edge
# nearest the pole): each is searched for between its neighbours, so that bounds are inclusive.
_REFINE_POINTS = 9
_REFINE_PASSES = 4


def _perimeter(t: np.ndarray, w: np.ndarray, h: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points of each raster's outline in its CRS at perimeter parameters u (n, m): edge floor(u)
    (0 top, 1 right, 2 bottom, 3 left, counter-clockwise in pixel space from the top-left
    corner), the fraction u - floor(u) along it."""
    edge = np.floor(u) % 4
    s = u - np.floor(u)
    one, zero = np.ones_like(s), np.zeros_like(s)
    fc = np.select([edge == 0, edge == 1, edge == 2], [s, one, 1 - s], zero)
    fr = np.select([edge == 0, edge == 1, edge == 2], [zero, s, one], 1 - s)
    col, row = fc * w[:, None], fr * h[:, None]
    x = t[:, 0, None] * col + t[:, 1, None] * row + t[:, 2, None]
    y = t[:, 3, None] * col + t[:, 4, None] * row + t[:, 5, None]
    return x, y


def _grids(transform: np.ndarray, width: np.ndarray, height: np.ndarray) -> tuple[np.ndarray, ...]:
    t = np.asarray(transform, dtype=np.float64).reshape(-1, 6)
    return t, np.asarray(width, dtype=np.float64).reshape(-1), np.asarray(height, dtype=np.float64).reshape(-1)


def envelope_rings(transform: np.ndarray, width: np.ndarray, height: np.ndarray, points: int = DENSIFY) -> np.ndarray:
    """The densified outline of each raster's pixel grid in its own CRS: (n, 4 * (points - 1), 2),
    counter-clockwise in pixel space from the top-left corner."""
    t, w, h = _grids(transform, width, height)
    u = np.arange(4 * (points - 1)) / (points - 1)
    x, y = _perimeter(t, w, h, np.broadcast_to(u, (t.shape[0], u.size)))
    return np.stack([x, y], axis=-1)


def _refined(
    t: np.ndarray, w: np.ndarray, h: np.ndarray, to_wgs84: Any, u0: np.ndarray, step: float, value: Any
) -> np.ndarray:
    """The outline's extreme of `value(lon, lat)` (the least) near perimeter parameter u0 of each
    raster, searched between the densified points either side of it, twice finer each pass."""
    best_u, best = u0.astype(np.float64), np.full(u0.size, np.inf)
    span = step
    for _ in range(_REFINE_PASSES):
        u = best_u[:, None] + np.linspace(-span, span, _REFINE_POINTS)[None, :]
        x, y = _perimeter(t, w, h, np.mod(u, 4.0))
        lon, lat = to_wgs84.transform(x, y, errcheck=False)
        v = value(np.asarray(lon, dtype=np.float64), np.asarray(lat, dtype=np.float64))
        v = np.where(np.isfinite(v), v, np.inf)
        j = np.argmin(v, axis=1)
        rows = np.arange(u0.size)
        better = v[rows, j] < best
        best = np.where(better, v[rows, j], best)
        best_u = np.where(better, u[rows, j], best_u)
        span = 2.0 * span / (_REFINE_POINTS - 1)
    return best


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
    # each extreme refined between the densified points either side of it
    t, w, h = (a[good] for a in _grids(transform, width, height))
    step = 1.0 / (points - 1)
    u = np.arange(k) * step

    def near(values: np.ndarray, pick: Any) -> np.ndarray:
        return u[pick(values, axis=1)]

    # a refined longitude is unwrapped next to the extreme it refines
    def unwrapped(at: np.ndarray, sign: float) -> Any:
        return lambda lon, _lat: sign * (lon + 360.0 * np.round((at[:, None] - lon) / 360.0))

    x_lo, x_hi = xu[:, :-1].min(axis=1), xu[:, :-1].max(axis=1)
    x_lo = np.minimum(x_lo, _refined(t, w, h, to_wgs84, near(xu[:, :-1], np.argmin), step, unwrapped(x_lo, 1.0)))
    x_hi = np.maximum(x_hi, -_refined(t, w, h, to_wgs84, near(xu[:, :-1], np.argmax), step, unwrapped(x_hi, -1.0)))
    x_hi = np.minimum(x_hi, x_lo + 360.0)
    ymin = np.minimum(
        lat[good].min(axis=1), _refined(t, w, h, to_wgs84, near(lat[good], np.argmin), step, lambda _lon, la: la)
    )
    ymax = np.maximum(
        lat[good].max(axis=1), -_refined(t, w, h, to_wgs84, near(lat[good], np.argmax), step, lambda _lon, la: -la)
    )
    lo, hi = covering_arcs(x_lo, x_hi, np.arange(good.size), good.size)
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
