"""When and where the service maintains its table (what maintenance does is
streaming/maintenance/maintain.py's).

`maintenance_mode`:

- "beside" (default): a child process of the service runs `maintain()` on the schedule below,
  concurrently with ingest, never in front of a micro-batch. A process rather than a thread of the
  driver: the driver's commit and Spark's planning are Python and need the GIL, and maintenance's
  metadata work (manifests, Avro) holds it too; a process also has a nice value of its own
  (`maintenance_nice`). Its CPU use is bounded by `maintenance_cpu_percent` of one core (CpuBudget:
  it sleeps at every file it reads or deletes, and after a run, until it is within its share; its
  Arrow work on one thread), so it cannot starve ingest on a small pod.
- "between-batches": the driver runs it after a batch commits, the next batch waiting for it.
- "background": a thread of the service runs it beside ingest (in the driver's process and GIL).
- "off": nothing in the service (`geoingest table maintain`, or the chart's CronJob).

Schedule, in every mode: all steps every `maintenance_interval_s`, all but orphans after every
`maintenance_interval_commits` committed batches, those at least `maintenance_min_gap_s` after the
previous run. Ingest commits and maintenance commits interleave
on the catalog with each side's optimistic retry (streaming/table/commit.py, maintenance/commits.py);
the table's maintenance lease keeps one maintainer at a time.

Stopping: the service asks the child to stop (SIGTERM) when it stops. The child abandons a
compaction at its next file (its new files deleted, none committed), or finishes the commit or
deletion it is in, releases the lease and exits. Killed outright, it leaves what a `kill -9` of
`geoingest table maintain` leaves: the table readable with every row once, orphans for the orphan
step, and a lease the next maintainer on this host takes over at once (holder_is_gone).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from pyiceberg.table import Table

from app.metrics import MaintenanceMetrics
from app.settings import Settings
from streaming.maintenance.commits import MaintenanceGaveUp, Progress, no_progress
from streaming.maintenance.maintain import MaintenanceReport, data_manifest_count, maintain
from streaming.maintenance.plan import MaintenancePolicy, parse_steps
from streaming.table.catalog import open_catalog
from streaming.table.turns import CommitTurns, no_turn

if TYPE_CHECKING:
    from streaming.job.processor import BatchReport

log = logging.getLogger("geoingest.service")

MAINTENANCE_MODES = ("beside", "between-batches", "background", "off")


@dataclass(frozen=True)
class RunResult:
    """One maintenance run as the metrics see it: a report, or why there is none."""

    report: MaintenanceReport | None
    failure: str | None = None  # "gave_up" or "failed"
    conflicts: int = 0
    snapshots: int = 0
    data_manifests: int = 0
    cpu_s: float = 0.0  # CPU time the run took (the child's whole process in "beside")
    paced_s: float = 0.0  # time it slept to stay within maintenance_cpu_percent


class Abandoned(Exception):
    """The service is stopping: the run stops at its next file (maintain releases the lease)."""


class CpuBudget:
    """At most `share` of one core over a run: `pace()` sleeps until the process's CPU time since
    `start()` is at most `share` of the wall time since. Called at every file a step reads or
    deletes, and once after the run, so a run's average stays within its share."""

    def __init__(
        self,
        share: float,
        cpu: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not 0 < share <= 1:
            raise ValueError(f"a CPU share of {share:g}: expected more than 0 and at most 1")
        self.share, self.cpu, self.clock, self.sleep = share, cpu, clock, sleep
        self.start()

    def start(self) -> None:
        self._cpu0, self._wall0 = self.cpu(), self.clock()
        self.slept = 0.0

    def owed(self) -> float:
        return (self.cpu() - self._cpu0) / self.share - (self.clock() - self._wall0)

    def pace(self) -> None:
        owed = self.owed()
        if owed > 0 and self.share < 1:
            self.sleep(owed)
            self.slept += owed


class MaintenanceRunner:
    """Table maintenance for the service and `geoingest table maintain --every`: all steps every
    `maintenance_interval_s`, and in the service all but orphans after every
    `maintenance_interval_commits` committed batches; after a batch (`after_batch`, an observer) or
    on its own thread (`start`, woken by the batch count), which runs it in this process
    ("background") or hands it to a child process ("beside"). Its own catalog connection, so it
    never shares a table object with the committer. A failed run is logged and counted, never
    raised into ingest (unless `raise_errors`); a run another maintainer's lease skips is logged
    and counted."""

    def __init__(
        self,
        settings: Settings,
        table_name: str,
        metrics: MaintenanceMetrics | None = None,
        raise_errors: bool = False,
        turns: CommitTurns | None = None,
        shared_child: MaintenanceChild | None = None,
    ):
        if settings.maintenance_mode not in MAINTENANCE_MODES:
            raise ValueError(f"maintenance_mode: {settings.maintenance_mode!r} is not one of {list(MAINTENANCE_MODES)}")
        self.settings = settings
        self.table_name = table_name
        self.policy = MaintenancePolicy.from_settings(settings)
        self.steps = parse_steps(settings.maintenance_steps)
        self.metrics = metrics
        self.raise_errors = raise_errors
        # Shared with the service's ingest committer: their commits take turns.
        self.turns = turns
        self._table: Table | None = None
        # The first run comes one interval (or count) after start: a service restarted in a loop
        # does not maintain at every start.
        self._last_run = time.monotonic()
        self._commits_since_run = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._child: MaintenanceChild | None = None
        # "beside" in a service of many tables: one child process runs every table's maintenance,
        # which the service, not this runner, stops.
        self._shared_child = shared_child
        # A run's CPU: its thread's in the service's process, the whole process in the child's.
        self.cpu_clock: Callable[[], float] = time.thread_time

    def table(self) -> Table:
        if self._table is None:
            self._table = open_catalog(self.settings.catalog_name, self.settings.catalog).load_table(self.table_name)
        return self._table

    def run_once(
        self, steps: tuple[str, ...] | None = None, dry_run: bool = False, progress: Progress | None = None
    ) -> MaintenanceReport | None:
        """One run in this process, now."""
        self._last_run = time.monotonic()
        self._commits_since_run = 0
        return self.record(self.execute(steps or self.steps, dry_run, progress or no_progress), dry_run)

    def execute(self, steps: tuple[str, ...], dry_run: bool = False, progress: Progress = no_progress) -> RunResult:
        cpu0 = self.cpu_clock()
        result = self._execute(steps, dry_run, progress)
        return replace(result, cpu_s=round(self.cpu_clock() - cpu0, 3))

    def _execute(self, steps: tuple[str, ...], dry_run: bool, progress: Progress) -> RunResult:
        try:
            table = self.table()
            turn = self.turns.turn if self.turns is not None else no_turn
            report = maintain(table, self.policy, steps, dry_run=dry_run, progress=progress, turn=turn)
        except MaintenanceGaveUp as exc:
            log.warning("maintenance gave up", extra={"summary": {"table": self.table_name, "error": str(exc)}})
            if self.raise_errors:
                raise
            return RunResult(None, "gave_up", exc.conflicts)
        except Abandoned:
            log.info("maintenance abandoned: the service is stopping", extra={"summary": {"table": self.table_name}})
            return RunResult(None)
        except Exception as exc:
            log.error(
                "maintenance failed",
                exc_info=True,
                extra={"summary": {"table": self.table_name, "error": str(exc)[:500]}},
            )
            if self.raise_errors:
                raise
            return RunResult(None, "failed")
        if report.skipped or dry_run:
            return RunResult(report)
        return RunResult(report, snapshots=len(table.metadata.snapshots), data_manifests=data_manifest_count(table))

    def record(self, result: RunResult, dry_run: bool = False) -> MaintenanceReport | None:
        if result.failure is not None:
            if self.metrics:
                self.metrics.observe_failure(result.failure, result.conflicts)
                self.metrics.observe_cost(result.cpu_s, result.paced_s)
            return None
        report = result.report
        if report is None:
            return None
        if report.skipped:
            log.info("maintenance skipped", extra={"summary": report.to_json()})
            if self.metrics:
                self.metrics.observe_skip()
        else:
            log.info("maintenance cost", extra={"summary": {"cpu_s": result.cpu_s, "paced_s": result.paced_s}})
            if self.metrics and not dry_run:
                self.metrics.observe(report, result.snapshots, result.data_manifests)
        if self.metrics:
            self.metrics.observe_cost(result.cpu_s, result.paced_s)
        return report

    def due_steps(self) -> tuple[str, ...]:
        """What a run now would do: every step once the interval passed, all but orphans once the
        batch count is reached and the minimum gap passed, nothing otherwise."""
        if time.monotonic() - self._last_run >= self.settings.maintenance_interval_s:
            return self.steps
        every = self.settings.maintenance_interval_commits
        gap_passed = time.monotonic() - self._last_run >= self.settings.maintenance_min_gap_s
        if every and self._commits_since_run >= every and gap_passed:
            return tuple(s for s in self.steps if s != "orphans") or self.steps
        return ()

    def after_batch(self, report: BatchReport) -> None:
        # After a failed commit the job stops: no maintenance to delay that.
        if report.outcome is None or report.outcome.status == "failed":
            return
        if report.outcome.status == "committed":
            self._commits_since_run += 1
        if self._thread is not None:
            if self.due_steps():
                self._wake.set()
        elif steps := self.due_steps():
            self.run_once(steps)

    def start(self) -> None:
        """Maintain on a thread of this process ("background") or in a child process ("beside")."""
        if self.settings.maintenance_mode == "beside" and self._shared_child is not None:
            self._shared_child.add_table(self.table_name, self.turns)
            self._child = self._shared_child
        elif self.settings.maintenance_mode == "beside":
            self._child = MaintenanceChild(self.settings, {self.table_name: self.turns})
        self._thread = threading.Thread(target=self._loop, name="maintenance", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(max(0.0, self.settings.maintenance_interval_s - (time.monotonic() - self._last_run)))
            self._wake.clear()
            if self._stop.is_set():
                return
            if steps := self.due_steps():
                if self._child is None:
                    self.run_once(steps)
                    continue
                self._last_run = time.monotonic()
                self._commits_since_run = 0
                result = self._child.run(self.table_name, steps, self._stop)
                if result is not None:
                    self.record(result)

    def stop(self, timeout_s: float = 60.0) -> None:
        # A run cut short by the process's exit loses nothing: its files become orphans.
        self._stop.set()
        self._wake.set()
        if self._child is not None and self._child is not self._shared_child:
            self._child.stop(timeout_s)
        if self._thread is not None:
            self._thread.join(timeout_s)


class MaintenanceChild:
    """The child process of "beside": started at once, it waits for runs (a table and a tuple of
    steps over a pipe) and answers each with its RunResult. One child serves one table, or every
    table of a service of many (`add_table`): their runs take turns in it."""

    def __init__(self, settings: Settings, turns_by_table: dict[str, CommitTurns | None]):
        self.settings = settings
        self.turns_by_table = dict(turns_by_table)
        self._lock = threading.Lock()
        self._tables_added = False
        self._spawn()

    def add_table(self, table_name: str, turns: CommitTurns | None) -> None:
        """A table whose runs this child takes too: a commit-turn lock reaches a child only as it
        starts, so the child starts again before its next run (it waits between runs)."""
        with self._lock:
            if table_name not in self.turns_by_table or self.turns_by_table[table_name] is not turns:
                self.turns_by_table[table_name] = turns  # a table's lane started again has new turns
                self._tables_added = True

    def _spawn(self) -> None:
        context = multiprocessing.get_context("spawn")  # no copy of the driver's threads and JVM gateway
        self._conn, child_conn = context.Pipe()
        self.process = context.Process(
            target=child_main,
            args=(self.settings, self.turns_by_table, child_conn),
            name="geoingest-maintenance",
            daemon=True,
        )
        self.process.start()
        child_conn.close()

    def run(self, table_name: str, steps: tuple[str, ...], stop: threading.Event) -> RunResult | None:
        """Hand one run to the child and wait for its answer; None when the service stops first or
        the child is gone (a new one is started for the next run)."""
        with self._lock:
            if self._tables_added and self.process.is_alive():
                self._stop_process(60.0)
                self._spawn()
            elif not self.process.is_alive():
                log.error(
                    "the maintenance process is gone; starting a new one",
                    extra={"summary": {"exitcode": self.process.exitcode}},
                )
                self._conn.close()
                for turns in self.turns_by_table.values():
                    if turns is not None:
                        turns.renew()  # the child may have died holding the turn
                self._spawn()
            self._tables_added = False
            try:
                self._conn.send((table_name, steps))
                while not stop.is_set():
                    if self._conn.poll(0.2):
                        return self._conn.recv()
                    if not self.process.is_alive():
                        return self._gone(stop)
            except (EOFError, OSError):
                return self._gone(stop)
            return None

    @staticmethod
    def _gone(stop: threading.Event) -> RunResult | None:
        """A child gone mid-run failed it, unless the service stopped it (SIGTERM between two polls)."""
        return None if stop.is_set() else RunResult(None, "failed")

    def stop(self, timeout_s: float) -> None:
        """SIGTERM: the child abandons its run at the next file, releases the lease and exits."""
        self._stop_process(timeout_s)

    def _stop_process(self, timeout_s: float) -> None:
        if self.process.is_alive() and self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGTERM)
        self.process.join(timeout_s)
        if self.process.is_alive():
            log.warning("the maintenance process did not stop in time; killing it")
            self.process.kill()
            self.process.join(10)
        self._conn.close()


def child_main(settings: Settings, turns_by_table: dict[str, CommitTurns | None], conn: Connection) -> None:
    """The maintenance process: lower priority, Arrow on one thread, at most
    maintenance_cpu_percent of one core, stops on SIGTERM or SIGINT or when the service is gone."""
    from app.logs import configure_logging
    from app.maven import configure_iceberg_java

    configure_logging()
    configure_iceberg_java(Path(settings.cache_dir))
    stopping = threading.Event()

    def request_stop(_signum, _frame):
        stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    if settings.maintenance_nice:
        os.nice(settings.maintenance_nice)
    import pyarrow as pa

    pa.set_cpu_count(1)
    budget = CpuBudget(settings.maintenance_cpu_percent / 100, sleep=lambda s: None if stopping.wait(s) else None)

    def paced(step: str, advance: int, total: int, unit: str) -> None:
        if stopping.is_set():
            raise Abandoned(step)
        budget.pace()

    runners: dict[str, MaintenanceRunner] = {}
    parent = os.getppid()
    while not stopping.is_set():
        try:
            if not conn.poll(0.5):
                if os.getppid() != parent:
                    return  # the service died without a word (kill -9)
                continue
            table_name, steps = conn.recv()
        except (EOFError, OSError):
            return
        if table_name not in runners:
            runners[table_name] = MaintenanceRunner(settings, table_name, turns=turns_by_table.get(table_name))
            runners[table_name].cpu_clock = time.process_time  # Arrow's and the IO threads' too
        budget.start()
        result = runners[table_name].execute(steps, progress=paced)
        budget.pace()  # the run's share is kept before the next one starts
        try:
            conn.send(replace(result, paced_s=round(budget.slept, 3)))
        except (BrokenPipeError, OSError):
            return
