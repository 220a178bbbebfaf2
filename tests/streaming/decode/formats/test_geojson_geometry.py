"""The vectorised GeoJSON geometry reader: what it reads equals what GEOS reads, and whatever is
not plainly well formed it leaves to GEOS rather than deciding about it."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.decode.formats.geojson_geometry import read_geometries

WELL_FORMED = [
    "POINT (2.35 48.86)",
    "POINT Z (2.35 48.86 35)",
    "LINESTRING (0 0, 1 1, 2 0)",
    "LINESTRING Z (0 0 1, 1 1 2)",
    "POLYGON ((0 0, 1 0, 1 1, 0 1, 0 0), (0.2 0.2, 0.4 0.2, 0.4 0.4, 0.2 0.2))",
    "MULTIPOINT ((1 2), (3 4))",
    "MULTIPOINT Z ((1 2 3))",
    "MULTILINESTRING ((0 0, 1 1), (2 2, 3 3, 4 4))",
    "MULTIPOLYGON (((0 0, 1 0, 1 1, 0 0)), ((5 5, 6 5, 6 6, 5 5), (5.1 5.1, 5.2 5.1, 5.2 5.2, 5.1 5.1)))",
]

LEFT_TO_GEOS = {
    "open ring": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1]]]},
    "ring of three": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [0, 0]]]},
    "line of one position": {"type": "LineString", "coordinates": [[0, 0]]},
    "mixed dimensions": {"type": "LineString", "coordinates": [[0, 0, 1], [1, 1]]},
    "null ordinate": {"type": "Point", "coordinates": [None, 1]},
    "four ordinates": {"type": "Point", "coordinates": [1, 2, 3, 4]},
    "one ordinate": {"type": "Point", "coordinates": [1]},
    "empty point": {"type": "Point", "coordinates": []},
    "nested too deep for a point": {"type": "Point", "coordinates": [[1, 2]]},
    "empty multipolygon": {"type": "MultiPolygon", "coordinates": []},
    "polygon with an empty ring": {"type": "Polygon", "coordinates": [[]]},
    "no coordinates": {"type": "Point"},
    "null coordinates": {"type": "Point", "coordinates": None},
    "coordinates as text": {"type": "Point", "coordinates": "1,2"},
    "collection": {"type": "GeometryCollection", "geometries": [{"type": "Point", "coordinates": [1, 2]}]},
}


def feature(geometry) -> str:
    return json.dumps({"type": "Feature", "id": "x", "geometry": geometry, "properties": {"kind": "ping"}})


def read(docs: list[str], types: list[str | None]):
    """Geometries read, the plain 2D points made geometries to compare with GEOS's."""
    got = read_geometries(pa.array(docs, pa.string()), np.array(types, dtype=object))
    geoms = got.geoms.copy()
    geoms[got.plain] = shapely.points(got.points_xy[got.plain])
    return geoms, got.read


def test_2d_points_come_back_as_numbers_and_the_rest_as_geometries():
    docs = [
        feature({"type": "Point", "coordinates": [2.35, 48.86]}),
        feature({"type": "Point", "coordinates": [2.35, 48.86, 35]}),
        feature({"type": "LineString", "coordinates": [[0, 0], [1, 1]]}),
        feature({"type": "Point", "coordinates": [1, 2, 3, 4]}),
    ]
    got = read_geometries(
        pa.array(docs, pa.string()), np.array(["Point", "Point", "LineString", "Point"], dtype=object)
    )
    assert got.read.tolist() == [True, True, True, False]
    assert got.plain.tolist() == [True, False, False, False]
    assert got.points_xy[0].tolist() == [2.35, 48.86]
    assert got.geoms[0] is None and got.geoms[3] is None
    assert shapely.equals_exact(got.geoms[1], shapely.Point(2.35, 48.86, 35), tolerance=0)
    assert shapely.has_z(got.geoms[1])


def test_reads_every_simple_type_as_geos_does():
    geoms = [shapely.from_wkt(w) for w in WELL_FORMED]
    docs = [feature(json.loads(shapely.to_geojson(g))) for g in geoms]
    out, was_read = read(docs, [g.geom_type for g in geoms])
    assert was_read.all()
    for got, expected in zip(out, geoms):
        assert shapely.equals_exact(got, expected, tolerance=0), (got, expected)
        assert shapely.has_z(got) == shapely.has_z(expected)


@pytest.mark.parametrize("name", sorted(LEFT_TO_GEOS))
def test_leaves_what_is_not_plainly_well_formed_to_geos(name):
    geometry = LEFT_TO_GEOS[name]
    out, was_read = read(
        [feature({"type": "Point", "coordinates": [1, 2]}), feature(geometry)], ["Point", geometry["type"]]
    )
    assert was_read.tolist() == [True, False]
    assert out[1] is None
    assert shapely.equals(out[0], shapely.Point(1, 2))


def test_one_odd_document_does_not_stop_its_block():
    docs = [feature({"type": "Point", "coordinates": [i, i]}) for i in range(50)]
    docs[17] = feature({"type": "Point", "coordinates": [[1, 2]]})  # the block reader refuses this shape
    docs[33] = feature({"type": "Point", "coordinates": "x"})
    out, was_read = read(docs, ["Point"] * 50)
    assert np.flatnonzero(~was_read).tolist() == [17, 33]
    assert [p.x for p in out[was_read]] == [i for i in range(50) if i not in (17, 33)]


def test_unknown_types_are_left_alone():
    out, was_read = read(
        [feature({"type": "Feature", "geometry": None}), feature({"type": "Point", "coordinates": [1, 2]})],
        [None, "Point"],
    )
    assert was_read.tolist() == [False, True]


coordinate = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@st.composite
def geojson_geometries(draw):
    dims = draw(st.sampled_from([2, 3]))
    position = st.lists(coordinate, min_size=dims, max_size=dims)
    kind = draw(st.sampled_from(["Point", "LineString", "Polygon", "MultiPoint", "MultiLineString", "MultiPolygon"]))

    def ring():
        points = draw(st.lists(position, min_size=3, max_size=6))
        return points + [points[0]]

    def line():
        return draw(st.lists(position, min_size=2, max_size=6))

    if kind == "Point":
        coords = draw(position)
    elif kind == "LineString":
        coords = line()
    elif kind == "MultiPoint":
        coords = draw(st.lists(position, min_size=1, max_size=5))
    elif kind == "Polygon":
        coords = [ring() for _ in range(draw(st.integers(1, 3)))]
    elif kind == "MultiLineString":
        coords = [line() for _ in range(draw(st.integers(1, 3)))]
    else:
        coords = [[ring() for _ in range(draw(st.integers(1, 2)))] for _ in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):  # damage: GEOS decides, this reader must step aside or agree with it
        coords = draw(st.sampled_from([[], [coords], coords[:1], None, [coords, coords]]))
    return {"type": kind, "coordinates": coords}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(geojson_geometries(), min_size=1, max_size=12))
def test_whatever_it_reads_equals_what_geos_reads(geometries):
    docs = [feature(g) for g in geometries]
    out, was_read = read(docs, [g["type"] for g in geometries])
    for doc, got, was in zip(docs, out, was_read):
        if not was:
            continue
        expected = shapely.from_geojson(json.dumps(json.loads(doc)["geometry"]))
        assert shapely.equals_exact(got, expected, tolerance=0), (doc, got, expected)
        assert shapely.has_z(got) == shapely.has_z(expected)
