"""Geohash cells: arrays in, arrays out.

A table partitioned by `geohash(geometry, P)` files each row under the geohash of its bbox: the
longest geohash (at most P characters) whose cell holds the whole bbox. A point, or anything
small inside one cell of P characters, gets its P-character cell; a line or polygon that crosses
a cell edge gets a shorter one (the cell that still holds it, down to "" for the whole world).
This is GeoMesa's XZ idea on geohash cells, and it is what makes pruning by cell exact: every row
whose geometry touches a query window sits in a cell that touches the window, so the cells
`covering_cells` lists for a window (every P-character cell it touches and all their prefixes)
hold every row a query must see, however large the geometry.

Cells are read off the standard geohash bit interleaving (longitude first, 5 bits a character,
base 32 "0123456789bcdefghjkmnpqrstuvwxyz"): a value on a cell edge belongs to the upper cell.
"""

from __future__ import annotations

import numpy as np

BASE32 = "0123456789bcdefghjkmnpqrstuvwxyz"
MAX_PRECISION = 12
_CHARS = np.array(list(BASE32))


def _bits(precision: int) -> tuple[int, int]:
    """Longitude and latitude bits of a geohash of `precision` characters."""
    total = 5 * precision
    return (total + 1) // 2, total // 2


def _check(precision: int) -> None:
    if isinstance(precision, bool) or not isinstance(precision, int) or not 1 <= precision <= MAX_PRECISION:
        raise ValueError(f"precision: {precision!r} must be a whole number 1..{MAX_PRECISION}")


def _index(values: np.ndarray, lo: float, hi: float, bits: int) -> np.ndarray:
    n = np.int64(1) << bits
    scaled = np.floor((np.asarray(values, dtype=np.float64) - lo) / (hi - lo) * n)
    return np.clip(np.nan_to_num(scaled, nan=0.0), 0, n - 1).astype(np.int64)


