"""Several writer processes commit to one table at once, on SQLite, on PostgreSQL and on a REST catalog.

Each writer is a real process with its own catalog connection, as a job's driver would be. It
decodes its own GeoJSON points, writes them as GeoParquet data files, waits at a barrier with the
others, and then commits its batches back to back through `Committer`, so that the writers race
for the table and the catalog's optimistic check refuses the losers. Nothing is mocked: the
conflicts are the catalog's own `CommitFailedException`s.

The SQLite catalog is the embedded one; the PostgreSQL catalog is the production path, on a
fresh server started by `tests.postgres` from Debian's packages.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import time
import traceback
import uuid
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.table import Table

from app.local.rest_catalog import LocalRestCatalog
from streaming.contract import Contract, load_contract
from streaming.decode.decoder import HILBERT, REJECT_REASON, Decoder
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import (
    BATCH_ID,
    WRITER_ID,
    BatchCommit,
    CommitRetriesExhausted,
    Committer,
    committed_snapshot,
)
from streaming.write.data_files import DataFileRecord, GeoParquetWriter
from tests.conftest import CACHE_DIR
from tests.lakehouse import WAREHOUSE_BUCKET
from tests.postgres import postgres_server_info, postgres_uri  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration

CONTRACT_PATH = Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json"
TOPIC = "demo-events"
WRITERS = 4
BATCHES = 20
ROWS = 200
# Quick retries: many of them, short waits (Iceberg's defaults are 4 retries from 100 ms to 60 s).
# Back to back, one of 4 writers has lost up to 17 races in a row for one commit here
# (bench/concurrency.py); 100 keeps a shared, loaded machine from failing the test.
RACE_PROPERTIES = {
    "commit.retry.num-retries": "100",
    "commit.retry.min-wait-ms": "10",
    "commit.retry.max-wait-ms": "500",
    "commit.retry.total-timeout-ms": "300000",
}
RUN_TIMEOUT_S = 300


# -- the writer process --------------------------------------------------------------------------------
def event_id(writer_id: str, batch_id: int, row: int) -> str:
    return f"{writer_id}-b{batch_id:04d}-r{row:05d}"


def write_batch_files(
    table: Table, contract: Contract, decoder: Decoder, writer_index: int, writer_id: str, batch_id: int, rows: int
) -> tuple[DataFileRecord, ...]:
    """Decode `rows` GeoJSON points of this writer and batch and write them as GeoParquet files."""
    values = []
    for i in range(rows):
        n = (writer_index * 100_003 + batch_id * 1_009 + i) * 0.6180339887
        lon, lat = -179.0 + (n * 358.0) % 358.0, -89.0 + (n * 0.7071 * 178.0) % 178.0
        values.append(
            json.dumps(
                {
                    "type": "Feature",
                    "id": event_id(writer_id, batch_id, i),
                    "geometry": {"type": "Point", "coordinates": [round(lon, 6), round(lat, 6)]},
                    "properties": {"kind": "probe", "name": writer_id, "speed": float(i)},
                }
            ).encode()
        )
    first_offset = batch_id * rows
    batch = pa.record_batch(
        {
            "key": pa.nulls(rows, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array([TOPIC] * rows),
            "partition": pa.array([writer_index] * rows, pa.int32()),
            "offset": pa.array(range(first_offset, first_offset + rows), pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000 + first_offset] * rows, pa.timestamp("us")),
        }
    )
    decoded = pa.Table.from_batches([decoder.decode(batch)])
    valid = decoded.filter(pc.is_null(decoded.column(REJECT_REASON))).sort_by(HILBERT)
    if valid.num_rows != rows:
        raise AssertionError(f"{rows - valid.num_rows} of {writer_id}'s rows were rejected")
    writer = GeoParquetWriter(
        contract, table.properties, table.io.properties, table.location() + "/data", f"{writer_id}-b{batch_id:04d}"
    )
    return tuple(writer.write(valid.to_batches()))


def writer_process(
    catalog_name: str,
    catalog_props: dict[str, str],
    writer_index: int,
    writer_id: str,
    batches: int,
    rows: int,
    barrier,
    results,
) -> None:
    """One writer: opens the catalog itself, writes its files, then commits them all at the barrier.

    Reports ("started", writer, time) at the barrier, ("outcome", writer, batch, CommitOutcome as
    dict) per commit and ("done", writer, started, finished) at the end. A commit that exhausts
    its retries is reported as ("exhausted", writer, batch, message, attempts, conflicts) and then
    raised: the process dies loudly with a non-zero exit code, as the job does, and commits
    nothing after that batch. Anything else is reported as ("error", writer, traceback).
    """
    try:
        contract = load_contract(CONTRACT_PATH)
        table = open_catalog(catalog_name, catalog_props).load_table(contract.table)
        decoder = Decoder(contract)
        pending = [
            BatchCommit(
                writer_id,
                b,
                {TOPIC: {writer_index: (b * rows, b * rows + rows - 1)}},
                write_batch_files(table, contract, decoder, writer_index, writer_id, b, rows),
            )
            for b in range(batches)
        ]
        committer = Committer(table)
        barrier.wait(timeout=120)
        started = time.time()
        results.put(("started", writer_id, started))
        for batch in pending:
            try:
                outcome = committer.commit(batch)
            except CommitRetriesExhausted as exc:
                results.put(("exhausted", writer_id, batch.batch_id, str(exc), exc.attempts, exc.conflicts))
                raise
            results.put(("outcome", writer_id, batch.batch_id, asdict(outcome)))
        results.put(("done", writer_id, started, time.time()))
    except CommitRetriesExhausted:
        raise
    except BaseException:
        results.put(("error", writer_id, traceback.format_exc()))
        raise


def run_writers(
    catalog_name: str,
    catalog_props: dict[str, str],
    writers: int,
    batches: int,
    rows: int,
    timeout_s: float = RUN_TIMEOUT_S,
) -> tuple[list[tuple], dict[str, int]]:
    """Runs `writers` writer processes to the end; returns their reports and exit codes."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(writers)
    results = ctx.Queue()
    procs = {}
    for i in range(writers):
        writer_id = f"w{i}-{uuid.uuid4().hex[:6]}"
        procs[writer_id] = ctx.Process(
            target=writer_process,
            name=f"writer-{writer_id}",
            args=(catalog_name, catalog_props, i, writer_id, batches, rows, barrier, results),
        )
        procs[writer_id].start()
    reports: list[tuple] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                reports.append(results.get(timeout=0.5))
                if reports[-1][0] == "error":
                    barrier.abort()  # the others need not wait for a writer that died
                continue
            except queue.Empty:
                pass
            if not any(p.is_alive() for p in procs.values()):
                # The queue's feeder threads are flushed before a process exits: one last drain.
                while True:
                    try:
                        reports.append(results.get(timeout=0.5))
                    except queue.Empty:
                        break
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"writers still running after {timeout_s} s; reports so far: {reports[-5:]}")
    finally:
        for proc in procs.values():
            if proc.is_alive():
                proc.terminate()
            proc.join(timeout=30)
    return reports, {w: p.exitcode for w, p in procs.items()}


