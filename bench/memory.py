"""Peak memory and CPU time of a benchmark run from /proc: the driver's Python, the JVM under it and
the Python workers under the JVM (psutil would do it too; /proc is all a Linux run needs)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


class PeakMemory:
    """Peak RSS of a process (the driver's Python), of the JVM under it and of the Python workers
    under the JVM, and how far the driver grew over its size once the JVM was up, sampled every 100 ms."""

    def __init__(self, pid: int):
        self.pid = pid
        self.driver_peak = self.jvm = self.workers = 0
        self.driver_base = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def figures(self) -> dict:
        return {
            "driver_python_growth": round((self.driver_peak - self.driver_base) / 2**20),
            "jvm": round(self.jvm / 2**20),
            "python_workers": round(self.workers / 2**20),
        }

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            driver = _rss(self.pid)
            children = _children_by_parent()  # one pass over /proc per sample: the sampler shares the cores
            jvms = [p for p in _descendants(self.pid, children) if _name(p) == "java"]
            if jvms and not self.driver_base:
                self.driver_base = driver  # Spark is up: what grows from here is per batch
            self.driver_peak = max(self.driver_peak, driver)
            self.jvm = max(self.jvm, sum(_rss(p) for p in jvms))
            self.workers = max(self.workers, sum(_rss(p) for j in jvms for p in _descendants(j, children)))


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) a process and every process under it used so far: the live
    ones' own and those of the children they reaped (a maintenance run that ended, a Python worker
    Spark replaced), so the figure only grows while the tree runs."""
    children = _children_by_parent()
    ticks = 0
    for process in [pid, *_descendants(pid, children)]:
        try:
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for task in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((task / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(task.name))
    return children


def _descendants(pid: int, children: dict[int, list[int]]) -> list[int]:
    direct = children.get(pid, [])
    return direct + [d for c in direct for d in _descendants(c, children)]
