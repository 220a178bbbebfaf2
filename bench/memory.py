"""Peak memory and CPU time of a benchmark run from /proc: the driver's Python, the JVM under it and
the Python workers under the JVM (psutil would do it too; /proc is all a Linux run needs)."""

from __future__ import annotations

import os
import re
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


def processes_cpu_s(parts: dict[str, float]) -> float:
    """The CPU seconds of `tree_cpu_parts` (or a difference of two), each second once: the
    "spark_jvm thread" entries split the "spark_jvm" one."""
    return sum(seconds for part, seconds in parts.items() if " thread " not in part)


def tree_cpu_parts(pid: int) -> dict[str, float]:
    """CPU seconds (user and system) a process and every process under it used so far, by part of
    the stack: the live ones' own and those of the children they reaped (a maintenance run that
    ended, a Python worker Spark replaced), so each figure only grows while the tree runs. Parts: "driver" (the process `pid`), "spark_jvm", "iceberg_jvm"
    (the py4j JVM native-geometry tables are committed through), "python_workers" (Python under
    Spark's JVM), "maintenance" (Python under the driver), "other"; what a process reaped goes to
    "<part> reaped" (Spark's JVM reaps the Python workers it replaced, the driver its maintenance
    runs), and the Spark JVM's own time also by thread, "spark_jvm thread <name>" (digits as #; threads that ended:
    "spark_jvm thread (ended)"), which `processes_cpu_s` does not count twice."""
    children = _children_by_parent()
    parts: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")

    def add(part: str, ticks: int) -> None:
        if ticks:
            parts[part] = parts.get(part, 0.0) + ticks / tick

    def walk(process: int, under_spark: bool) -> None:
        try:
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return
        part = _part_of(process, pid, under_spark)
        add(part, int(fields[11]) + int(fields[12]))
        add(f"{part} reaped", int(fields[13]) + int(fields[14]))
        if part == "spark_jvm":
            threads = _thread_ticks(process)
            for name, ticks in threads.items():
                add(f"spark_jvm thread {name}", ticks)
            # A thread that ended leaves its time in the process's alone.
            add("spark_jvm thread (ended)", int(fields[11]) + int(fields[12]) - sum(threads.values()))
        for child in children.get(process, []):
            walk(child, under_spark or part == "spark_jvm")

    walk(pid, False)
    return parts


def _part_of(process: int, root: int, under_spark: bool) -> str:
    if process == root:
        return "driver"
    name = _name(process)
    if name == "java":
        try:
            command = Path(f"/proc/{process}/cmdline").read_bytes()
        except OSError:
            command = b""
        return "iceberg_jvm" if b"py4j.GatewayServer" in command else "spark_jvm"
    if name.startswith("python"):
        return "python_workers" if under_spark else "maintenance"
    return "other"


def _thread_ticks(process: int) -> dict[str, int]:
    """A JVM's CPU ticks by thread name, numbers in names folded ("Executor task launch worker for task #")."""
    ticks: dict[str, int] = {}
    for task in Path(f"/proc/{process}/task").glob("[0-9]*"):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            name = re.sub(r"\d+", "#", (task / "comm").read_text().strip())
        except OSError:
            continue
        ticks[name] = ticks.get(name, 0) + int(fields[11]) + int(fields[12])
    return ticks


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