# -- what the table holds ------------------------------------------------------------------------------
def committed_identities(table: Table) -> list[tuple[str, int]]:
    table.refresh()
    out = []
    for snapshot in table.metadata.snapshots:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        out.append((props.get(WRITER_ID), int(props.get(BATCH_ID, -1))))
    return out


def table_event_ids(table: Table) -> list[str]:
    table.refresh()
    return table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()


def expected_ids(writer_id: str, batch_ids, rows: int) -> set[str]:
    return {event_id(writer_id, b, i) for b in batch_ids for i in range(rows)}


# -- fixtures ------------------------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgres", "rest"])
def catalog_config(request, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """(catalog name, properties) of a fresh catalog: the embedded SQLite one, one on PostgreSQL, or
    Iceberg's REST catalog server with the table in a bucket (the lakehouse shape)."""
    warehouse = f"file://{tmp_path / 'warehouse'}"
    if request.param == "sqlite":
        return "conc", {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": warehouse}
    if request.param == "rest":
        store = request.getfixturevalue("object_store")
        # A server of its own: every test here makes the same table.
        catalog = LocalRestCatalog(
            tmp_path / "rest-catalog",
            CACHE_DIR,
            f"s3://{WAREHOUSE_BUCKET}/conc-{uuid.uuid4().hex[:8]}",
            store.io_properties(),
        )
        catalog.start()
        request.addfinalizer(catalog.stop)
        return "conc", catalog.catalog_properties()
    uri = request.getfixturevalue("postgres_uri")
    # One server per session: each test gets its own catalog name, hence its own rows.
    return f"conc_{uuid.uuid4().hex[:10]}", {"type": "sql", "uri": uri, "warehouse": warehouse}


def new_table(catalog_name: str, catalog_props: dict[str, str], properties: dict[str, str]) -> Table:
    catalog = open_catalog(catalog_name, catalog_props)
    table, created = create_table(catalog, load_contract(CONTRACT_PATH))
    assert created
    with table.transaction() as tx:
        tx.set_properties(properties)
    if catalog_props["type"] == "sql":
        expected_dialect = "sqlite" if catalog_props["uri"].startswith("sqlite") else "postgresql"
        assert catalog.engine.dialect.name == expected_dialect
    return table


# -- tests ---------------------------------------------------------------------------------------------
def test_racing_writers_commit_every_batch_once(catalog_config):
    name, props = catalog_config
    table = new_table(name, props, RACE_PROPERTIES)

    reports, exit_codes = run_writers(name, props, WRITERS, BATCHES, ROWS)

    errors = [r for r in reports if r[0] in ("error", "exhausted")]
    assert not errors, errors
    assert all(code == 0 for code in exit_codes.values()), exit_codes
    outcomes = {(r[1], r[2]): r[3] for r in reports if r[0] == "outcome"}
    expected = {(w, b) for w in exit_codes for b in range(BATCHES)}
    assert set(outcomes) == expected
    # Every commit landed, none was taken for a replay, and the counts add up.
    assert {o["status"] for o in outcomes.values()} == {"committed"}
    assert all(o["attempts"] == o["conflicts"] + 1 for o in outcomes.values())
    conflicts = sum(o["conflicts"] for o in outcomes.values())
    assert conflicts > 0, "the writers never collided: the race did not happen"
    assert any(o["conflicts"] > 0 for o in outcomes.values())
    print(
        f"\n{name}: {len(outcomes)} commits, {conflicts} conflicts retried, "
        f"max {max(o['conflicts'] for o in outcomes.values())} on one commit"
    )

    # One snapshot per (writer, batch), and it is the one each writer was told of.
    identities = committed_identities(table)
    assert Counter(identities) == Counter(expected), "a batch is missing or was committed twice"
    for (writer_id, batch_id), outcome in outcomes.items():
        snapshot = committed_snapshot(table, writer_id, batch_id)
        assert snapshot.snapshot_id == outcome["snapshot_id"]
        assert snapshot.summary["added-records"] == str(ROWS)
    # A linear history: every snapshot's parent is the one before it.
    snapshots = table.metadata.snapshots
    assert [s.parent_snapshot_id for s in snapshots[1:]] == [s.snapshot_id for s in snapshots[:-1]]

    # No row lost, none duplicated.
    ids = table_event_ids(table)
    assert len(ids) == WRITERS * BATCHES * ROWS
    assert set(ids) == set().union(*(expected_ids(w, range(BATCHES), ROWS) for w in exit_codes))
    assert len(set(ids)) == len(ids)
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert len(files) == len(set(files)) == WRITERS * BATCHES


def test_exhausted_retries_fail_the_writer_loudly_and_leave_its_batch_out(catalog_config):
    """With commit.retry.num-retries=0 the first conflict ends a writer: it raises
    CommitRetriesExhausted naming the table, batch and writer, exits non-zero, and commits
    neither that batch nor any later one."""
    name, props = catalog_config
    table = new_table(
        name, props, {"commit.retry.num-retries": "0", "commit.retry.min-wait-ms": "1", "commit.retry.max-wait-ms": "5"}
    )
    rows = 20

    reports, exit_codes = run_writers(name, props, WRITERS, BATCHES, rows)

    assert not [r for r in reports if r[0] == "error"]
    exhausted = {r[1]: r for r in reports if r[0] == "exhausted"}
    assert exhausted, "no writer met a conflict: the race did not happen"
    print(f"\n{name}: {len(exhausted)} of {WRITERS} writers gave up; first: {next(iter(exhausted.values()))[3]}")
    committed: dict[str, list[int]] = {w: [] for w in exit_codes}
    for r in reports:
        if r[0] == "outcome":
            assert r[3]["status"] == "committed" and r[3]["conflicts"] == 0
            committed[r[1]].append(r[2])

    identities = committed_identities(table)
    assert len(identities) == len(set(identities))
    for writer_id, code in exit_codes.items():
        in_table = sorted(b for w, b in identities if w == writer_id)
        assert in_table == sorted(committed[writer_id])
        if writer_id not in exhausted:
            assert code == 0 and in_table == list(range(BATCHES))
            continue
        _, _, batch_id, message, attempts, conflicts = exhausted[writer_id]
        assert code != 0, f"{writer_id} exhausted its retries but exited with 0"
        assert (attempts, conflicts) == (1, 1)
        assert f"batch {batch_id} " in message and f"writer {writer_id} " in message
        assert "demo.events" in message and "1 attempt(s)" in message
        # Never half-committed, never skipped: the batches before it landed, it and later ones did not.
        assert in_table == list(range(batch_id))
        assert committed_snapshot(table, writer_id, batch_id) is None

    ids = table_event_ids(table)
    assert len(ids) == len(set(ids))
    assert set(ids) == set().union(*(expected_ids(w, bs, rows) for w, bs in committed.items()))
    for writer_id, report in exhausted.items():
        assert not expected_ids(writer_id, [report[2]], rows) & set(ids)
