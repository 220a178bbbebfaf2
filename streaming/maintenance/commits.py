"""What every maintenance step shares: one-attempt commits retried with the table's commit.retry.*
backoff and fenced by the run's maintenance lease, the summary that marks a maintenance snapshot and
carries every writer's history, and deleting the files a step leaves behind."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TypeVar

from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.table import Table, Transaction

from streaming.maintenance.lease import MaintenanceLease
from streaming.maintenance.native import Fence
from streaming.table.commit import WRITERS, RetryPolicy, writer_histories_json
from streaming.table.turns import no_turn

log = logging.getLogger("geoingest.maintenance")


# Snapshot summary key of maintenance snapshots: which step made it.
MAINTENANCE = "geoingest.maintenance"


T = TypeVar("T")


# progress(step, advance, total, unit): a step moved on by `advance` of `total` (the CLI draws bars).
Progress = Callable[[str, int, int, str], None]


def no_progress(step: str, done: int, total: int, unit: str) -> None:
    pass


class MaintenanceGaveUp(RuntimeError):
    """A maintenance commit lost every retry to concurrent commits; nothing of it landed."""

    def __init__(self, message: str, conflicts: int):
        super().__init__(message)
        self.conflicts = conflicts


# -- committing ---------------------------------------------------------------------------------
@dataclass
class Retrier:
    """Runs one-attempt maintenance commits until one lands, with the table's commit.retry.* backoff;
    with the run's `lease`, each commit lands only while the lease is held (MaintenanceLease.fenced)."""

    table: Table
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)
    lease: MaintenanceLease | None = None
    # Each attempt in its turn among the service's writers (streaming/table/turns.py).
    turn: Callable[[str], AbstractContextManager[None]] = no_turn

    def transaction(self, view: Table) -> AbstractContextManager[Transaction]:
        """A transaction on `view` committed when its block ends (fenced by the lease, if any)."""
        return view.transaction() if self.lease is None else self.lease.fenced(view)

    def native_fence(self, view: Table) -> AbstractContextManager[Fence | None]:
        """The lease's fence for a native table's commit on `view` (None without a lease)."""
        return nullcontext(None) if self.lease is None else self.lease.native_fence(view)

    def run(self, what: str, attempt: Callable[[], T]) -> tuple[T, int]:
        started = time.monotonic()
        conflicts = 0
        while True:
            try:
                with self.turn(what):
                    return attempt(), conflicts
            except (CommitFailedException, ValidationException) as exc:
                conflicts += 1
                policy = RetryPolicy.from_table_properties(self.table.properties)
                elapsed_ms = (time.monotonic() - started) * 1000
                if conflicts > policy.num_retries or elapsed_ms > policy.total_timeout_ms:
                    raise MaintenanceGaveUp(
                        f"{what} of {'.'.join(self.table.name())} gave up after {conflicts} conflict(s) in "
                        f"{elapsed_ms:.0f} ms; last error: {exc}",
                        conflicts,
                    ) from exc
                log.info(
                    "maintenance commit conflicted, retrying on a fresh table",
                    extra={"summary": {"step": what, "conflicts": conflicts, "error": str(exc)[:300]}},
                )
                self.sleep(policy.wait_ms(conflicts, self.rng) / 1000)


def adopt(table: Table, view: Table) -> None:
    # The view holds the metadata the catalog answered with.
    table.metadata, table.metadata_location = view.metadata, view.metadata_location


def current_snapshot_id(table: Table) -> int:
    snapshot = table.current_snapshot()
    if snapshot is None:
        raise RuntimeError(f"table {'.'.join(table.name())}: no current snapshot after a maintenance commit")
    return snapshot.snapshot_id


def carry(view: Table, step: str) -> dict[str, str]:
    return {MAINTENANCE: step, WRITERS: writer_histories_json(view.metadata.snapshots)}


def size(table: Table, path: str) -> int:
    try:
        return len(table.io.new_input(path))
    except (OSError, FileNotFoundError):
        return 0


def delete_quietly(table: Table, paths: Iterable[str]) -> None:
    for path in paths:
        try:
            table.io.delete(path)
        except (OSError, FileNotFoundError) as exc:  # left for orphan deletion
            log.warning("could not delete a file", extra={"summary": {"path": path, "error": str(exc)}})
