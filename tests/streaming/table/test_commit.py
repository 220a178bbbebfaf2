"""The committer against a real Iceberg table (pyiceberg SQL catalog on SQLite, no Spark).

Data files are real: GeoJSON points decoded by `Decoder`, Hilbert-sorted and written by
`GeoParquetWriter`. Concurrency is real too: a second catalog instance on the same SQLite file
commits in the window between the committer's refresh and its append, and the catalog's
optimistic check refuses the stale commit.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.conversions import from_bytes
from pyiceberg.table import Table
from pyiceberg.types import DoubleType

from streaming.contract import Contract, load_contract
from streaming.decode.decoder import HILBERT, REJECT_REASON, Decoder
from streaming.maintenance.maintain import expire_snapshots
from streaming.maintenance.plan import MaintenancePolicy
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import (
    BATCH_ID,
    KAFKA_OFFSETS,
    REJECTED,
    ROWS,
    WRITER_ID,
    WRITERS,
    BatchCommit,
    CommitRetriesExhausted,
    Committer,
    RetryPolicy,
    WriterIdReusedError,
    committed_snapshot,
    recorded_offsets,
)
from streaming.write.data_files import DataFileRecord, GeoParquetWriter

CONTRACT_PATH = Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json"
TOPIC = "demo-events"


class SleepRecorder(list):
    """Stands in for time.sleep: records the waits instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def contract() -> Contract:
    return load_contract(CONTRACT_PATH)


@pytest.fixture
def table(catalog, contract) -> Table:
    table, created = create_table(catalog, contract)
    assert created
    return table


def second_handle(catalog, contract: Contract) -> Table:
    """The same table through another catalog instance on the same SQLite file: another writer."""
    return open_catalog(catalog.name, dict(catalog.properties)).load_table(contract.table)


