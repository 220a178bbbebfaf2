"""A clock on the geometry work whose time no size limit bounds.

GEOS's repair of an invalid polygon (make_valid) is super-linear in its vertices, and far worse on
rings that cross themselves everywhere: a 6,000-vertex polygon of 128 KB, far under every size
limit, held a batch for minutes. GEOS cannot be interrupted inside make_valid (GEOS_interruptRequest
is not checked there), so a polygon large enough to be slow is repaired in a child process that is
killed when it overruns the budget; the record is then rejected (`time_budget_exceeded`) and the
batch goes on. Smaller polygons are repaired in place, vectorized: measured on self-crossing random
rings, 64 vertices take about 5 ms at worst, 200 take 0.1 s and 800 take 2.4 s.
"""

from __future__ import annotations

import atexit
import multiprocessing
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import numpy as np
import shapely

# Polygons with more vertices than this are repaired in the child, under the clock.
INLINE_VERTICES = 64
# The child starts once per Python worker (spawn: the worker holds Arrow's threads and the JVM's
# socket, which a fork would copy); its start is not the record's time.
_START_TIMEOUT_S = 120.0


class RepairBudget:
    """make_valid ("structure") on polygons, each taking at most `seconds`."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def make_valid(self, geoms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The repaired geometries, and which ones overran the budget (None in the first array)."""
        repaired = np.full(len(geoms), None, dtype=object)
        over = np.zeros(len(geoms), dtype=bool)
        inline = shapely.get_num_coordinates(geoms) <= INLINE_VERTICES
        if inline.any():
            repaired[inline] = shapely.make_valid(geoms[inline], method="structure")
        for i in np.flatnonzero(~inline):
            wkb = _REPAIR_PROCESS.repair(shapely.to_wkb(geoms[i]), self.seconds)
            if wkb is None:
                over[i] = True
            else:
                repaired[i] = shapely.from_wkb(wkb)
        return repaired, over


class _RepairProcess:
    """The child that repairs large polygons: one per Python worker process, kept between tasks
    (Spark reuses its workers), started again after it was stopped at a budget."""

    def __init__(self) -> None:
        self._child: BaseProcess | None = None
        self._conn: Connection | None = None
        atexit.register(self.stop)

    def repair(self, wkb: bytes, seconds: float) -> bytes | None:
        conn = self._connection()
        conn.send(wkb)
        if conn.poll(seconds):
            status, answer = conn.recv()
            if status == "ok":
                return answer
            raise RuntimeError(f"repairing a polygon failed in the repair process: {answer}")
        self.stop()  # still at it: the only way to stop GEOS is to end its process
        return None

    def stop(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.join()
        self._child, self._conn = None, None

    def _connection(self) -> Connection:
        if self._conn is None or self._child is None or not self._child.is_alive():
            self.stop()
            ours, theirs = multiprocessing.Pipe()
            child = multiprocessing.get_context("spawn").Process(
                target=_serve, args=(theirs,), name="geoingest-repair", daemon=True
            )
            child.start()
            theirs.close()
            if not ours.poll(_START_TIMEOUT_S):
                child.kill()
                raise RuntimeError(f"the repair process did not start within {_START_TIMEOUT_S:.0f} s")
            ours.recv()
            self._child, self._conn = child, ours
        return self._conn


_REPAIR_PROCESS = _RepairProcess()


def _serve(conn: Connection) -> None:
    conn.send("ready")
    while True:
        try:
            wkb = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", shapely.to_wkb(shapely.make_valid(shapely.from_wkb(wkb), method="structure"))))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which names the record
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
