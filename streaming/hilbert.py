"""Hilbert curve keys: arrays in, arrays out.

The key of a geometry is the Hilbert distance of its bbox centre, scaled onto a 2^bits x 2^bits
grid over the table extent. Rows sorted by this key are spatially co-located, which is what lets
file and row-group min/max statistics prune.
"""

from __future__ import annotations

import numpy as np


def hilbert_distance(ix: np.ndarray, iy: np.ndarray, bits: int) -> np.ndarray:
    """Distance along the Hilbert curve of order `bits` for integer grid cells (ix, iy).

    Vectorised form of the classic xy2d walk: one pass per bit, from the most significant down,
    each pass adding the quadrant's offset and rotating the remaining coordinates into it.
    """
    if not 1 <= bits <= 31:
        raise ValueError(f"bits: {bits} must be 1..31")
    x = np.asarray(ix, dtype=np.int64).copy()
    y = np.asarray(iy, dtype=np.int64).copy()
    side = np.int64(1) << bits
    if x.size and (x.min() < 0 or y.min() < 0 or x.max() >= side or y.max() >= side):
        raise ValueError(f"grid cells must lie in [0, {side - 1}]")
    d = np.zeros(x.shape, dtype=np.int64)
    s = side >> 1
    while s > 0:
        rx = (x & s) > 0
        ry = (y & s) > 0
        d += s * s * ((3 * rx.astype(np.int64)) ^ ry.astype(np.int64))
        # Rotate the quadrant so the sub-curve has the canonical orientation.
        flip = ~ry & rx
        x = np.where(flip, side - 1 - x, x)
        y = np.where(flip, side - 1 - y, y)
        swap = ~ry
        x, y = np.where(swap, y, x), np.where(swap, x, y)
        s >>= 1
    return d


def grid_cells(
    x: np.ndarray, y: np.ndarray, extent: tuple[float, float, float, float], bits: int
) -> tuple[np.ndarray, np.ndarray]:
    """Scale coordinates onto the integer grid over `extent`; points outside are clamped to it."""
    xmin, ymin, xmax, ymax = extent
    top = (1 << bits) - 1
    fx = (np.asarray(x, dtype=np.float64) - xmin) / (xmax - xmin)
    fy = (np.asarray(y, dtype=np.float64) - ymin) / (ymax - ymin)
    ix = np.clip(np.floor(fx * (top + 1)), 0, top).astype(np.int64)
    iy = np.clip(np.floor(fy * (top + 1)), 0, top).astype(np.int64)
    return ix, iy


def hilbert_keys_of_bounds(
    xmin: np.ndarray,
    ymin: np.ndarray,
    xmax: np.ndarray,
    ymax: np.ndarray,
    extent: tuple[float, float, float, float],
    bits: int,
) -> np.ndarray:
    """Hilbert key of each bbox centre."""
    cx = (np.asarray(xmin) + np.asarray(xmax)) * 0.5
    cy = (np.asarray(ymin) + np.asarray(ymax)) * 0.5
    ix, iy = grid_cells(cx, cy, extent, bits)
    return hilbert_distance(ix, iy, bits)
