"""WKB and EWKB values (contract formats "wkb" and "ewkb"), and the WKB reader GeoPackage shares.

GEOS reads the values of a batch at once. What it overlooks (type bits WKB does not define, byte
order bytes other than 0 or 1, an SRID on a part, bytes after the geometry) and what would
overflow its stack (collections nested thousands deep) is found by walking the bytes without
recursion, only for the few values that need it. Most point and polygon events are already in
the stored form (little-endian 2D ISO WKB): they are stored as sent, and points get no geometry
object at all.
"""

from __future__ import annotations

import struct
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import shapely

from streaming.contract import Contract
from streaming.decode.formats.base import Decoded, InputFormat
from streaming.decode.rejects import Reason
from streaming.kernels.buffers import NONE, offsets_and_bytes

# WKB types made of other geometries: Multi*, GeometryCollection, CompoundCurve, CurvePolygon,
# MultiCurve, MultiSurface, PolyhedralSurface, TIN.
_WKB_CONTAINER_TYPES = (4, 5, 6, 7, 9, 10, 11, 12, 15, 16)
_WKB_CURVE_TYPES = (8, 9, 10, 11, 12)  # CircularString, CompoundCurve, CurvePolygon, MultiCurve, MultiSurface
EWKB_Z_FLAG, EWKB_M_FLAG, EWKB_SRID_FLAG = 0x80000000, 0x40000000, 0x20000000
_EWKB_FLAGS = EWKB_Z_FLAG | EWKB_M_FLAG | EWKB_SRID_FLAG
UNLIMITED = 1 << 62  # a walk's depth limit that is never reached
# GEOS reads, writes and walks nested geometries recursively: this deep is far from the end of an
# 8 MiB stack (50,000 levels overflow it).
_GEOS_SAFE_NESTING = 1000