def _interleave(ix: np.ndarray, iy: np.ndarray, precision: int) -> np.ndarray:
    """The 5*precision-bit geohash code of longitude cells ix and latitude cells iy."""
    lon_bits, lat_bits = _bits(precision)
    code = np.zeros(ix.shape, dtype=np.int64)
    # Bit k of the code (from the top) is a longitude bit for even k, a latitude bit for odd k.
    for k in range(5 * precision):
        if k % 2 == 0:
            bit = (ix >> (lon_bits - 1 - k // 2)) & 1
        else:
            bit = (iy >> (lat_bits - 1 - k // 2)) & 1
        code = (code << 1) | bit
    return code


def geohash_codes(lon: np.ndarray, lat: np.ndarray, precision: int) -> np.ndarray:
    """The geohash of each point as an int64 of 5*precision bits."""
    _check(precision)
    lon_bits, lat_bits = _bits(precision)
    return _interleave(_index(lon, -180.0, 180.0, lon_bits), _index(lat, -90.0, 90.0, lat_bits), precision)


def _to_text(codes: np.ndarray, lengths: np.ndarray, precision: int) -> np.ndarray:
    """Codes of `precision` characters as strings, each cut to its length (object array of str).
    A batch holds few distinct cells: each is spelled once."""
    lengths = np.asarray(lengths, dtype=np.int64)
    cut = codes >> (5 * (precision - lengths))
    keys = (cut << 4) | lengths
    distinct, inverse = np.unique(keys, return_inverse=True)
    spelled = np.empty(len(distinct), dtype=object)
    for i, key in enumerate(distinct.tolist()):
        n, value = key & 15, key >> 4
        spelled[i] = "".join(BASE32[(value >> (5 * (n - 1 - c))) & 31] for c in range(n))
    return spelled[inverse.reshape(codes.shape)] if codes.size else np.array([], dtype=object)


def geohash(lon: np.ndarray, lat: np.ndarray, precision: int) -> np.ndarray:
    """The geohash of each point, `precision` characters (object array of str)."""
    codes = geohash_codes(lon, lat, precision)
    return _to_text(codes, np.full(codes.shape, precision), precision)


def enclosing_cells(
    xmin: np.ndarray, ymin: np.ndarray, xmax: np.ndarray, ymax: np.ndarray, precision: int
) -> np.ndarray:
    """The cell of each bbox: the longest geohash, at most `precision` characters, holding it whole.

    A geohash cell is a rectangle and every prefix's cell holds it, so the cell that holds both
    corners of a bbox holds the bbox: it is the common prefix of the corners' geohashes. A box that
    wraps across ±180 (xmin > xmax) lies in no cell but the whole world's, the empty one: geohash
    cells do not wrap."""
    lo = geohash_codes(xmin, ymin, precision)
    hi = geohash_codes(xmax, ymax, precision)
    shared = np.zeros(lo.shape, dtype=np.int64)
    same = np.ones(lo.shape, dtype=bool)
    for c in range(precision):
        shift = 5 * (precision - 1 - c)
        same &= ((lo >> shift) & 31) == ((hi >> shift) & 31)
        shared += same
    shared[np.asarray(xmin) > np.asarray(xmax)] = 0
    return _to_text(lo, shared, precision)


def covering_cells(bbox: tuple[float, float, float, float], precision: int, max_cells: int = 4096) -> list[str]:
    """The cells whose rows a query window `bbox` (lon/lat, edges included) may touch.

    Every cell of `precision` characters the window touches and every prefix of them. A window
    that touches more than `max_cells` cells of that precision is covered at a shorter precision
    k instead: its cells of k characters and their prefixes, each to be taken with every longer
    cell it is a prefix of (`prefix_cells` says which). Sorted, no repeats."""
    cells, _ = _cover(bbox, precision, max_cells)
    return cells


def prefix_cells(bbox: tuple[float, float, float, float], precision: int, max_cells: int = 4096) -> list[str]:
    """The cells of `covering_cells` that stand for themselves and every longer cell they begin
    (empty when the window is covered at full precision)."""
    _, prefixes = _cover(bbox, precision, max_cells)
    return prefixes


def _cover(bbox: tuple[float, float, float, float], precision: int, max_cells: int) -> tuple[list[str], list[str]]:
    _check(precision)
    xmin, ymin, xmax, ymax = (float(v) for v in bbox)
    level = precision
    while True:
        lon_bits, lat_bits = _bits(level)
        i0, i1 = (int(v) for v in _index(np.array([xmin, xmax]), -180.0, 180.0, lon_bits))
        j0, j1 = (int(v) for v in _index(np.array([ymin, ymax]), -90.0, 90.0, lat_bits))
        count = (i1 - i0 + 1) * (j1 - j0 + 1)
        if count <= max_cells or level == 1:
            break
        level -= 1
    ix, iy = np.meshgrid(np.arange(i0, i1 + 1, dtype=np.int64), np.arange(j0, j1 + 1, dtype=np.int64))
    codes = _interleave(ix.ravel(), iy.ravel(), level)
    finest = set(_to_text(codes, np.full(codes.shape, level), level).tolist())
    cells = {cell[:n] for cell in finest for n in range(level + 1)}
    return sorted(cells), (sorted(finest) if level < precision else [])


def cell_count(bbox: tuple[float, float, float, float], precision: int) -> int:
    """How many cells of `precision` characters the extent `bbox` (lon/lat) touches."""
    _check(precision)
    lon_bits, lat_bits = _bits(precision)
    i0, i1 = (int(v) for v in _index(np.array([bbox[0], bbox[2]]), -180.0, 180.0, lon_bits))
    j0, j1 = (int(v) for v in _index(np.array([bbox[1], bbox[3]]), -90.0, 90.0, lat_bits))
    return (i1 - i0 + 1) * (j1 - j0 + 1)
