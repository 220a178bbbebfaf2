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
it expires (`maintenance_lease_s`).

While a run holds it, a thread keeps it alive (`keep_alive`: renewed once less than half is left,
through a table object of its own), however long a step takes: a compaction throttled to a quarter
of a core can run for longer than the lease. A holder can still lose it (paused, or cut off from the
catalog past its expiry), so every maintenance commit is fenced by it (`fenced`): the commit asserts,
in the same catalog commit, that the holder's generation tag is still where it was put. A maintainer
whose lease was taken over commits nothing, so none of its commits can reference a file the new
holder found unreferenced and deleted as an orphan; and an orphan deletion confirms the lease after
listing the files and before deleting any (`confirm`), so no run that started after it took the lease
was writing then. Compaction also checks that the files it replaces are live when it commits
(streaming/maintenance/compaction.py).
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update import AssertRefSnapshotId
from pyiceberg.table.update.snapshot import ManageSnapshots

from streaming.maintenance import native
from streaming.table.catalog import open_catalog
from streaming.table.native import is_native

log = logging.getLogger("geoingest.maintenance")

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
    """The lease expired and another maintainer took it: the holder commits nothing more and stops."""


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
    old_tag = generation_tag(seen.generation)
    if is_native(table):
        native.change_refs(
            table,
            [old_tag] if seen.generation else [],
            {generation_tag(new.generation): snapshot.snapshot_id, ANCHOR_TAG: snapshot.snapshot_id},
            {LEASE_PROPERTY: json.dumps(new.to_json())},
        )
        table.refresh()
        return new
    txn = table.transaction()
    refs = ManageSnapshots(transaction=txn)
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

    `acquire` raises LeaseHeld when another holder's lease has not expired; `renew` and `confirm`
    raise LeaseLost when another holder took it over, and so does a `fenced` commit; `release` never
    raises (an unreleased lease expires). `keep_alive` renews it from a thread while a run works."""

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
        # Where the held generation's tag points: what a fenced commit asserts.
        self._tag_snapshot_id: int | None = None
        # Why the lease was lost, once it was (a fenced commit then says so).
        self.lost: str | None = None
        # One change of the lease or fenced commit at a time: the keeper's renewal never moves the
        # tag between a fenced commit's reading of it and the catalog's check.
        self._lock = threading.Lock()
        self._own_table: Table | None = None

    @property
    def name(self) -> str:
        return ".".join(self.table.name())

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _changed(self, table: Table, seen: LeaseState, holder: str | None, expires_at_ms: int) -> LeaseState:
        new = _change(table, seen, holder, expires_at_ms)
        self._tag_snapshot_id = table.metadata.refs[generation_tag(new.generation)].snapshot_id
        return new

    def _taken_over(self, seen: LeaseState) -> str:
        now = f"held by {seen.holder}" if seen.holder else "free"
        return f"table {self.name}: maintenance lease taken over by another maintainer (now {now}, generation {seen.generation})"

    def _lose(self, message: str) -> LeaseLost:
        self.held, self.lost = None, message
        return LeaseLost(message)

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
                with self._lock:
                    self.held = self._changed(self.table, seen, self.holder, self._now_ms() + self.duration_ms)
                    self.lost = None
                return True
            except CommitFailedException:
                self._back_off(attempt)
        raise LeaseHeld(self.name, lease_state(self.table))

    def renew(self, table: Table | None = None) -> None:
        """Extend the lease once less than half of it is left (a change is a commit: not at every
        call), through `table` (the lease's own by default)."""
        table = table or self.table
        for attempt in range(CHANGE_ATTEMPTS):
            with self._lock:
                if self.held is None or self.held.expires_at_ms - self._now_ms() > self.duration_ms // 2:
                    return
                table.refresh()
                seen = lease_state(table)
                if seen.generation != self.held.generation:
                    raise self._lose(self._taken_over(seen))
                try:
                    self.held = self._changed(table, seen, self.holder, self._now_ms() + self.duration_ms)
                    return
                except CommitFailedException:
                    pass
            self._back_off(attempt)
        raise self._lose(f"table {self.name}: maintenance lease could not be renewed in {CHANGE_ATTEMPTS} attempts")

    def confirm(self) -> None:
        """LeaseLost unless the catalog's table still records this holder's generation, read afresh
        (through a table object of the lease's own: the caller's keeps the metadata it works on)."""
        with self._lock:
            if self.held is None:
                raise LeaseLost(self.lost or f"table {self.name}: maintenance lease not held")
            own = self._table_of_own()
            own.refresh()
            seen = lease_state(own)
            if seen.generation != self.held.generation:
                raise self._lose(self._taken_over(seen))

    @contextmanager
    def fenced(self, view: Table) -> Iterator[Transaction]:
        """A transaction on `view`, committed when the block ends, that lands only while this lease
        is held: the catalog checks, with the commit, that the generation tag this holder created
        is still there and where it was put. Raises LeaseLost, committing nothing, once the lease
        was lost (or `view` shows another holder's generation); a commit the catalog refuses for it
        raises CommitFailedException, and the retry that follows raises LeaseLost."""
        with self._lock:
            held = self._held_on(view)
            transaction = view.transaction()
            yield transaction
            tag = generation_tag(held.generation)
            fence = AssertRefSnapshotId.model_validate({"ref": tag, "snapshot-id": self._tag_snapshot_id})
            # Added past pyiceberg's staging, which keeps one requirement of each type: staged, it
            # would drop the snapshot producer's assertion on the branch (or be dropped for it).
            transaction._requirements += (fence,)
            transaction.commit_transaction()

    @contextmanager
    def native_fence(self, view: Table) -> Iterator[native.Fence]:
        """The fence of a native table's maintenance commit (streaming/maintenance/native.py), made
        within the block: as `fenced`, it lands only while this lease is held, and the tag it
        moves is where this holder's next commit finds it."""
        with self._lock:
            held = self._held_on(view)
            fence = native.Fence(generation_tag(held.generation), self._tag_snapshot_id)
            yield fence
            if fence.moved_to is not None:
                self._tag_snapshot_id = fence.moved_to

    def _held_on(self, view: Table) -> LeaseState:
        """The held lease, unless lost or `view` shows another holder's generation (LeaseLost)."""
        held = self.held
        if held is None:
            raise LeaseLost(self.lost or f"table {self.name}: maintenance lease not held")
        seen = lease_state(view)
        if seen.generation > held.generation:
            raise self._lose(self._taken_over(seen))
        return held

    @contextmanager
    def keep_alive(self, interval_s: float | None = None) -> Iterator[None]:
        """Renew the lease from a thread while the block runs, looking every `interval_s` (an eighth
        of the lease by default, so a renewal comes well before expiry). A renewal the catalog
        cannot take is tried again at the next look; a lease another holder took is given up (the
        next fenced commit raises LeaseLost)."""
        interval_s = interval_s or max(self.duration_ms / 8000, 0.05)
        stop = threading.Event()

        def keep() -> None:
            while not stop.wait(interval_s):
                try:
                    self.renew(self._table_of_own())
                except LeaseLost:
                    return
                except Exception as exc:  # noqa: BLE001 - the catalog away for a moment: the fence guards meanwhile
                    log.warning(
                        "maintenance lease not renewed; trying again",
                        extra={"summary": {"table": self.name, "error": str(exc)[:300]}},
                    )

        keeper = threading.Thread(target=keep, name="maintenance-lease", daemon=True)
        keeper.start()
        try:
            yield
        finally:
            stop.set()
            keeper.join()

    def _table_of_own(self) -> Table:
        if self._own_table is None:
            # A catalog connection of its own too: the keeper's thread shares no client (a REST
            # session, a SQL connection) with the run's.
            catalog = self.table.catalog
            self._own_table = open_catalog(catalog.name, dict(catalog.properties)).load_table(self.table.name())
        return self._own_table

    def release(self) -> None:
        with self._lock:
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
