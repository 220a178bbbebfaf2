"""GeoJSON geometries read straight from Arrow: arrays in, geometries out.

GEOS reads GeoJSON one document at a time (shapely.from_geojson: ~350k points/s on one core here),
which made it the largest cost of decoding GeoJSON events. This reads the coordinates of a whole
block of documents with pyarrow's JSON reader instead, one pass per geometry type with that type's
nesting as the explicit schema, and builds the geometries from the list offsets with
shapely.from_ragged_array (GeoArrow's layout). bench/json_parsers.py measures it against the
parsers PyPI offers, on blocks of 20,000 Feature documents (what a Python worker gets at a time):
to geometries, points 520k documents/s against msgspec 314k, orjson 304k, pysimdjson 172k and
json 152k; hexagon polygons 340k against 87k at best. Per-record parsers lose on building
Python objects for every coordinate, which the geometries then have to be copied out of.

2D points get no geometry object at all: their x, y come back as numbers, which the caller keeps
as plain points (their stored WKB written for all at once), as the WKB and JSON lon/lat formats
do; building a GEOS point and writing its WKB again was a third of decoding GeoJSON points.

It reads only what is plainly well formed: positions of 2 or 3 finite numbers, the same in a whole
geometry, no empty parts, lines of 2 positions or more, closed rings of 4 or more. Every other
document is left unread (`read` is False) for the caller to hand to GEOS, which then accepts or
refuses it exactly as before: this path never decides that a document is bad.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import shapely
from shapely import GeometryType

from streaming.decode.formats.json_blocks import ROW_IN_ERROR

_POSITION = pa.list_(pa.float64())
# Geometry type -> (shapely type, list levels above the positions, fewest items at each level)
_LAYOUTS: dict[str, tuple[GeometryType, int, tuple[int, ...]]] = {
    "Point": (GeometryType.POINT, 0, ()),
    "LineString": (GeometryType.LINESTRING, 1, (2,)),
    "MultiPoint": (GeometryType.MULTIPOINT, 1, (1,)),
    "Polygon": (GeometryType.POLYGON, 2, (1, 4)),
    "MultiLineString": (GeometryType.MULTILINESTRING, 2, (1, 2)),
    "MultiPolygon": (GeometryType.MULTIPOLYGON, 3, (1, 1, 4)),
}
_RINGS = {"Polygon", "MultiPolygon"}
# A block refused for more rows than this is left to GEOS whole: isolating costs a parse per row.
_MAX_ISOLATED = 8


class ReadGeometries(NamedTuple):
    """What was read of each document: `read` is False where it is left for GEOS. A read 2D
    point has its x, y in `points_xy` and no geometry; every other read document has its
    geometry in `geoms` and NaN in `points_xy`."""

    geoms: np.ndarray
    read: np.ndarray
    points_xy: np.ndarray

    @property
    def plain(self) -> np.ndarray:
        return ~np.isnan(self.points_xy[:, 0])


def coordinates_type(geometry_type: str) -> pa.DataType | None:
    """The Arrow type the block reader reads the coordinates of a geometry type as (None: a type
    it does not read, a GeometryCollection or an unknown name)."""
    layout = _LAYOUTS.get(geometry_type)
    return None if layout is None else _nested_positions(layout[1])


def _nested_positions(levels: int) -> pa.DataType:
    """Positions (lists of numbers) under `levels` lists."""
    coordinate_type: pa.DataType = _POSITION
    for _ in range(levels):
        coordinate_type = pa.list_(coordinate_type)
    return coordinate_type


@dataclass(frozen=True)
class KnownCoordinates:
    """Coordinates already read, with the documents' other members, for the documents of one
    geometry type (null where they were not): only the null ones are read here."""

    geometry_type: str
    coordinates: pa.ListArray


def read_geometries(
    docs: pa.Array,
    geometry_types: np.ndarray,
    member: tuple[str, ...] = ("geometry",),
    known: KnownCoordinates | None = None,
) -> ReadGeometries:
    """Geometries of GeoJSON Feature documents (one per line: no raw line breaks), given each
    document's geometry type name (None where unknown). `member` is where the geometry object is
    in each document (a Feature's "geometry"; any path in a JSON event)."""
    n = len(docs)
    geoms = np.full(n, None, dtype=object)
    read = np.zeros(n, dtype=bool)
    points_xy = np.full((n, 2), np.nan)
    for name, layout in _LAYOUTS.items():
        rows = np.flatnonzero(geometry_types == name)
        if rows.size == 0:
            continue
        batches = []
        if known is not None and known.geometry_type == name:
            coordinates = known.coordinates.take(pa.array(rows))
            have = pc.is_valid(coordinates).to_numpy(zero_copy_only=False)
            batches.append((rows[have], coordinates.filter(pa.array(have))))
            rows = rows[~have]  # not read with the members (a block of another type): read now
        if rows.size:
            coordinates, parsed = _parse_coordinates(docs.take(pa.array(rows)), layout[1], member)
            if coordinates is not None:
                batches.append((rows[parsed], coordinates))
        for these, coordinates in batches:
            built, xy, ok = _build(coordinates, layout, closed_rings=name in _RINGS)
            geoms[these[ok]] = built[ok]
            points_xy[these[ok]] = xy[ok]
            read[these[ok]] = True
    return ReadGeometries(geoms, read, points_xy)


def _parse_coordinates(
    docs: pa.Array, levels: int, member: tuple[str, ...] = ("geometry",)
) -> tuple[pa.ListArray | None, np.ndarray]:
    """geometry.coordinates of each document, typed with `levels` lists above the positions, and
    which documents it holds (the reader refuses a whole block over one document of another shape:
    up to _MAX_ISOLATED such documents are set aside and the rest read again)."""
    node: pa.DataType = pa.struct([("coordinates", _nested_positions(levels))])
    for name in reversed(member[1:]):
        node = pa.struct([(name, node)])
    schema = pa.schema([(member[0], node)])
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    keep = np.ones(len(docs), dtype=bool)
    for _ in range(_MAX_ISOLATED + 1):
        block = docs.filter(pa.array(keep)) if not keep.all() else docs
        if len(block) == 0:
            return None, keep
        data = ndjson(block)
        try:
            table = pa_json.read_json(
                pa.BufferReader(data),
                parse_options=options,
                read_options=pa_json.ReadOptions(use_threads=False, block_size=max(data.size + 1, 1 << 20)),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            where = ROW_IN_ERROR.search(str(exc))
            if where is None or int(where.group(1)) >= len(block):
                return None, keep
            keep[np.flatnonzero(keep)[int(where.group(1))]] = False
            continue
        if table.num_rows != len(block):  # a value holding several documents
            return None, keep
        geometry = table.column(member[0]).combine_chunks()
        for name in member[1:]:
            geometry = pc.struct_field(geometry, name)
        return pc.struct_field(geometry, "coordinates"), keep
    return None, keep


def _build(
    coordinates: pa.ListArray, layout: tuple[GeometryType, int, tuple[int, ...]], closed_rings: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Geometries of one type from their coordinate lists (2D points as x, y only, NaN for the
    others), and which rows were plainly well formed."""
    kind, levels, fewest = layout
    n = len(coordinates)
    ok = np.ones(n, dtype=bool)
    row_of = np.arange(n)  # the row each item of the current level belongs to
    lengths_per_level: list[np.ndarray] = []
    level = coordinates
    for depth in range(levels):
        lengths = _lengths(level)
        ok[row_of[lengths < fewest[depth]]] = False
        lengths_per_level.append(lengths)
        row_of = row_of[pc.list_parent_indices(level).to_numpy()]
        level = pc.list_flatten(level)
    # `level` now holds the positions: lists of 2 or 3 numbers, the same count in a whole row
    dims = _lengths(level)
    ok[row_of[(dims < 2) | (dims > 3)]] = False
    widest = np.zeros(n, dtype=np.int64)
    narrowest = np.full(n, 4, dtype=np.int64)
    np.maximum.at(widest, row_of, dims)
    np.minimum.at(narrowest, row_of, dims)
    ok &= widest == narrowest
    values = pc.list_flatten(level).to_numpy(zero_copy_only=False)  # a null value becomes NaN
    odd = ~np.isfinite(values)  # null, or a NaN / Infinity the reader takes and JSON does not know
    if odd.any():
        value_rows = row_of[pc.list_parent_indices(level).to_numpy()]
        ok[value_rows[odd]] = False
    if closed_rings:
        ok[_rows_with_open_rings(lengths_per_level, dims, values, n)] = False
    geoms = np.full(n, None, dtype=object)
    points_xy = np.full((n, 2), np.nan)
    made = np.zeros(n, dtype=bool)
    for dim in (2, 3):
        rows = np.flatnonzero(ok & (widest == dim))
        if rows.size == 0:
            continue
        taken = coordinates.take(pa.array(rows)) if rows.size < n else coordinates
        if kind == GeometryType.POINT and dim == 2:
            points_xy[rows] = pc.list_flatten(taken).to_numpy(zero_copy_only=False).reshape(-1, 2)
            made[rows] = True
        else:
            geoms[rows] = _ragged(taken, kind, levels, dim)
            made[rows] = geoms[rows] != None  # noqa: E711 - elementwise
    return geoms, points_xy, ok & made


def _ragged(coordinates: pa.ListArray, kind: GeometryType, levels: int, dim: int) -> np.ndarray:
    offsets = []
    level = coordinates
    for _ in range(levels):
        offsets.append(np.concatenate([[0], np.cumsum(_lengths(level))]).astype(np.int64))
        level = pc.list_flatten(level)
    coords = pc.list_flatten(level).to_numpy(zero_copy_only=False).reshape(-1, dim)
    if kind == GeometryType.POINT:
        return shapely.points(coords)
    # from_ragged_array wants the innermost offsets first
    return shapely.from_ragged_array(kind, coords, tuple(reversed(offsets)))


def ndjson(docs: pa.Array) -> pa.Buffer:
    """The documents one a line, as one buffer, straight from the Arrow buffers."""
    lines = pc.binary_join_element_wise(docs.cast(pa.binary()), pa.scalar(b"\n"), pa.scalar(b""))
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)
    data = lines.buffers()[2]
    if data is None:
        return pa.py_buffer(b"")
    return data[offsets[lines.offset] : offsets[lines.offset + len(lines)]]


def _lengths(lists: pa.Array) -> np.ndarray:
    """Items of each list; -1 where the list is null (a member missing, or null)."""
    return pc.fill_null(pc.list_value_length(lists), -1).to_numpy(zero_copy_only=False).astype(np.int64)


def _rows_with_open_rings(lengths: list[np.ndarray], dims: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Rows holding a ring whose last position is not its first. `lengths` are the items per
    container level, the last level being the rings (positions per ring)."""
    ring_rows = np.arange(n)
    for level in lengths[:-1]:
        ring_rows = np.repeat(ring_rows, np.maximum(level, 0))
    ring_lengths = np.maximum(lengths[-1], 0)
    ends = np.cumsum(ring_lengths)
    rings = np.flatnonzero(ring_lengths > 0)
    first, last = (ends - ring_lengths)[rings], ends[rings] - 1
    starts = np.concatenate([[0], np.cumsum(np.maximum(dims, 0))])  # index of each position's first value
    open_ring = np.zeros(rings.size, dtype=bool)
    for axis in range(3):
        has_axis = (dims[first] > axis) & (dims[last] > axis)
        open_ring[has_axis] |= values[starts[first[has_axis]] + axis] != values[starts[last[has_axis]] + axis]
    return ring_rows[rings[open_ring]]
