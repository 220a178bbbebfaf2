"""The clock on geometry repair (streaming/decode/budget.py): no record holds a batch for longer than
`max_record_seconds`, whatever its shape (the decoder's reject: test_decode.py's reason cases)."""

from __future__ import annotations

import time

import numpy as np
import shapely

from streaming.decode.budget import INLINE_VERTICES, RepairBudget
from tests.streaming.decode.test_decoder import self_crossing_ring


def bowtie(dx: float = 0.0) -> shapely.Polygon:
    return shapely.Polygon([(dx, 0), (dx + 1, 1), (dx + 1, 0), (dx, 1), (dx, 0)])


def test_a_polygon_slower_to_repair_than_the_budget_is_given_up_and_the_next_ones_are_repaired():
    budget = RepairBudget(seconds=0.5)
    # 2,000 crossing vertices take GEOS far longer than 0.5 s (800 took 2.4 s here).
    slow = shapely.Polygon(self_crossing_ring(2_000))
    ring = np.array([(np.cos(a), np.sin(a)) for a in np.linspace(0, 2 * np.pi, INLINE_VERTICES * 2)])
    big_but_quick = shapely.Polygon(np.vstack([ring, [[0, 0]], ring[:1]]))  # a spike: invalid, easy
    geoms = np.array([bowtie(), slow, big_but_quick, bowtie(5)], dtype=object)
    started = time.monotonic()
    repaired, over = budget.make_valid(geoms)
    elapsed = time.monotonic() - started
    assert over.tolist() == [False, True, False, False]
    assert repaired[1] is None and all(shapely.is_valid(g) for g in repaired[[0, 2, 3]])
    # The repair process's start (once per worker) plus the budget, not GEOS's minutes.
    assert elapsed < 30
