"""WGS84 bounds of rasters (Havasu's raster bounds) on hard-coded scenes: UTM zones either side
of ±180, one across it, polar stereographic scenes on and off a pole. The expected values are
pyproj's transform_bounds, densified finely, which the test also runs."""

from __future__ import annotations

import numpy as np
import pytest
from pyproj import Transformer

from streaming.kernels.raster_bounds import envelope_rings, wgs84_bounds

SCENES = [  # epsg, affine (a, b, c, d, e, f), width, height, expected bounds
    (32660, (300, 0, 600000, 0, -300, 5300000), 1000, 1000, (178.272, 45.0404, -177.6649, 47.8456)),
    (32660, (30, 0, 300000, 0, -30, 5300000), 1000, 1000, (174.3279, 47.5526, 174.7401, 47.8309)),
    (32601, (300, 0, 300000, 0, -300, 5300000), 1000, 1000, (-179.6721, 45.1252, -175.6634, 47.8533)),
    (3413, (2000, 0, -1000000, 0, -2000, 1000000), 1000, 1000, (-180.0, 76.9988, 180.0, 90.0)),
    (3413, (1000, 0, 500000, 0, -1000, -500000), 1000, 1000, (-26.5651, 70.5976, 26.5651, 83.4793)),
    (3031, (2000, 0, -1000000, 0, -2000, 1000000), 1000, 1000, (-180.0, -90.0, 180.0, -77.0374)),
]


@pytest.mark.parametrize("epsg, transform, width, height, expected", SCENES)
def test_bounds_agree_with_densified_transform_bounds(epsg, transform, width, height, expected):
    bounds = wgs84_bounds(np.array([transform]), np.array([width]), np.array([height]), epsg)[0]
    np.testing.assert_allclose(bounds, expected, atol=1e-4)
    a, _, c, _, e, f = transform
    to_wgs84 = Transformer.from_crs(f"EPSG:{epsg}", "EPSG:4326", always_xy=True)
    reference = to_wgs84.transform_bounds(c, f + e * height, c + a * width, f, densify_pts=2001)
    np.testing.assert_allclose(bounds, reference, atol=1e-7)
    # inclusive: never inside what 21 points an edge find
    coarse = to_wgs84.transform_bounds(c, f + e * height, c + a * width, f, densify_pts=21)
    tol = 1e-9
    assert bounds[1] <= coarse[1] + tol and bounds[3] >= coarse[3] - tol
    if bounds[0] <= bounds[2]:
        assert bounds[0] <= coarse[0] + tol and bounds[2] >= coarse[2] - tol


def test_an_extreme_between_densified_points_is_found():
    """A polar stereographic scene off the pole: its edge's point nearest the pole lies half-way
    between two of the 21 points an edge, 0.003° further south than either."""
    crs = "+proj=stere +lat_0=-90 +lat_ts=-65 +lon_0=180 +datum=WGS84 +units=m"
    transform, width, height = (4000.0, 0, -700_000.0, 0, -4000.0, -500_000.0), 300, 200
    bounds = wgs84_bounds(np.array([transform]), np.array([width]), np.array([height]), crs)[0]
    _, nearest = Transformer.from_crs(crs, "EPSG:4326", always_xy=True).transform(0.0, -500_000.0)
    assert bounds[1] == pytest.approx(nearest, abs=1e-7)
    coarse = Transformer.from_crs(crs, "EPSG:4326", always_xy=True).transform_bounds(
        -700_000.0, -1_300_000.0, 500_000.0, -500_000.0, densify_pts=21
    )
    assert coarse[1] - bounds[1] > 5e-4


def test_many_rasters_of_one_crs_in_one_call():
    utm60 = [s for s in SCENES if s[0] == 32660]
    bounds = wgs84_bounds(np.array([s[1] for s in utm60]), np.array([1000, 1000]), np.array([1000, 1000]), 32660)
    np.testing.assert_allclose(bounds, [s[4] for s in utm60], atol=1e-4)
    assert bounds[0, 0] > bounds[0, 2], "the scene across ±180 is wrapped"


def test_envelope_outline_follows_the_pixel_grid():
    ring = envelope_rings(np.array([(10, 0, 100, 0, -10, 50)]), np.array([2]), np.array([3]), points=3)[0]
    np.testing.assert_allclose(
        ring, [(100, 50), (110, 50), (120, 50), (120, 35), (120, 20), (110, 20), (100, 20), (100, 35)]
    )
