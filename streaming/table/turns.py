"""Commit turns: the writers of one service commit to its table one at a time.

Commits are optimistic: each reads the table, builds its snapshot and swaps the metadata pointer,
and loses to any commit that lands in between. A service's ingest commits a batch every second
or so; its maintenance, in a thread or a child process beside it, reads every manifest of the
table before its commit, which on a loaded machine takes longer than the gap between two batches.
Left to optimism, such a compaction loses every retry and gives up, run after run, while small
files pile up (measured: all 4 compaction runs gave up, 20 conflicts, in 57 s of ingest at
trigger 0 s, 51 batches, two test workers on 2 cores). Taking turns on one lock, neither loses to the other; writers outside
the service (another maintainer, another service) still meet the retries.

A turn is waited for at most `wait_s`: a holder stopped without releasing the lock (a child
killed mid-commit) costs each commit that wait, and the commit then goes ahead on optimism alone,
as without turns; `renew` gives a fresh lock to the next child.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("geoingest.commit")

TURN_WAIT_S = 30.0


class CommitTurns:
    """One lock over the commits to a table of the writers one service runs: its ingest committer
    and its maintenance runs (passed to their child process as it is started)."""

    def __init__(self, wait_s: float = TURN_WAIT_S):
        self.wait_s = wait_s
        self.lock: Any = multiprocessing.get_context("spawn").Lock()

    def renew(self) -> None:
        """A fresh lock, for a child that replaces one that may have died holding the old."""
        self.lock = multiprocessing.get_context("spawn").Lock()

    @contextmanager
    def turn(self, what: str) -> Iterator[None]:
        lock = self.lock
        held = lock.acquire(timeout=self.wait_s)
        if not held:
            log.warning(
                "no commit turn within the wait; committing without one",
                extra={"summary": {"commit": what, "wait_s": self.wait_s}},
            )
        try:
            yield
        finally:
            if held:
                lock.release()


@contextmanager
def no_turn(what: str) -> Iterator[None]:
    """A writer alone in its service (the `geoingest table` commands): optimism alone."""
    yield
