import numpy as np
import pytest

from streaming.kernels.geohash import cell_count, covering_cells, enclosing_cells, geohash, prefix_cells


def test_points_get_the_published_geohashes():
    # Gustavo Niemeyer's examples: Jutland and the one on Wikipedia's geohash page.
    lon = np.array([10.40744, -5.6, 0.0])
    lat = np.array([57.64911, 42.6, 0.0])
    assert geohash(lon, lat, 11).tolist()[:1] == ["u4pruydqqvj"]
    assert geohash(lon, lat, 5).tolist() == ["u4pru", "ezs42", "s0000"]


def test_a_small_bbox_gets_its_full_cell_a_crossing_one_a_shorter_cell():
    xmin = np.array([-5.6, -5.6, -1.0, -179.0])
    ymin = np.array([42.6, 42.6, -1.0, -89.0])
    xmax = np.array([-5.6, -5.59, 1.0, 179.0])
    ymax = np.array([42.6, 42.61, 1.0, 89.0])
    # a point; a 1 km box inside "ezs4"; a box across the equator and the prime meridian; the world
    assert enclosing_cells(xmin, ymin, xmax, ymax, 4).tolist() == ["ezs4", "ezs4", "", ""]
    assert enclosing_cells(xmin, ymin, xmax, ymax, 2).tolist() == ["ez", "ez", "", ""]


def test_cells_are_few_strings_for_many_rows():
    lon = np.repeat([2.35, 13.4], 50_000)
    lat = np.repeat([48.85, 52.52], 50_000)
    cells = enclosing_cells(lon, lat, lon, lat, 3)
    assert set(cells.tolist()) == {"u09", "u33"}


def test_the_cover_of_a_window_holds_every_cell_a_touching_bbox_can_have():
    rng = np.random.default_rng(7)
    window = (2.0, 48.0, 3.0, 49.5)
    cover = set(covering_cells(window, 3))
    x0 = rng.uniform(-20, 20, 20_000)
    y0 = rng.uniform(30, 70, 20_000)
    w = rng.exponential(2.0, 20_000)
    x1, y1 = x0 + w, y0 + w / 2
    touching = (x0 <= window[2]) & (x1 >= window[0]) & (y0 <= window[3]) & (y1 >= window[1])
    cells = enclosing_cells(x0, y0, x1, y1, 3)
    assert touching.sum() > 100
    assert set(cells[touching].tolist()) <= cover
    # and it is not the whole world: most rows' cells are outside it
    assert np.isin(cells, list(cover)).mean() < 0.2


def test_a_large_window_is_covered_at_a_shorter_precision():
    window = (-10.0, 35.0, 30.0, 60.0)
    assert cell_count(window, 3) > 64
    prefixes = prefix_cells(window, 3, max_cells=64)
    assert prefixes and all(len(p) < 3 for p in prefixes)
    assert set(prefixes) <= set(covering_cells(window, 3, max_cells=64))
    assert prefix_cells((2.0, 48.0, 2.1, 48.1), 3) == []
    assert covering_cells((2.0, 48.0, 2.1, 48.1), 3) == ["", "u", "u0", "u09"]


@pytest.mark.parametrize("precision", [0, 13, True, 2.5])
def test_a_precision_out_of_range_is_refused(precision):
    with pytest.raises(ValueError, match="precision"):
        geohash(np.array([0.0]), np.array([0.0]), precision)


def test_a_box_wrapped_across_the_antimeridian_lies_in_the_world_cell_alone():
    # (179.5 .. -179.5) and (10 .. 5, nearly the whole world) both wrap: no geohash cell holds them.
    cells = enclosing_cells(
        np.array([179.5, 10.0, 2.0]),
        np.array([0.0, 0.0, 48.0]),
        np.array([-179.5, 5.0, 2.1]),
        np.array([1.0, 1.0, 48.1]),
        3,
    )
    assert cells.tolist() == ["", "", "u09"]