def data_files(table: Table, contract: Contract, ids: list[str]) -> tuple[DataFileRecord, ...]:
    values = [
        json.dumps(
            {
                "type": "Feature",
                "id": event_id,
                "geometry": {"type": "Point", "coordinates": [2.0 + i * 0.5, 48.0 - i * 0.25]},
                "properties": {"kind": "probe", "speed": float(i)},
            }
        ).encode()
        for i, event_id in enumerate(ids)
    ]
    n = len(values)
    batch = pa.record_batch(
        {
            "key": pa.nulls(n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array([TOPIC] * n),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us")),
        }
    )
    decoded = pa.Table.from_batches([Decoder(contract).decode(batch)])
    valid = decoded.filter(pc.is_null(decoded.column(REJECT_REASON))).sort_by(HILBERT)
    assert valid.num_rows == n
    writer = GeoParquetWriter(contract, table.properties, table.io.properties, table.location() + "/data", "test")
    return tuple(writer.write(valid.to_batches()))


def batch_commit(
    table, contract, writer_id: str, batch_id: int, ids: list[str], offsets: dict | None = None
) -> BatchCommit:
    offsets = offsets if offsets is not None else {TOPIC: {0: (batch_id * 10, batch_id * 10 + len(ids) - 1)}}
    return BatchCommit(writer_id, batch_id, offsets, data_files(table, contract, ids), rejected=1)


def event_ids(table: Table) -> list[str]:
    table.refresh()
    return sorted(table.scan().to_arrow().column("event_id").to_pylist())


def identities(table: Table) -> list[tuple[str, str]]:
    table.refresh()
    return [
        (s.summary.additional_properties.get(WRITER_ID), s.summary.additional_properties.get(BATCH_ID))
        for s in table.metadata.snapshots
    ]


def race_on_refresh(monkeypatch, table: Table, other_commit, times: int | None = 1) -> list:
    """Another writer commits right after `table` refreshes, i.e. between the committer's refresh
    and its append. Returns the other writer's outcomes."""
    refresh = table.refresh
    outcomes: list = []

    def refresh_then_race():
        result = refresh()
        if times is None or len(outcomes) < times:
            outcomes.append(other_commit())
        return result

    monkeypatch.setattr(table, "refresh", refresh_then_race)
    return outcomes


def set_table_properties(table: Table, **props: str) -> None:
    with table.transaction() as tx:
        tx.set_properties(props)


# -- one writer --------------------------------------------------------------------------------------
def test_commit_creates_one_snapshot_recording_writer_batch_and_offsets(table, contract):
    sleeps = SleepRecorder()
    batch = batch_commit(table, contract, "writer-a", 0, ["a", "b", "c"], offsets={TOPIC: {0: (0, 1), 2: (7, 7)}})
    outcome = Committer(table, sleep=sleeps).commit(batch)

    assert (outcome.status, outcome.attempts, outcome.conflicts) == ("committed", 1, 0)
    assert sleeps == []
    assert len(table.metadata.snapshots) == 1
    snapshot = table.current_snapshot()
    assert outcome.snapshot_id == snapshot.snapshot_id
    summary = snapshot.summary.additional_properties
    assert summary[WRITER_ID] == "writer-a"
    assert summary[BATCH_ID] == "0"
    assert json.loads(summary[KAFKA_OFFSETS]) == {TOPIC: {"0": [0, 1], "2": [7, 7]}}
    assert summary[ROWS] == "3" and summary["added-records"] == "3"
    assert summary[REJECTED] == "1"
    assert event_ids(table) == ["a", "b", "c"]


def test_the_committed_file_carries_the_writers_bbox_bounds(table, contract):
    batch = batch_commit(table, contract, "writer-a", 0, ["a", "b"])  # points (2, 48) and (2.5, 47.75)
    Committer(table, sleep=SleepRecorder()).commit(batch)
    (task,) = table.scan().plan_files()
    (record,) = batch.files
    assert task.file.file_path == record.path and task.file.record_count == 2
    ids = contract.bbox_field_ids
    lower = {name: from_bytes(DoubleType(), task.file.lower_bounds[fid]) for name, fid in ids.items()}
    upper = {name: from_bytes(DoubleType(), task.file.upper_bounds[fid]) for name, fid in ids.items()}
    assert lower == {"xmin": 2.0, "ymin": 47.75, "xmax": 2.0, "ymax": 47.75}
    assert upper == {"xmin": 2.5, "ymin": 48.0, "xmax": 2.5, "ymax": 48.0}


def test_replay_of_the_same_writer_and_batch_is_skipped(table, contract):
    committer = Committer(table, sleep=SleepRecorder())
    first = committer.commit(batch_commit(table, contract, "writer-a", 0, ["a", "b"]))
    # The job died after the Iceberg commit and Spark runs the batch again: new files, same identity.
    replay = committer.commit(batch_commit(table, contract, "writer-a", 0, ["a", "b"]))

    assert replay.status == "skipped_replay"
    assert replay.snapshot_id == first.snapshot_id
    assert len(table.metadata.snapshots) == 1
    assert event_ids(table) == ["a", "b"]


def test_a_batch_id_of_the_writer_over_other_offsets_is_refused_not_skipped(table, contract):
    """A writer id reused with a reset checkpoint numbers its batches from 0 again: its batch 0 is
    the table's batch 0 by identity, but it read other records. Skipping it would drop them."""
    committer = Committer(table, sleep=SleepRecorder())
    first = batch_commit(table, contract, "writer-a", 0, ["a", "b"], {TOPIC: {0: (0, 9), 1: (0, 4)}})
    committer.commit(first)
    other = batch_commit(table, contract, "writer-a", 0, ["c", "d"], {TOPIC: {0: (10, 19), 1: (0, 4)}})

    with pytest.raises(WriterIdReusedError) as info:
        committer.commit(other)

    message = str(info.value)
    assert "\n" not in message
    for part in (
        "batch 0 of writer writer-a",
        "demo.events",
        f"{TOPIC}/0 0-9, {TOPIC}/1 0-4",  # what the table holds
        f"{TOPIC}/0 10-19, {TOPIC}/1 0-4",  # what this batch read
        "--resume-from-table",
        "new writer id",
    ):
        assert part in message, (part, message)
    assert event_ids(table) == ["a", "b"], "nothing of the refused batch was committed"
    assert identities(table) == [("writer-a", "0")]


def test_a_replay_over_the_same_offsets_in_another_order_is_still_a_replay(table, contract):
    committer = Committer(table, sleep=SleepRecorder())
    committer.commit(batch_commit(table, contract, "writer-a", 4, ["a"], {TOPIC: {0: (0, 9), 2: (3, 3)}}))
    replay = committer.commit(batch_commit(table, contract, "writer-a", 4, ["a"], {TOPIC: {2: (3, 3), 0: (0, 9)}}))
    assert replay.status == "skipped_replay"
    assert event_ids(table) == ["a"]


def test_once_its_snapshot_expired_a_batch_within_the_writers_offsets_is_a_replay_and_beyond_them_refused(
    table, contract
):
    """Only the writer's history (carried by a maintenance snapshot) knows the batch then: its
    batches read partition 0 offsets 0-59 one after another, so a batch within them holds records
    the table has, and one reaching beyond them (or into a partition it never read) would lose some."""
    committer = Committer(table, sleep=SleepRecorder())
    for batch_id in range(6):
        offsets = {TOPIC: {0: (batch_id * 10, batch_id * 10 + 9)}}
        committer.commit(batch_commit(table, contract, "writer-a", batch_id, [f"e{batch_id}"], offsets))
    expire_snapshots(table, MaintenancePolicy(snapshot_max_age_s=0, keep_snapshots=2, min_file_age_s=0))
    table.refresh()
    carrier = committed_snapshot(table, "writer-a", 1)
    assert WRITERS in carrier.summary.additional_properties, "batch 1 is known from the carried history only"

    def again(batch_id: int, offsets: dict):
        return committer.commit(batch_commit(table, contract, "writer-a", batch_id, ["x"], offsets))

    assert again(1, {TOPIC: {0: (10, 19)}}).status == "skipped_replay"
    assert again(2, {TOPIC: {0: (15, 34)}}).status == "skipped_replay", "cut otherwise, yet all in the table"
    with pytest.raises(WriterIdReusedError, match=r"history of this writer .* covers Kafka offsets demo-events/0 0-59"):
        again(3, {TOPIC: {0: (55, 64)}})
    with pytest.raises(WriterIdReusedError, match=r"this batch read demo-events/0 30-39, demo-events/1 0-9"):
        again(3, {TOPIC: {0: (30, 39), 1: (0, 9)}})
    assert event_ids(table) == [f"e{b}" for b in range(6)]


def test_replay_is_recognised_through_a_fresh_table_handle(catalog, table, contract):
    Committer(table, sleep=SleepRecorder()).commit(batch_commit(table, contract, "writer-a", 3, ["a"]))
    restarted = second_handle(catalog, contract)
    outcome = Committer(restarted, sleep=SleepRecorder()).commit(
        batch_commit(restarted, contract, "writer-a", 3, ["a"])
    )
    assert outcome.status == "skipped_replay"
    assert event_ids(table) == ["a"]


def test_another_batch_id_or_another_writer_commits(table, contract):
    committer = Committer(table, sleep=SleepRecorder())
    committer.commit(batch_commit(table, contract, "writer-a", 0, ["a"]))
    next_batch = committer.commit(batch_commit(table, contract, "writer-a", 1, ["b"]))
    other_writer = committer.commit(batch_commit(table, contract, "writer-b", 0, ["c"]))

    assert next_batch.status == other_writer.status == "committed"
    assert identities(table) == [("writer-a", "0"), ("writer-a", "1"), ("writer-b", "0")]
    assert event_ids(table) == ["a", "b", "c"]
    assert committed_snapshot(table, "writer-a", 1).snapshot_id == next_batch.snapshot_id
    assert committed_snapshot(table, "writer-a", 2) is None


def test_recorded_offsets_are_the_highest_last_offset_per_partition(table, contract):
    committer = Committer(table, sleep=SleepRecorder())
    committer.commit(batch_commit(table, contract, "writer-a", 0, ["a"], {TOPIC: {0: (0, 9), 1: (0, 4)}}))
    committer.commit(batch_commit(table, contract, "writer-a", 1, ["b"], {TOPIC: {0: (10, 19)}}))
    committer.commit(
        batch_commit(table, contract, "writer-b", 0, ["c"], {TOPIC: {1: (5, 7), 0: (3, 5)}, "other": {4: (100, 120)}})
    )

    def last(offsets):
        return {t: {p: r[1] for p, r in parts.items()} for t, parts in offsets.items()}

    assert last(recorded_offsets(table)) == {TOPIC: {0: 19, 1: 7}, "other": {4: 120}}
    assert last(recorded_offsets(table, "writer-a")) == {TOPIC: {0: 19, 1: 4}}
    assert last(recorded_offsets(table, "writer-b")) == {TOPIC: {0: 5, 1: 7}, "other": {4: 120}}
    assert recorded_offsets(table, "nobody") == {}


def test_recorded_offsets_of_an_empty_table_are_empty(table):
    assert recorded_offsets(table) == {}


# -- two writers -------------------------------------------------------------------------------------
def test_a_stale_table_object_is_refreshed_before_committing(catalog, table, contract):
    stale = second_handle(catalog, contract)
    Committer(table, sleep=SleepRecorder()).commit(batch_commit(table, contract, "writer-a", 0, ["a"]))
    outcome = Committer(stale, sleep=SleepRecorder()).commit(batch_commit(stale, contract, "writer-b", 0, ["b"]))
    assert (outcome.status, outcome.attempts) == ("committed", 1)
    assert event_ids(table) == ["a", "b"]


def test_a_concurrent_commit_is_retried_and_both_batches_land_once(monkeypatch, catalog, table, contract):
    mine = second_handle(catalog, contract)
    other = race_on_refresh(
        monkeypatch,
        mine,
        lambda: Committer(table, sleep=SleepRecorder()).commit(
            batch_commit(table, contract, "writer-a", 0, ["a1", "a2"])
        ),
    )

    outcome = Committer(mine, sleep=SleepRecorder()).commit(batch_commit(mine, contract, "writer-b", 0, ["b1"]))

    assert [o.status for o in other] == ["committed"]
    assert outcome.status == "committed"
    assert event_ids(table) == ["a1", "a2", "b1"]
    assert identities(table) == [("writer-a", "0"), ("writer-b", "0")]
    mine_snapshot = table.metadata.snapshot_by_id(outcome.snapshot_id)
    assert mine_snapshot.parent_snapshot_id == other[0].snapshot_id, "rebased onto the concurrent commit"


def test_the_committer_sees_the_conflict_and_waits_by_its_policy(monkeypatch, catalog, table, contract):
    mine = second_handle(catalog, contract)
    race_on_refresh(
        monkeypatch,
        mine,
        lambda: Committer(table, sleep=SleepRecorder()).commit(batch_commit(table, contract, "writer-a", 0, ["a"])),
    )
    sleeps = SleepRecorder()

    outcome = Committer(mine, sleep=sleeps).commit(batch_commit(mine, contract, "writer-b", 0, ["b"]))

    policy = RetryPolicy()
    assert outcome.conflicts >= 1 and outcome.attempts == outcome.conflicts + 1
    assert len(sleeps) == outcome.conflicts
    assert all(policy.min_wait_ms / 1000 <= s <= 1.1 * policy.max_wait_ms / 1000 for s in sleeps)


def test_a_concurrent_replay_of_the_same_batch_lands_once(monkeypatch, catalog, table, contract):
    zombie = second_handle(catalog, contract)
    race_on_refresh(
        monkeypatch,
        zombie,
        lambda: Committer(table, sleep=SleepRecorder()).commit(batch_commit(table, contract, "writer-a", 5, ["a"])),
    )

    outcome = Committer(zombie, sleep=SleepRecorder()).commit(batch_commit(zombie, contract, "writer-a", 5, ["a"]))

    assert event_ids(table) == ["a"]
    assert identities(table) == [("writer-a", "5")]
    assert outcome.status == "skipped_replay"


def test_without_retries_a_conflict_raises_and_adds_nothing(monkeypatch, catalog, table, contract):
    set_table_properties(table, **{"commit.retry.num-retries": "0"})
    mine = second_handle(catalog, contract)
    race_on_refresh(
        monkeypatch,
        mine,
        lambda: Committer(table, sleep=SleepRecorder()).commit(batch_commit(table, contract, "writer-a", 0, ["a"])),
    )
    sleeps = SleepRecorder()

    with pytest.raises(CommitRetriesExhausted) as info:
        Committer(mine, sleep=sleeps).commit(batch_commit(mine, contract, "writer-b", 7, ["b"]))

    message = str(info.value)
    assert "batch 7" in message and "writer-b" in message and "demo.events" in message
    assert sleeps == []
    assert event_ids(table) == ["a"]
    assert committed_snapshot(table, "writer-b", 7) is None


def test_repeated_conflicts_exhaust_the_retry_policy(monkeypatch, catalog, table, contract):
    """Another writer commits after every refresh: each append is stale, until the policy gives up."""
    set_table_properties(
        table, **{"commit.retry.num-retries": "1", "commit.retry.min-wait-ms": "2", "commit.retry.max-wait-ms": "8"}
    )
    mine = second_handle(catalog, contract)
    counter = iter(range(100))
    other = race_on_refresh(
        monkeypatch,
        mine,
        lambda: Committer(table, sleep=SleepRecorder()).commit(
            batch_commit(table, contract, "writer-a", next(counter), ["a"])
        ),
        times=None,
    )
    sleeps = SleepRecorder()

    with pytest.raises(CommitRetriesExhausted, match=r"2 attempt\(s\)"):
        Committer(mine, sleep=sleeps).commit(batch_commit(mine, contract, "writer-b", 0, ["b"]))

    assert len(sleeps) == 1, "one wait between the committer's two attempts"
    assert 0.001 <= sleeps[0] <= 0.008
    assert all(o.status == "committed" for o in other) and len(other) >= 2
    assert committed_snapshot(table, "writer-b", 0) is None
    assert event_ids(table) == ["a"] * len(other)


# -- retry policy ------------------------------------------------------------------------------------
def test_retry_policy_defaults_are_icebergs(table):
    expected = RetryPolicy(num_retries=4, min_wait_ms=100, max_wait_ms=60_000, total_timeout_ms=1_800_000)
    assert RetryPolicy.from_table_properties({}) == expected
    assert RetryPolicy.from_table_properties(table.properties) == expected


def test_retry_policy_reads_commit_retry_properties(table):
    set_table_properties(
        table,
        **{
            "commit.retry.num-retries": "2",
            "commit.retry.min-wait-ms": "10",
            "commit.retry.max-wait-ms": "500",
            "commit.retry.total-timeout-ms": "9000",
        },
    )
    assert RetryPolicy.from_table_properties(table.properties) == RetryPolicy(2, 10, 500, 9000)


@pytest.mark.parametrize("policy", [RetryPolicy(), RetryPolicy(num_retries=10, min_wait_ms=10, max_wait_ms=50)])
def test_waits_stay_between_half_the_minimum_and_the_maximum(policy):
    rng = random.Random(7)
    for retry in range(1, 40):
        for _ in range(50):
            wait = policy.wait_ms(retry, rng)
            assert policy.min_wait_ms <= wait <= 1.1 * policy.max_wait_ms


def test_waits_grow_from_the_minimum_towards_the_maximum():
    policy = RetryPolicy()
    rng = random.Random(11)
    first = [policy.wait_ms(1, rng) for _ in range(200)]
    tenth = [policy.wait_ms(10, rng) for _ in range(200)]
    assert max(first) <= 1.1 * policy.min_wait_ms
    assert max(tenth) > 10 * policy.min_wait_ms
