"""How old each event is when the commit that makes it visible lands.

A task counts the Kafka timestamps of the events it read in bins (`EventTimes`) and returns the
bins with its tallies; the driver, once the batch has committed, turns each bin into an age (commit
time minus the bin's middle) with its count. Every event is counted, not only the oldest of each
partition, at the cost of a few hundred numbers per task.
"""

from __future__ import annotations

import numpy as np

BIN_MS = 100
# Events that spread over more bins than this (a backlog of old events) get wider bins.
MAX_BINS = 2048


class EventTimes:
    """Kafka timestamps (ms) counted in bins of `width_ms`, which doubles whenever the bins
    would exceed MAX_BINS."""

    def __init__(self) -> None:
        self.width_ms = BIN_MS
        self._counts: dict[int, int] = {}

    def add(self, timestamps_ms: np.ndarray) -> None:
        if timestamps_ms.size == 0:
            return
        bins, counts = np.unique(timestamps_ms // self.width_ms, return_counts=True)
        for b, n in zip(bins.tolist(), counts.tolist()):
            self._counts[b] = self._counts.get(b, 0) + n
        while len(self._counts) > MAX_BINS:
            self.width_ms *= 2
            wider: dict[int, int] = {}
            for b, n in self._counts.items():
                wider[b // 2] = wider.get(b // 2, 0) + n
            self._counts = wider

    def bins(self) -> list[tuple[int, int, int]]:
        """(first ms of the bin, its width in ms, events in it)."""
        return [(b * self.width_ms, self.width_ms, n) for b, n in sorted(self._counts.items())]


def ages_at(commit_s: float, bins: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(age in seconds of each bin's middle at `commit_s`, never negative; events in each)."""
    if not bins:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    start, width, n = (np.array(column, dtype=np.float64) for column in zip(*bins))
    return np.maximum(0.0, commit_s - (start + width / 2) / 1000), n.astype(np.int64)
