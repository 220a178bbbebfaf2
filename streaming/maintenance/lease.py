"""The maintenance lease: at most one maintainer changes a table for upkeep at a time.

Two maintainers on one table (the service's own runner and a CronJob, two replicas of a CronJob,
a person running `geoingest table maintain`) would otherwise read the same small files, rewrite
them both, and have one rewrite refused or given up after all its work. The lease makes the second
one skip at once.

Iceberg has one compare-and-set every catalog enforces atomically on a commit: a ref's snapshot id,
or "this ref does not exist" (`AssertRefSnapshotId`). The lease is built on it, with tags:

- `geoingest-maintenance-lease-<n>` is the lease's generation n. Every change of the lease (take,
  renew, release) is one commit that removes tag n (asserting it still points where it was read)
  and creates tag n+1 (asserting it does not exist), and writes who holds generation n+1 until when
  in the table property `geoingest.maintenance.lease`. Of two maintainers that read generation n,
  one creates n+1 and the other's commit is refused by the catalog; one that read an older
  generation asserts a tag that is gone. A generation's tag is created once, so a read of it can
  never be confused with a later lease (no ABA).
- `geoingest-maintenance-lease` is the anchor: created by the first lease ever taken (asserting it
  does not exist), never removed, so a maintainer that read the table before any lease existed
  cannot start a second chain of generations.

Both tags are moved to the current snapshot at every change, so a lease pins no old snapshot (and
its files) beyond one maintenance run. A maintainer that dies holding the lease blocks others until
it expires (`maintenance_lease_s`); a holder renews it before each step. The lease is an efficiency
guard, not the only one: compaction still checks that the files it replaces are live when it commits
(streaming/maintenance/maintain.py), so even a holder that outlived its lease loses no row and duplicates none.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.update.snapshot import ManageSnapshots

LEASE_PROPERTY = "geoingest.maintenance.lease"
ANCHOR_TAG = "geoingest-maintenance-lease"
# Commits of other writers (ingest) between reading the lease and changing it: tried again this often.
CHANGE_ATTEMPTS = 8


def generation_tag(generation: int) -> str:
    return f"{ANCHOR_TAG}-{generation}"


def default_holder() -> str:
    """host:pid:random, unique per maintainer and readable in the table property."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_is_gone(holder: str) -> bool:
    """Whether the holder was a process of this host that no longer runs (killed, say): its lease
    need not run out first. Another host's holder, or this process's own, cannot be told: no."""
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@dataclass(frozen=True)
class LeaseState:
    """The lease as a table's metadata records it. generation 0: no lease was ever taken."""

    generation: int
    holder: str | None
    expires_at_ms: int

    def held_by_other(self, holder: str, now_ms: int) -> bool:
        return (
            self.holder is not None
            and self.holder != holder
            and now_ms < self.expires_at_ms
            and not holder_is_gone(self.holder)
        )

    def to_json(self) -> dict:
        return {"generation": self.generation, "holder": self.holder, "expires_at_ms": self.expires_at_ms}


class LeaseHeld(RuntimeError):
    """Another maintainer holds the lease: this run skips."""

    def __init__(self, table: str, state: LeaseState):
        until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.expires_at_ms / 1000))
        super().__init__(f"table {table}: maintenance lease held by {state.holder} until {until}")
        self.state = state


class LeaseLost(RuntimeError):
    """The lease expired and another maintainer took it: the holder stops before its next step."""


def lease_state(table: Table) -> LeaseState:
    """The lease recorded in the table; an unreadable property counts as a free lease of its generation."""
    if ANCHOR_TAG not in table.metadata.refs:
        return LeaseState(0, None, 0)
    raw = table.metadata.properties.get(LEASE_PROPERTY, "")
    try:
        record = json.loads(raw)
        return LeaseState(int(record["generation"]), record.get("holder"), int(record.get("expires_at_ms", 0)))
    except (ValueError, TypeError, KeyError):
        # Someone edited the property by hand: the highest generation tag still tells the chain.
        generations = [
            int(name.rsplit("-", 1)[1])
            for name in table.metadata.refs
            if name.startswith(ANCHOR_TAG + "-") and name.rsplit("-", 1)[1].isdigit()
        ]
        return LeaseState(max(generations, default=0), None, 0)


