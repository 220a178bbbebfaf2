import numpy as np
import pytest

from streaming.kernels.hilbert import grid_cells, hilbert_distance, hilbert_keys_of_bounds


def test_order_one_visits_the_four_quadrants_in_u_shape():
    ix = np.array([0, 0, 1, 1])
    iy = np.array([0, 1, 1, 0])
    assert hilbert_distance(ix, iy, 1).tolist() == [0, 1, 2, 3]


def test_order_two_matches_the_published_curve():
    # The 4x4 Hilbert curve, distance by (x, y), as drawn in Hilbert's 1891 figure.
    expected = {
        (0, 0): 0,
        (1, 0): 1,
        (1, 1): 2,
        (0, 1): 3,
        (0, 2): 4,
        (0, 3): 5,
        (1, 3): 6,
        (1, 2): 7,
        (2, 2): 8,
        (2, 3): 9,
        (3, 3): 10,
        (3, 2): 11,
        (3, 1): 12,
        (2, 1): 13,
        (2, 0): 14,
        (3, 0): 15,
    }
    cells = np.array(list(expected))
    assert hilbert_distance(cells[:, 0], cells[:, 1], 2).tolist() == list(expected.values())


@pytest.mark.parametrize("bits", [3, 8, 16])
def test_is_a_bijection_with_unit_steps(bits):
    side = 1 << min(bits, 8)
    if bits > 8:  # check a dense patch of the full-order curve
        xs, ys = np.meshgrid(np.arange(side), np.arange(side))
    else:
        xs, ys = np.meshgrid(np.arange(1 << bits), np.arange(1 << bits))
    d = hilbert_distance(xs.ravel(), ys.ravel(), bits)
    assert len(np.unique(d)) == d.size
    if bits <= 8:
        order = np.argsort(d)
        steps = np.abs(np.diff(xs.ravel()[order])) + np.abs(np.diff(ys.ravel()[order]))
        assert np.all(steps == 1), "consecutive keys must be neighbouring cells"


def test_grid_cells_clamp_and_scale():
    ix, iy = grid_cells(
        np.array([-180.0, 180.0, 0.0, 999.0]), np.array([-90.0, 90.0, 0.0, -999.0]), (-180.0, -90.0, 180.0, 90.0), 2
    )
    assert ix.tolist() == [0, 3, 2, 3]
    assert iy.tolist() == [0, 3, 2, 0]


def test_keys_of_bounds_use_the_centre():
    keys = hilbert_keys_of_bounds(
        np.array([0.0]), np.array([0.0]), np.array([2.0]), np.array([2.0]), (0.0, 0.0, 4.0, 4.0), 2
    )
    # centre (1, 1) lies in cell (1, 1), distance 2 on the order-2 curve
    assert keys.tolist() == [2]


def test_rejects_cells_off_the_grid():
    with pytest.raises(ValueError, match="grid cells"):
        hilbert_distance(np.array([4]), np.array([0]), 2)


def xy2d(x: int, y: int, bits: int) -> int:
    """The textbook walk, one cell at a time: the reference the vectorised kernel must match."""
    side, d, s = 1 << bits, 0, 1 << (bits - 1)
    while s > 0:
        rx, ry = int(x & s > 0), int(y & s > 0)
        d += s * s * ((3 * rx) ^ ry)
        if ry == 0:
            if rx == 1:
                x, y = side - 1 - x, side - 1 - y
            x, y = y, x
        s >>= 1
    return d


@pytest.mark.parametrize("bits", [5, 8, 9, 13, 16, 31])
def test_matches_the_textbook_walk_at_any_order(bits):
    rng = np.random.default_rng(bits)
    x, y = rng.integers(0, 1 << bits, 300), rng.integers(0, 1 << bits, 300)
    assert hilbert_distance(x, y, bits).tolist() == [xy2d(int(a), int(b), bits) for a, b in zip(x, y)]
