"""The anti-meridian kernels on hard-coded geometries and boxes."""

from __future__ import annotations

import numpy as np
import shapely
import shapely.affinity

from streaming.kernels.antimeridian import (
    centre_x,
    covering_arcs,
    short_way_bounds,
    split_at_antimeridian,
    union_x,
    unwrap_paths,
    window_intervals,
    x_overlaps,
)


def test_unwrap_paths_joins_the_short_way_and_keeps_paths_apart():
    x = np.array([179.5, -179.5, -179.0, 10.0, 20.0, -180.0, 180.0])
    path = np.array([0, 0, 0, 1, 1, 2, 2])
    xu, cut = unwrap_paths(x, path)
    np.testing.assert_allclose(xu, [179.5, 180.5, 181.0, 10.0, 20.0, -180.0, 180.0])
    assert cut.tolist() == [False, True, False, False, False, False, False]


def test_bounds_of_geometries_across_the_antimeridian():
    geoms = np.array(
        [
            shapely.LineString([(179.5, 0), (-179.5, 1)]),
            shapely.Point(10, 10),
            shapely.Polygon([(170, 60), (-170, 60), (-170, 70), (170, 70)]),
            shapely.box(-180, 80, 180, 90),  # a polar cap drawn along ±180: plain
            shapely.MultiLineString([[(179, 0), (-179, 0)], [(170, 5), (175, 5)]]),
            shapely.LineString([(0, 0), (90, 0), (180, 0), (-90, 0), (0, 1)]),  # round the world
            shapely.LineString([(179.5, 0), (-180, 0)]),  # ends on the anti-meridian
            shapely.LineString([(-100, 0), (-10, 0), (100, 0)]),  # wide, no long edge: plain
        ],
        dtype=object,
    )
    bounds, crosses = short_way_bounds(geoms)
    np.testing.assert_allclose(
        bounds,
        [
            [179.5, 0, -179.5, 1],
            [10, 10, 10, 10],
            [170, 60, -170, 70],
            [-180, 80, 180, 90],
            [170, 0, -179, 5],
            [-180, 0, 180, 1],
            [179.5, 0, 180, 0],
            [-100, 0, 100, 0],
        ],
    )
    assert crosses.tolist() == [True, False, True, False, True, True, True, False]


def test_split_cuts_at_180_and_leaves_the_rest():
    line = shapely.LineString([(179.5, 0), (-179.5, 1)])
    ring = shapely.Polygon(
        [(170, -20), (-170, -20), (-170, 20), (170, 20)], [[(178, -1), (-178, -1), (-178, 1), (178, 1)]]
    )
    plain = shapely.LineString([(0, 0), (1, 1)])
    split = split_at_antimeridian(np.array([line, ring, plain], dtype=object))
    assert split[0].equals(shapely.MultiLineString([[(179.5, 0), (180, 0.5)], [(-180, 0.5), (-179.5, 1)]]))
    # 10 x 40 degrees on each side, less a 2 x 2 hole cut in two
    assert split[1].area == 792
    assert split[1].bounds == (-180, -20, 180, 20)
    inside = shapely.points([(175, 0), (-175, 0), (179.5, 10)])
    outside = shapely.points([(179, 0), (-179, 0), (0, 0)])
    assert shapely.contains(split[1], inside).all() and not shapely.intersects(split[1], outside).any()
    assert split[2] is plain
    # The short-way line is nowhere near longitude 0; the planar one would cross it.
    window = shapely.box(0, -5, 10, 5)
    assert not shapely.intersects(split[0], window) and shapely.intersects(line, window)


def test_wrapped_boxes_centre_overlap_and_union():
    np.testing.assert_allclose(
        centre_x(np.array([179.5, 0.0, 170.0]), np.array([-179.5, 10.0, -150.0])), [180, 5, -170]
    )
    xmin = np.array([179.0, 10.0, 170.0, 170.0])
    xmax = np.array([-179.0, 20.0, -170.0, -170.0])
    assert x_overlaps(xmin, xmax, 179.5, 180).tolist() == [True, False, True, True]
    assert x_overlaps(xmin, xmax, -180, -179.5).tolist() == [True, False, True, True]
    assert x_overlaps(xmin, xmax, 0, 10).tolist() == [False, True, False, False]
    assert window_intervals(179, -179) == [(179, 180), (-180, -179)]
    assert window_intervals(-1, 1) == [(-1, 1)]
    assert union_x(np.array([179.0, -179.5]), np.array([-179.0, -178.0])) == (179.0, -178.0)
    assert union_x(np.array([10.0, 20.0]), np.array([15.0, 25.0])) == (10.0, 25.0)
    assert union_x(np.array([170.0, -10.0]), np.array([160.0, -20.0])) == (-180.0, 180.0)


def test_covering_arcs_per_group():
    lo, hi = covering_arcs(
        np.array([-10.0, 170.0, 100.0, 175.0, -178.0]),
        np.array([10.0, 180.0, 120.0, 185.0, -170.0]),
        np.array([0, 0, 1, 2, 2]),
        4,
    )
    np.testing.assert_allclose(lo[:3], [-10, 100, 175])
    np.testing.assert_allclose(hi[:3], [180, 120, -170])
    assert np.isnan(lo[3]) and np.isnan(hi[3])


def test_hilbert_key_of_a_wrapped_box_is_that_of_its_centre():
    from streaming.kernels.hilbert import hilbert_keys_of_bounds

    world = (-180.0, -90.0, 180.0, 90.0)
    wrapped = hilbert_keys_of_bounds(np.array([170.0]), np.array([0.0]), np.array([-150.0]), np.array([0.0]), world, 16)
    centre = hilbert_keys_of_bounds(np.array([-170.0]), np.array([0.0]), np.array([-170.0]), np.array([0.0]), world, 16)
    assert wrapped.tolist() == centre.tolist()


def test_unwrapped_shapes_meet_a_window_or_its_turns():
    from streaming.kernels.antimeridian import unwrapped

    line = shapely.LineString([(179.5, 0), (-179.5, 1)])
    shapes, crosses = unwrapped(np.array([line, shapely.Point(3, 4)], dtype=object))
    assert crosses.tolist() == [True, False]
    assert shapes[0].equals(shapely.LineString([(179.5, 0), (180.5, 1)]))
    assert shapes[1].equals(shapely.Point(3, 4))
    west = shapely.box(-180, -1, -179.6, 2)  # meets the line only a turn east, at 180.4 to 180.5
    assert not shapely.intersects(west, shapes[0])
    assert shapely.intersects(shapely.affinity.translate(west, 360), shapes[0])