def _change(table: Table, seen: LeaseState, holder: str | None, expires_at_ms: int) -> LeaseState:
    """One commit from generation `seen` to the next; CommitFailedException when the catalog refuses it."""
    snapshot = table.current_snapshot()
    assert snapshot is not None, "a lease is only taken on a table with a snapshot"
    new = LeaseState(seen.generation + 1, holder, expires_at_ms)
    txn = table.transaction()
    refs = ManageSnapshots(transaction=txn)
    old_tag = generation_tag(seen.generation)
    if seen.generation and old_tag in table.metadata.refs:
        refs.remove_tag(old_tag)
    # create_tag asserts the tag is absent (a new generation, the anchor's first time) or still where it was read.
    refs.create_tag(snapshot.snapshot_id, generation_tag(new.generation))
    refs.create_tag(snapshot.snapshot_id, ANCHOR_TAG)
    refs.commit()
    txn.set_properties({LEASE_PROPERTY: json.dumps(new.to_json())})
    txn.commit_transaction()
    return new


class MaintenanceLease:
    """Take, renew and release the lease on `table` for `holder`, for `duration_s` at a time.

    `acquire` raises LeaseHeld when another holder's lease has not expired; `renew` raises LeaseLost
    when another holder took it over; `release` never raises (an unreleased lease expires)."""

    def __init__(
        self,
        table: Table,
        duration_s: float,
        holder: str | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if duration_s <= 0:
            raise ValueError(f"maintenance lease duration {duration_s:g} s: must be positive")
        self.table = table
        self.duration_ms = int(duration_s * 1000)
        self.holder = holder or default_holder()
        self.clock = clock
        self.sleep = sleep
        self.held: LeaseState | None = None

    @property
    def name(self) -> str:
        return ".".join(self.table.name())

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def acquire(self) -> bool:
        """Take the lease; False when the table has no snapshot (nothing to maintain, nothing to lease)."""
        for attempt in range(CHANGE_ATTEMPTS):
            self.table.refresh()
            if self.table.current_snapshot() is None:
                return False
            seen = lease_state(self.table)
            if seen.held_by_other(self.holder, self._now_ms()):
                raise LeaseHeld(self.name, seen)
            try:
                self.held = _change(self.table, seen, self.holder, self._now_ms() + self.duration_ms)
                return True
            except CommitFailedException:
                self._back_off(attempt)
        raise LeaseHeld(self.name, lease_state(self.table))

    def renew(self) -> None:
        """Extend the lease once less than half of it is left (a change is a commit: not every step)."""
        if self.held is None or self.held.expires_at_ms - self._now_ms() > self.duration_ms // 2:
            return
        for attempt in range(CHANGE_ATTEMPTS):
            self.table.refresh()
            seen = lease_state(self.table)
            if seen.generation != self.held.generation:
                self.held = None
                raise LeaseLost(f"table {self.name}: maintenance lease taken over by {seen.holder}")
            try:
                self.held = _change(self.table, seen, self.holder, self._now_ms() + self.duration_ms)
                return
            except CommitFailedException:
                self._back_off(attempt)
        raise LeaseLost(f"table {self.name}: maintenance lease could not be renewed in {CHANGE_ATTEMPTS} attempts")

    def release(self) -> None:
        held, self.held = self.held, None
        if held is None:
            return
        for attempt in range(CHANGE_ATTEMPTS):
            try:
                self.table.refresh()
                seen = lease_state(self.table)
                if seen.generation != held.generation:
                    return
                _change(self.table, seen, None, self._now_ms())
                return
            except CommitFailedException:
                self._back_off(attempt)
            except Exception:
                # Not released: the lease runs out at its expiry, which is what a crash would leave too.
                return

    def _back_off(self, attempt: int) -> None:
        self.sleep(min(0.05 * 2**attempt, 2.0) * random.uniform(0.5, 1.0))