class WkbFormat(InputFormat):
    """Raw WKB (taken to be in the table CRS) and EWKB (its SRID honoured), ISO or extended flavour,
    either byte order."""

    names: ClassVar[tuple[str, ...]] = ("wkb", "ewkb")
    first_bytes: ClassVar[tuple[int, ...]] = (0, 1)
    described: ClassVar[str] = "WKB"
    first_bytes_shown: ClassVar[tuple[str, ...]] = ("0x00", "0x01")

    def decode(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        taken = values.take(pa.array(rows)).cast(pa.binary())
        rows, codes, geoms = read_wkb(taken, rows, out, self.contract, self.max_nesting)
        rejects = out.rejects
        has_srid = (codes & EWKB_SRID_FLAG) != 0
        if has_srid.any() and "ewkb" not in self.contract.formats:
            rejects.add(
                rows[has_srid], Reason.FORMAT_NOT_ACCEPTED, "EWKB (WKB with an SRID) is not accepted by this table"
            )
        if (~has_srid).any() and "wkb" not in self.contract.formats:
            rejects.add(
                rows[~has_srid], Reason.FORMAT_NOT_ACCEPTED, "WKB without an SRID is not accepted by this table"
            )
        # Plain WKB carries no CRS: it is taken to be in the table CRS. An EWKB SRID is honoured,
        # 0 too (PostGIS's "unknown", which no EPSG code is).
        out.srids[rows] = np.where(has_srid, shapely.get_srid(geoms), self.contract.geometry.epsg)


def read_wkb(
    taken: pa.Array, rows: np.ndarray, out: Decoded, contract: Contract, max_nesting: int, where: str = "value"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reads one WKB geometry from each of `taken` (binary, the values of `rows`) into `out`:
    its geometry (or, for a plain point, its x and y) and, where the value is its stored form, the
    value itself. Rejects what is not exactly one well-formed WKB geometry (bad_wkb), nests too
    deeply or holds a curve. `where` names the bytes in details ("value"). Returns the rows read,
    their type words and their geometries (None for plain points)."""
    rejects = out.rejects
    codes, little = wkb_header_codes(taken)
    too_deep = f"geometries nested more than max_nesting={max_nesting} levels deep"
    # GEOS recurses once per level of nesting as it reads a value. A value long enough to nest
    # deeper than GEOS safely goes (9 bytes a level) is walked first, without recursion; the
    # nesting of the others is checked on what GEOS read of them.
    unsafe = pc.greater(pc.binary_length(taken), 9 * (max(max_nesting, _GEOS_SAFE_NESTING) + 1)).to_numpy(
        zero_copy_only=False
    )
    for local in np.flatnonzero(np.isin(wkb_base_type(codes), _WKB_CONTAINER_TYPES) & unsafe):
        deepest, _, _ = walk_wkb(taken[int(local)].as_py(), max_nesting)
        if deepest > max_nesting:
            rejects.add(rows[[local]], Reason.NESTING_TOO_DEEP, too_deep)
    live = rejects.ok[rows]
    rows, taken, codes, little = rows[live], taken.filter(pa.array(live)), codes[live], little[live]
    if rows.size == 0:
        return rows, codes, np.zeros(0, dtype=object)
    blobs = taken.to_numpy(zero_copy_only=False)
    plain, xy = plain_points(taken, codes, little)
    out.points_xy[rows[plain]] = xy
    decoded = np.full(rows.size, None, dtype=object)
    curved = np.zeros(rows.size, dtype=bool)
    decoded[~plain], curved[~plain] = _read_wkb(blobs[~plain])
    curves_not_allowed = (
        f"a curve (CircularString, CompoundCurve, CurvePolygon, MultiCurve or MultiSurface) "
        f"is not one of {list(contract.geometry.types)}"
    )
    rejects.add(rows[curved], Reason.GEOMETRY_TYPE_NOT_ALLOWED, curves_not_allowed)
    bad = np.equal(decoded, NONE) & ~plain
    for local in np.flatnonzero(bad & ~curved):
        deepest, problem, _ = walk_wkb(blobs[local], UNLIMITED)
        if deepest > max_nesting:
            rejects.add(rows[[local]], Reason.NESTING_TOO_DEEP, too_deep)
        else:
            rejects.add(rows[[local]], Reason.BAD_WKB, _unreadable_wkb(blobs[local], problem, where))
    # Collections are the geometries GEOS read that can nest, and hold curves shapely cannot
    # (GEOS refuses a curve in any other container): they are walked.
    for local in np.flatnonzero(~bad)[shapely.get_type_id(decoded[~bad]) == 7]:
        deepest, _, curve = walk_wkb(blobs[local], max_nesting)
        if curve:
            rejects.add(rows[[local]], Reason.GEOMETRY_TYPE_NOT_ALLOWED, curves_not_allowed)
        elif deepest > max_nesting:
            rejects.add(rows[[local]], Reason.NESTING_TOO_DEEP, too_deep)
        bad[local] = curve or deepest > max_nesting
    parsed = np.flatnonzero(~bad)
    # Plain points and polygons are their own stored form (what GEOS would write back of
    # them, byte for byte): the rest is written back.
    lengths = np.diff(offsets_and_bytes(taken)[0])
    as_sent = plain[parsed] | _plain_polygons(lengths[parsed], codes[parsed], little[parsed], decoded[parsed])
    read = parsed[~as_sent]
    written = to_stored_wkb(decoded[read])
    out.wkb[rows[parsed[as_sent]]] = blobs[parsed[as_sent]]
    out.wkb[rows[read]] = written
    # GEOS stops reading where the geometry ends and overlooks type bits and byte order bytes
    # WKB does not define: the value must be exactly the WKB of the geometry read from it. A
    # value written back otherwise (parts in another byte order, an SRID of 0) is walked to
    # tell a different spelling of WKB from a value that is not WKB.
    exact = np.ones(parsed.size, dtype=bool)
    exact[~as_sent] = _written_back_exactly(
        taken.take(pa.array(read)), written, decoded[read], codes[read], little[read]
    )
    for local in parsed[~exact]:
        _, problem, _ = walk_wkb(blobs[local], UNLIMITED)
        if problem is not None:
            rejects.add(rows[[local]], Reason.BAD_WKB, f"{where} is not one well-formed WKB geometry: {problem}")
            bad[local] = True
    good = ~bad
    out.geoms[rows[good]] = decoded[good]
    return rows[good], codes[good], decoded[good]


def to_stored_wkb(geoms: np.ndarray) -> np.ndarray:
    """The stored form: ISO WKB with every dimension the geometry has, no SRID (the table's CRS)."""
    if geoms.size == 0:
        return np.zeros(0, dtype=object)
    return shapely.to_wkb(geoms, output_dimension=4, flavor="iso", include_srid=False)


def wkb_header_codes(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The geometry type word of each value (ISO code and EWKB flags; 0 where there is none), and
    whether the value is little-endian."""
    n = len(values)
    offsets, data = offsets_and_bytes(values)
    starts = offsets[:-1]
    has_header = (
        (np.diff(offsets) >= 5) & np.isin(data[np.minimum(starts, max(data.size - 1, 0))], (0, 1))
        if data.size
        else np.zeros(n, dtype=bool)
    )
    codes = np.zeros(n, dtype=np.int64)
    at = starts[has_header]
    word = (
        np.stack([data[at + 1 + i] for i in range(4)], axis=1).astype(np.int64)
        if at.size
        else np.zeros((0, 4), np.int64)
    )
    little = np.zeros(n, dtype=bool)
    little[has_header] = data[at] == 1
    weights = np.array([1, 1 << 8, 1 << 16, 1 << 24], dtype=np.int64)
    codes[has_header] = np.where(little[has_header], word @ weights, word @ weights[::-1])
    return codes, little


def _plain_polygons(lengths: np.ndarray, codes: np.ndarray, little: np.ndarray, geoms: np.ndarray) -> np.ndarray:
    """Which values (of these byte lengths) GEOS read as a polygon are byte for byte what GEOS
    writes of it: little-endian 2D ISO WKB (type word 3), exactly as long as the rings and points
    GEOS read (so nothing follows them). GEOS reads and writes each double bit for bit; only a
    NaN's bits may differ, and a polygon with one is rejected. Writing each polygon back to
    compare cost 0.9 us an event."""
    # (an empty polygon has no ring at all: left to the comparison)
    polygon = little & (codes == 3) & (shapely.get_type_id(geoms) == 3) & ~shapely.is_empty(geoms)
    rings = shapely.get_num_interior_rings(geoms[polygon]) + 1
    points = shapely.get_num_coordinates(geoms[polygon])
    exact = np.zeros(len(lengths), dtype=bool)
    exact[polygon] = lengths[polygon] == 9 + 4 * rings + 16 * points
    return exact


def plain_points(values: pa.Array, codes: np.ndarray, little: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which values are a 2D point in little-endian ISO WKB with finite coordinates (exactly 21
    bytes), and their coordinates. Most point events are spelt so; their coordinates are read
    straight from the bytes, as GEOS would read them, the value is stored as sent, and no
    geometry object is made (the checks and bounds of such a point need only its x and y):
    shapely.from_wkb and writing the point back cost 1.2 us an event, making the object alone 0.4. NaN and infinite
    coordinates (an empty point is spelt with NaN) are left to GEOS."""
    n = len(values)
    offsets, data = offsets_and_bytes(values)
    candidates = np.flatnonzero((np.diff(offsets) == 21) & little & (codes == 1))
    plain = np.zeros(n, dtype=bool)
    if candidates.size == 0:
        return plain, np.zeros((0, 2))
    # the 16 bytes after each candidate's 5-byte header, as two little-endian doubles
    at = offsets[candidates][:, None] + 5 + np.arange(16)
    xy = data[at].view("<f8").reshape(-1, 2)
    finite = np.isfinite(xy).all(axis=1)
    plain[candidates[finite]] = True
    return plain, xy[finite]


def _written_back_exactly(
    sent: pa.Array, written: np.ndarray, geoms: np.ndarray, codes: np.ndarray, little: np.ndarray
) -> np.ndarray:
    """Whether each value is byte for byte what GEOS writes of its geometry in the value's own byte
    order and flavour. `written` is the stored form (ISO, little-endian), which most values are."""
    exact = np.zeros(len(sent), dtype=bool)
    extended = (codes & _EWKB_FLAGS) != 0
    with_srid = (codes & EWKB_SRID_FLAG) != 0
    for is_little in (True, False):
        for is_extended in (False, True):
            for has_srid in (False, True) if is_extended else (False,):
                group = np.flatnonzero((little == is_little) & (extended == is_extended) & (with_srid == has_srid))
                if group.size == 0:
                    continue
                if is_little and not is_extended:
                    expected = written[group]
                else:
                    expected = shapely.to_wkb(
                        geoms[group],
                        output_dimension=4,
                        byte_order=int(is_little),
                        flavor="extended" if is_extended else "iso",
                        include_srid=has_srid,
                    )
                exact[group] = pc.fill_null(
                    pc.equal(sent.take(pa.array(group)), pa.array(expected, pa.binary())), False
                ).to_numpy(zero_copy_only=False)
    return exact


def _read_wkb(blobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Geometries of WKB values (None where GEOS cannot read one) and which values are curves.

    GEOS reads curves (CircularString ... MultiSurface, also nested in a collection) but shapely
    cannot hold them, and raises for the whole array: then each value is read alone."""
    curved = np.zeros(len(blobs), dtype=bool)
    with np.errstate(all="ignore"):  # a value GEOS refuses is reported as bad_wkb, not warned of
        try:
            return shapely.from_wkb(blobs, on_invalid="ignore"), curved
        except NotImplementedError:
            pass
        geoms = np.full(len(blobs), None, dtype=object)
        for i, blob in enumerate(blobs):
            try:
                geoms[i] = shapely.from_wkb(blob, on_invalid="ignore")
            except NotImplementedError:
                curved[i] = True
    return geoms, curved


def wkb_base_type(code):
    """The geometry type GEOS reads from a WKB type word, whatever the flavour: ISO (1000s for Z, M,
    ZM) and EWKB (high flag bits) alike, and bits GEOS ignores ignored too. The nesting check must
    see the structure exactly as GEOS will walk it."""
    return (code & 0xFFFF) % 1000


def walk_wkb(blob: bytes, max_depth: int) -> tuple[int, str | None, bool]:
    """Walks a WKB value as GEOS reads it, without recursion. Returns how deep geometries nest
    (the walk stops once deeper than max_depth), the first way the value departs from exactly one
    well-formed WKB geometry (or None), and whether it holds a curve. GEOS itself overlooks some
    departures (type bits WKB does not define, a byte order byte other than 0 or 1, an SRID on a
    part, bytes after the geometry), so the walk goes on past them as GEOS would: the depth is
    what GEOS will recurse to."""
    pos, depth, deepest = 0, 0, 0
    curve = False
    order = "<"
    problem: str | None = None
    whole_dims: tuple[bool, bool] | None = None
    remaining = [1]  # geometries still to read at each open level
    try:
        while remaining:
            if remaining[-1] == 0:
                remaining.pop()
                depth -= 1
                continue
            remaining[-1] -= 1
            start = pos
            if blob[pos] in (0, 1):
                order = "<" if blob[pos] == 1 else ">"
            elif problem is None:  # GEOS keeps the byte order it had
                problem = f"byte {pos}: byte order {blob[pos]} is neither 0 nor 1"
            (code,) = struct.unpack_from(order + "I", blob, pos + 1)
            pos += 5 + (4 if code & EWKB_SRID_FLAG else 0)
            base = wkb_base_type(code)
            iso_range = (code & 0xFFFF) // 1000
            has_z = iso_range in (1, 3) or bool(code & EWKB_Z_FLAG)
            has_m = iso_range in (2, 3) or bool(code & EWKB_M_FLAG)
            dims = 2 + has_z + has_m
            if problem is None:
                problem = _type_word_problem(code, start)
            curve = curve or base in _WKB_CURVE_TYPES
            if whole_dims is None:
                whole_dims = (has_z, has_m)
            elif problem is None and (has_z, has_m) != whole_dims:
                problem = f"byte {start}: a part has other dimensions than the geometry it belongs to"
            if base == 1:
                pos += 8 * dims
            elif base in (2, 8):
                (count,) = struct.unpack_from(order + "I", blob, pos)
                pos += 4 + 8 * dims * count
            elif base in (3, 17):
                (rings,) = struct.unpack_from(order + "I", blob, pos)
                pos += 4
                for _ in range(rings):
                    (count,) = struct.unpack_from(order + "I", blob, pos)
                    pos += 4 + 8 * dims * count
            elif base in _WKB_CONTAINER_TYPES:
                (count,) = struct.unpack_from(order + "I", blob, pos)
                pos += 4
                depth += 1
                deepest = max(deepest, depth)
                if deepest > max_depth:
                    return deepest, problem, curve
                remaining.append(count)
            else:
                return deepest, problem or f"byte {start}: type word 0x{code:08x} names no geometry type", curve
    except (IndexError, struct.error):
        return deepest, problem or f"value ends inside its geometry ({len(blob)} bytes)", curve
    if pos > len(blob):
        return deepest, problem or f"value ends inside its geometry ({len(blob)} bytes, {pos} claimed)", curve
    if problem is None and pos < len(blob):
        problem = f"value has {len(blob) - pos} bytes after its {pos}-byte geometry"
    return deepest, problem, curve


def _unreadable_wkb(blob: bytes, problem: str | None, where: str) -> str:
    return f"{where} is not readable WKB ({len(blob)} bytes, starting {blob[:9].hex()})" + (
        f": {problem}" if problem else ""
    )


def _type_word_problem(code: int, at: int) -> str | None:
    """Why a type word is neither ISO WKB (type + 1000 x Z/M/ZM) nor EWKB (type | Z, M, SRID flags),
    or None. Only the first geometry of a value may carry an SRID."""
    flags, rest = code & _EWKB_FLAGS, code & ~_EWKB_FLAGS
    if flags:
        if not 1 <= rest <= 17:
            return f"byte {at}: type word 0x{code:08x} mixes EWKB flags with a type that is not EWKB"
        if code & EWKB_SRID_FLAG and at != 0:
            return f"byte {at}: a part of a geometry carries an SRID"
        return None
    if rest >= 4000 or not 1 <= rest % 1000 <= 17:
        return f"byte {at}: type word 0x{code:08x} is neither an ISO nor an EWKB geometry type"
    return None
