"""Commit turns between a service's ingest committer and its maintenance (streaming/table/turns.py),
on a real SQLite catalog: a commit whose attempt takes longer than the gap between two batches
loses every retry to them without turns, and lands at once with them."""

from __future__ import annotations

import threading
import time

import pytest
from pyiceberg.table import Table

from streaming.maintenance.commits import MaintenanceGaveUp, Retrier
from streaming.table.commit import Committer, data_spec_id, single_attempt_view, to_data_file
from streaming.table.row_delta import SpecAwareAppend
from streaming.table.turns import CommitTurns, no_turn
from streaming.write.data_files import DataFileRecord
from tests.streaming.table.test_commit import batch_commit, contract, data_files, event_ids, second_handle, table  # noqa: F401 - fixtures

BATCHES = 120
ATTEMPT_S = 0.3  # the time a compaction on a loaded machine spends between its refresh and its commit


def slow_attempt(table: Table, files: tuple[DataFileRecord, ...], attempts: list[int]):
    """A maintenance commit that reads the table, takes ATTEMPT_S, then commits a snapshot (which
    holds only on the snapshot it read)."""

    def attempt() -> int:
        attempts.append(1)
        table.refresh()
        time.sleep(ATTEMPT_S)  # stands for reading every manifest: the sleep is the time, not a fault
        view = single_attempt_view(table)
        with view.transaction() as tx:
            append = SpecAwareAppend(tx, snapshot_properties={})
            for record in files:
                append.append_data_file(to_data_file(record, data_spec_id(record, view.metadata)))
            append.commit()
        return len(attempts)

    return attempt


@pytest.mark.parametrize("with_turns", [False, True], ids=["optimism-alone", "turns"])
def test_a_slow_maintenance_commit_lands_beside_back_to_back_batches_only_in_turns(
    catalog, table, contract, with_turns
):
    turns = CommitTurns()
    turn = turns.turn if with_turns else no_turn
    batches = [batch_commit(table, contract, "ingest", b, [f"b{b}"]) for b in range(BATCHES)]
    committer = Committer(second_handle(catalog, contract), turn=turn)
    stop = threading.Event()
    committed: list[int] = []

    def ingest() -> None:
        for batch in batches:
            if stop.is_set():
                return
            committer.commit(batch)
            committed.append(batch.batch_id)

    writer = threading.Thread(target=ingest)
    writer.start()
    while not committed:
        time.sleep(0.01)
    attempts: list[int] = []
    maintenance_files = data_files(table, contract, ["m"])
    retrier = Retrier(table, sleep=lambda s: time.sleep(min(s, 0.05)), turn=turn)
    try:
        if with_turns:
            landed, conflicts = retrier.run("slow maintenance", slow_attempt(table, maintenance_files, attempts))
            assert (landed, conflicts) == (1, 0)
        else:
            with pytest.raises(MaintenanceGaveUp, match="slow maintenance"):
                retrier.run("slow maintenance", slow_attempt(table, maintenance_files, attempts))
    finally:
        stop.set()
        writer.join()
    landed = ["m"] if with_turns else []
    assert event_ids(table) == sorted([*landed, *(f"b{b}" for b in committed)]), "every batch committed once"
    assert len(committed) < BATCHES, "the batches were still coming when maintenance ended"


def test_a_turn_held_past_the_wait_lets_the_commit_go_ahead_and_a_renewed_lock_is_free(table, contract):
    turns = CommitTurns(wait_s=0.2)
    stuck = turns.lock
    assert stuck.acquire()  # a holder that never releases: a child killed in its turn
    started = time.monotonic()
    outcome = Committer(table, turn=turns.turn).commit(batch_commit(table, contract, "w", 0, ["a"]))
    assert outcome.status == "committed" and time.monotonic() - started >= 0.2
    turns.renew()
    started = time.monotonic()
    assert Committer(table, turn=turns.turn).commit(batch_commit(table, contract, "w", 1, ["b"])).status == "committed"
    assert time.monotonic() - started < 0.2 * 5
    assert event_ids(table) == ["a", "b"]
