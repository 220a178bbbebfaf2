"""Hilbert curve keys: arrays in, arrays out.

The key of a geometry is the Hilbert distance of its bbox centre, scaled onto a 2^bits x 2^bits
grid over the table extent. Rows sorted by this key are spatially co-located, which is what lets
file and row-group min/max statistics prune.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from streaming.kernels.antimeridian import centre_x


def hilbert_distance(ix: np.ndarray, iy: np.ndarray, bits: int) -> np.ndarray:
    """Distance along the Hilbert curve of order `bits` for integer grid cells (ix, iy).

    The classic xy2d walk as a state machine read eight levels at a time: each step looks up the
    key bits of eight levels of x and y, and the state the walk leaves them in, in one table
    (`_levels_table`). Two lookups per 16-bit key instead of a rotation per bit: ~12x faster.
    """
    if not 1 <= bits <= 31:
        raise ValueError(f"bits: {bits} must be 1..31")
    x = np.asarray(ix, dtype=np.int64)
    y = np.asarray(iy, dtype=np.int64)
    side = np.int64(1) << bits
    if x.size and (x.min() < 0 or y.min() < 0 or x.max() >= side or y.max() >= side):
        raise ValueError(f"grid cells must lie in [0, {side - 1}]")
    d = np.zeros(x.shape, dtype=np.int64)
    state = np.zeros(x.shape, dtype=np.int64)
    done = 0
    while done < bits:
        levels = (bits - done) % _LEVELS_PER_STEP or _LEVELS_PER_STEP  # the odd levels first
        shift = bits - done - levels
        key, following = _levels_table(levels)
        mask = (1 << levels) - 1
        at = (state << (2 * levels)) | (((x >> shift) & mask) << levels) | ((y >> shift) & mask)
        d = (d << (2 * levels)) | key[at]
        state = following[at]
        done += levels
    return d


_LEVELS_PER_STEP = 8


def _one_level(state: np.ndarray, bx: np.ndarray, by: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One level of xy2d. The state says how the cells below are mirrored so far (bit 0: x and y
    complemented, bit 1: x and y swapped); returns the level's two key bits and the next state."""
    flip, swap = state & 1, state >> 1
    tx, ty = bx ^ flip, by ^ flip
    tx, ty = np.where(swap == 1, ty, tx), np.where(swap == 1, tx, ty)
    digit = (3 * tx) ^ ty
    # In the lower quadrants the sub-curve is rotated: swapped, and in the right one also mirrored.
    return digit, np.where(ty == 0, (flip ^ tx) | ((swap ^ 1) << 1), state)


@lru_cache(maxsize=_LEVELS_PER_STEP)
def _levels_table(levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Key bits and next state for every (state, `levels` bits of x, `levels` bits of y)."""
    n = 1 << levels
    state, xs, ys = (a.ravel() for a in np.meshgrid(np.arange(4), np.arange(n), np.arange(n), indexing="ij"))
    key = np.zeros_like(state)
    for level in range(levels - 1, -1, -1):
        digit, state = _one_level(state, (xs >> level) & 1, (ys >> level) & 1)
        key = (key << 2) | digit
    return key.astype(np.int64), state.astype(np.int64)


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
    """Hilbert key of each bbox centre; a box with xmin > xmax crosses the anti-meridian, and its
    centre lies between xmin and xmax the short way across ±180."""
    cx = centre_x(xmin, xmax)
    cy = (np.asarray(ymin) + np.asarray(ymax)) * 0.5
    ix, iy = grid_cells(cx, cy, extent, bits)
    return hilbert_distance(ix, iy, bits)
