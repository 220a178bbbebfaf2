"""Longitudes across the anti-meridian (±180°) in a geographic CRS: arrays in, arrays out.

The rule (the contract's `geometry.antimeridian = "short"`): two consecutive vertices of one
line or ring whose longitudes are more than 180° apart are joined the short way, across ±180,
unless both lie on ±180 (an edge along the anti-meridian, the planar way of drawing a polar cap
or the whole world). A geometry with such an edge crosses the anti-meridian.

A box crossing the anti-meridian is stored wrapped, Havasu's and GeoParquet 1.1's way: xmin >
xmax, covering [xmin, 180] and [-180, xmax]. A box of width 360 is stored as [-180, 180].
"""

from __future__ import annotations

import numpy as np
import shapely
from numpy.typing import ArrayLike

_MULTI_TYPES = (4, 5, 6, 7)  # MultiPoint, MultiLineString, MultiPolygon, GeometryCollection
_POLYGON = 3
# A latitude band no geographic coordinate leaves, for cutting geometries at ±180.
_BAND = 1e9


# -- boxes ---------------------------------------------------------------------------------------
def is_wrapped(xmin: ArrayLike, xmax: ArrayLike) -> np.ndarray:
    """Whether each box crosses the anti-meridian (xmin > xmax)."""
    return np.asarray(xmin, dtype=np.float64) > np.asarray(xmax, dtype=np.float64)


def centre_x(xmin: ArrayLike, xmax: ArrayLike) -> np.ndarray:
    """Longitude of each box's centre; a wrapped box's centre lies on its own side of ±180."""
    lo = np.asarray(xmin, dtype=np.float64)
    hi = np.asarray(xmax, dtype=np.float64)
    wrapped = lo > hi
    c = (lo + np.where(wrapped, hi + 360.0, hi)) * 0.5
    return np.where(wrapped & (c > 180.0), c - 360.0, c)


def x_overlaps(xmin: ArrayLike, xmax: ArrayLike, lo: float, hi: float) -> np.ndarray:
    """Whether each x range (plain, or wrapped when xmin > xmax) meets the plain interval
    [lo, hi], edges included. A wrapped range is [xmin, 180] and [-180, xmax]."""
    a = np.asarray(xmin, dtype=np.float64)
    b = np.asarray(xmax, dtype=np.float64)
    plain = (a <= hi) & (b >= lo)
    return np.where(a > b, (a <= hi) | (b >= lo), plain)


def window_intervals(xmin: float, xmax: float) -> list[tuple[float, float]]:
    """A window's x range as plain intervals: one, or two for a wrapped window."""
    if xmin > xmax:
        return [(xmin, 180.0), (-180.0, xmax)]
    return [(xmin, xmax)]


