"""Event time to visible (streaming/write/freshness.py), on hard-coded values."""

from __future__ import annotations

import numpy as np
import pytest

from streaming.write.freshness import BIN_MS, MAX_BINS, EventTimes, ages_at


def test_events_are_counted_in_bins_of_their_timestamps():
    times = EventTimes()
    times.add(np.array([1_000, 1_050, 1_099, 1_100, 2_345]))
    times.add(np.array([1_001]))
    assert times.bins() == [(1_000, BIN_MS, 4), (1_100, BIN_MS, 1), (2_300, BIN_MS, 1)]


def test_a_backlog_spread_over_too_many_bins_gets_wider_ones_and_keeps_every_event():
    times = EventTimes()
    spread = np.arange(0, (MAX_BINS + 1) * BIN_MS, BIN_MS)  # one event per bin, one bin too many
    times.add(spread)
    bins = times.bins()
    assert times.width_ms == 2 * BIN_MS and len(bins) <= MAX_BINS
    assert sum(n for _, _, n in bins) == spread.size
    assert all(start <= t < start + width for t, (start, width, _) in zip(spread[::2], bins))


def test_ages_are_taken_from_the_middle_of_each_bin_and_never_negative():
    ages, counts = ages_at(10.0, [(9_000, 100, 3), (10_000, 200, 2)])
    assert ages.tolist() == pytest.approx([0.95, 0.0]) and counts.tolist() == [3, 2]