def covering_arcs(lo: np.ndarray, hi: np.ndarray, group: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """The shortest arc of longitudes covering every arc [lo, hi] of each group.

    Arcs are given unwrapped (lo <= hi, hi - lo <= 360; any lo). Returns (xmin, xmax) per group
    in [-180, 180], wrapped (xmin > xmax) when the cover crosses ±180, (-180, 180) when it is the
    whole circle, NaN for a group without arcs. The cover is the circle less the largest gap
    between the arcs.
    """
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    group = np.asarray(group, dtype=np.int64)
    out_lo = np.full(groups, np.nan)
    out_hi = np.full(groups, np.nan)
    if lo.size == 0:
        return out_lo, out_hi
    width = np.minimum(hi - lo, 360.0)
    start = np.mod(lo + 180.0, 360.0) - 180.0  # in [-180, 180)
    order = np.lexsort((start, group))
    g, s = group[order], start[order]
    e = s + width[order]
    # One running maximum for all groups: each group is lifted far above the previous one.
    lift = g * 2000.0
    reach = np.maximum.accumulate(e + lift) - lift
    first = np.r_[True, g[1:] != g[:-1]]
    last = np.r_[g[1:] != g[:-1], True]
    first_at = np.flatnonzero(first)
    per = np.cumsum(first) - 1  # which group-run each sorted arc belongs to
    group_reach = reach[last]  # the furthest end of each group
    spill = group_reach - 360.0  # arcs past the first start + 360 cover the circle's beginning again
    # Gaps between consecutive arcs of a group, shrunk by what the spill covers.
    gap_start = np.maximum(reach[:-1], spill[per[:-1]])
    gap_len = np.where(last[:-1], -np.inf, s[1:] - gap_start)
    gap_end = s[1:]
    # The gap from a group's furthest end round to its first start.
    wrap_len = s[first_at] + 360.0 - group_reach
    best_len = wrap_len.copy()
    best_end = s[first_at].copy()
    if gap_len.size:
        inner = np.flatnonzero(np.isfinite(gap_len))
        # the largest inner gap of each group
        ord2 = np.lexsort((gap_len[inner], per[inner]))
        inner = inner[ord2]
        top = inner[np.r_[per[inner][1:] != per[inner][:-1], True]] if inner.size else inner
        runs = per[top]
        better = gap_len[top] > best_len[runs]
        best_len[runs[better]] = gap_len[top][better]
        best_end[runs[better]] = gap_end[top][better]
    groups_present = g[first_at]
    whole = best_len <= 0.0
    cover_lo = np.where(whole, -180.0, best_end)
    cover_hi = np.where(whole, 180.0, best_end + 360.0 - best_len)
    cover_hi = np.where(cover_hi > 180.0, cover_hi - 360.0, cover_hi)
    # A cover ending exactly on 180 after wrapping is plain.
    cover_hi = np.where(~whole & (cover_hi == -180.0) & (cover_lo > -180.0), 180.0, cover_hi)
    out_lo[groups_present] = cover_lo
    out_hi[groups_present] = cover_hi
    return out_lo, out_hi


def union_x(xmin: np.ndarray, xmax: np.ndarray) -> tuple[float, float]:
    """The shortest arc covering x ranges (plain, or wrapped when xmin > xmax)."""
    a = np.asarray(xmin, dtype=np.float64)
    b = np.asarray(xmax, dtype=np.float64)
    hi = np.where(a > b, b + 360.0, b)
    lo, up = covering_arcs(a, hi, np.zeros(a.size, dtype=np.int64), 1)
    return float(lo[0]), float(up[0])


# -- paths ---------------------------------------------------------------------------------------
def unwrap_paths(x: np.ndarray, path: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Longitudes of paths (`path`: each vertex's path number, vertices of a path contiguous)
    made continuous by the short-way rule; each path moved by whole turns so that its least
    longitude is in [-180, 180). Returns the new longitudes and, per vertex, whether an edge
    from the previous vertex crossed ±180."""
    x = np.asarray(x, dtype=np.float64)
    path = np.asarray(path, dtype=np.int64)
    if x.size == 0:
        return x.copy(), np.zeros(0, dtype=bool)
    dx = np.diff(x)
    same = path[1:] == path[:-1]
    along_edge = (np.abs(x[1:]) == 180.0) & (np.abs(x[:-1]) == 180.0)
    jump = same & (np.abs(dx) > 180.0) & ~along_edge
    step = np.where(jump, -360.0 * np.sign(dx), 0.0)
    shift = np.r_[0.0, np.cumsum(step)]
    starts = np.flatnonzero(np.r_[True, ~same])
    run = np.cumsum(np.r_[True, ~same]) - 1
    shift -= shift[starts][run]
    xu = x + shift
    least = np.minimum.reduceat(xu, starts)
    turns = np.floor((least + 180.0) / 360.0)
    xu -= 360.0 * turns[run]
    return xu, np.r_[False, jump]


def _flat_parts(geoms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Single parts (points, lines, polygons) of each geometry, in order, with their geometry."""
    parts = np.asarray(geoms, dtype=object)
    owner = np.arange(parts.size)
    while parts.size and np.isin(shapely.get_type_id(parts), _MULTI_TYPES).any():
        parts, index = shapely.get_parts(parts, return_index=True)
        owner = owner[index]
    return parts, owner


def _paths(geoms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every line or ring of the geometries in coordinate order: vertex count, geometry, part,
    and whether it is a polygon's hole."""
    parts, owner = _flat_parts(geoms)
    polygon = shapely.get_type_id(parts) == _POLYGON
    # A part's paths: its rings (shell first) for a polygon, itself otherwise.
    rings, ring_part = shapely.get_rings(parts[polygon], return_index=True)
    poly_parts = np.flatnonzero(polygon)[ring_part]
    other_parts = np.flatnonzero(~polygon)
    part_of = np.r_[poly_parts, other_parts]
    sizes = np.r_[shapely.get_num_coordinates(rings), shapely.get_num_coordinates(parts[other_parts])]
    hole = np.r_[np.r_[False, ring_part[1:] == ring_part[:-1]], np.zeros(other_parts.size, dtype=bool)]
    order = np.argsort(part_of, kind="stable")
    return sizes[order], owner[part_of[order]], part_of[order], hole[order]


def short_way_bounds(geoms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of each geometry by the short-way rule and whether it crosses the anti-meridian.

    A geometry that does not cross keeps its plain bounds; one that does gets the shortest
    x range covering its parts, wrapped (xmin > xmax) when that range crosses ±180."""
    geoms = np.asarray(geoms, dtype=object)
    bounds = shapely.bounds(geoms)
    crosses = np.zeros(geoms.size, dtype=bool)
    if geoms.size == 0:
        return bounds, crosses
    sizes, owner, part, _hole, xu, cut = _unwrapped(geoms)
    if xu.size == 0:
        return bounds, crosses
    path = np.repeat(np.arange(sizes.size), sizes)
    crosses[np.unique(owner[path[cut]])] = True
    if not crosses.any():
        return bounds, crosses
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    lo = np.minimum.reduceat(xu, starts)
    hi = np.maximum.reduceat(xu, starts)
    mine = crosses[owner]
    index = np.flatnonzero(crosses)
    slot = np.full(geoms.size, -1)
    slot[index] = np.arange(index.size)
    xmin, xmax = covering_arcs(lo[mine], hi[mine], slot[owner[mine]], index.size)
    bounds[index, 0] = xmin
    bounds[index, 2] = xmax
    return bounds, crosses


def _unwrapped(geoms: np.ndarray):
    """Paths of the geometries and their longitudes unwrapped, each hole moved next to its shell."""
    sizes, owner, part, hole = _paths(geoms)
    keep = sizes > 0
    sizes, owner, part, hole = sizes[keep], owner[keep], part[keep], hole[keep]
    coords = shapely.get_coordinates(geoms)
    path = np.repeat(np.arange(sizes.size), sizes)
    xu, cut = unwrap_paths(coords[:, 0], path)
    if hole.any():
        starts = np.r_[0, np.cumsum(sizes)[:-1]]
        centre = (np.minimum.reduceat(xu, starts) + np.maximum.reduceat(xu, starts)) * 0.5
        shell = np.flatnonzero(~hole)
        shell_of = shell[np.searchsorted(shell, np.arange(sizes.size), side="right") - 1]
        turns = np.round((centre[shell_of] - centre) / 360.0)
        xu = xu + 360.0 * turns[path]
    return sizes, owner, part, hole, xu, cut


def unwrapped(geoms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each geometry read by the short-way rule as one planar shape: longitudes continuous along
    its edges, each path moved by whole turns so that its least longitude is in [-180, 180)
    (so up to 540 for one that crosses); and whether it crosses. XY only. A geometry meets a
    window W in [-180, 180] iff its unwrapped shape meets W, W + 360 or W + 720."""
    geoms = np.asarray(geoms, dtype=object)
    flat = shapely.force_2d(geoms)
    crosses = np.zeros(geoms.size, dtype=bool)
    if geoms.size == 0:
        return flat, crosses
    sizes, owner, _part, _hole, xu, cut = _unwrapped(flat)
    if not cut.any():
        return flat, crosses
    path = np.repeat(np.arange(sizes.size), sizes)
    crosses[np.unique(owner[path[cut]])] = True
    coords = shapely.get_coordinates(flat)
    coords[:, 0] = xu
    return shapely.set_coordinates(flat.copy(), coords), crosses


def split_at_antimeridian(geoms: np.ndarray) -> np.ndarray:
    """Each geometry read by the short-way rule, cut at ±180 into parts within [-180, 180]
    (a geometry that does not cross comes back as it is). For exact predicates in plain x/y."""
    geoms = np.asarray(geoms, dtype=object)
    out = geoms.copy()
    if geoms.size == 0:
        return out
    flat = shapely.force_2d(geoms)
    sizes, owner, _part, _hole, xu, cut = _unwrapped(flat)
    if not cut.any():
        return out
    path = np.repeat(np.arange(sizes.size), sizes)
    crossing = np.unique(owner[path[cut]])
    coords = shapely.get_coordinates(flat)
    coords[:, 0] = xu
    moved = shapely.set_coordinates(flat.copy(), coords)[crossing]
    try:
        joined = _cut(moved)
    except shapely.errors.GEOSException:  # an invalid polygon: each alone, kept whole if it still fails
        joined = np.array([_cut_or_keep(g) for g in moved], dtype=object)
    out[crossing] = joined
    return out


def _cut(moved: np.ndarray) -> np.ndarray:
    pieces = []
    for turn in (0, 1, 2):
        band = shapely.box(-180.0 + 360.0 * turn, -_BAND, 180.0 + 360.0 * turn, _BAND)
        piece = shapely.intersection(moved, band)
        if turn:
            piece = shapely.transform(piece, lambda c, t=turn: c - np.array([360.0 * t, 0.0]))
        pieces.append(piece)
    return shapely.union(shapely.union(pieces[0], pieces[1]), pieces[2])


def _cut_or_keep(moved: shapely.Geometry) -> shapely.Geometry:
    try:
        return _cut(np.array([moved], dtype=object))[0]
    except shapely.errors.GEOSException:
        return shapely.make_valid(moved)
