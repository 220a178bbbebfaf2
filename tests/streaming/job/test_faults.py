"""Faults of the surroundings, for real: the Kafka broker restarts in the middle of a stream, and the
Iceberg catalog is unreachable for 30 s while batches arrive. The service is the real command
(`geoingest run`) in its own process group, as in test_chaos.

The broker is a LocalBroker of the test's own (own home and port), so stopping it disturbs no other
test; it comes back with the same home and port, so its log and offsets survive.

The catalog is the SQLite one. What makes it unreachable to a running service: moving its folder
away. The service's pooled SQLAlchemy connection keeps the database file open, so reads (table
refresh) still answer from the moved file, but SQLite refuses every write on a database whose path
no longer leads to it (SQLITE_READONLY_DBMOVED): pyiceberg's commit raises
sqlalchemy.exc.OperationalError "attempt to write a readonly database" from SqlCatalog.commit_table.
Moving the folder back makes the same connection writable again. (Moving only the file would do
the same to the running service, but any fresh connection would create an empty database at the
old path, and streaming.table.catalog.open_catalog re-creates a missing folder: so nothing here opens the
catalog while it is away.) streaming/table/commit.py treats that error as the catalog being unavailable
and retries the commit with Iceberg's backoff within commit.retry.total-timeout-ms; the batch in
flight waits, the job goes on afterwards.

A commit whose answer is lost (it landed, the connection dropped) followed by an outage longer than
that timeout is simulated in-process: the committer gives up, and the batch's files must not be
deleted then, since they may be in the table (they were, before CommitRetriesExhausted.outcome_unknown).

Spark's Kafka source and the DLQ writer ride out a broker outage for as long as their Kafka client
timeouts allow. With the defaults a restart (seconds) is no problem, but a broker away for more
than a minute fails the query in whichever step is waiting: an executor's consumer looking up its
position (default.api.timeout.ms, 60 s: observed), or polling (kafkaConsumer.pollTimeoutMs, by
default spark.network.timeout, 120 s); the driver's offset lookup (AdminClient default.api.timeout.ms
60 s, tried fetchOffset.numRetries = 3 times: a 150 s outage there was ridden out); the DLQ producer
(max.block.ms 60 s). Under local[N] a failed task is not retried. LONG_OUTAGE_ENV lengthens them
through the settings alone. The restart runs on the Python source too: its tasks' librdkafka
consumers reconnect by themselves and give up only after kafkaConsumer.pollTimeoutMs without a
record, and its planner retries offsets requests as long as Spark's source does.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app.local.broker import LocalBroker, free_port
from app.local.sample import produce, sample_events
from streaming.maintenance.orphans import referenced_files
from streaming.table.catalog import create_table
from tests.conftest import CACHE_DIR
from tests.streaming.job.test_chaos import (
    CONTRACT,
    PARTITIONS,
    Service,
    all_consumed,
    catalog_of,
    coverage_problems,
    end_offsets,
    expected_outcome,
    identities,
    kafka_client,
    offset_coverage,
    orphan_listing,
    read_dead_letters,
    service_env,
)

pytestmark = pytest.mark.integration

WAVE = 20_000  # events per wave; batches of 10 000
BROKER_OUTAGE_S = 15
LONG_BROKER_OUTAGE_S = 75
CATALOG_OUTAGE_S = 30
DRAIN_TIMEOUT_S = 300


class ServiceDied(AssertionError):
    """The service exited while it should have ridden out the fault."""


def start_broker(home: Path) -> LocalBroker:
    broker = LocalBroker(home, CACHE_DIR, port=free_port())
    broker.ensure_jars()
    broker.start()
    return broker


@pytest.fixture
def own_broker(tmp_path) -> LocalBroker:
    """A broker of this test alone: stopping it disturbs no other test."""
    broker = start_broker(tmp_path / "broker")
    yield broker
    broker.stop()


def wait_until(condition, timeout: float, service: Service, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if not service.alive:
            raise ServiceDied(
                f"{service.name} exited {service.process.returncode} while waiting for {what}: {died_of(service)}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} in {timeout} s:\n{service.stderr_tail()}")
        time.sleep(0.5)


def died_of(service: Service) -> str:
    """The service's own last words, and the Python exception Spark reports from foreachBatch."""
    stderr = service.stderr()
    last = next((line for line in reversed(stderr.splitlines()) if line.startswith("geoingest: ")), "")
    raised = re.findall(r"^([a-zA-Z_.]+(?:Error|Exception)[^\n]*)$", stderr, re.MULTILINE)
    return f"{last[:300]} | raised: {raised[-1][:300] if raised else '?'}"


def check_exactly_once(env: dict[str, str], topic: str, valid: set[str], rejected: dict[str, str]) -> None:
    table = catalog_of(env).load_table(CONTRACT.table)
    ids = table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicated rows"
    assert set(ids) == valid, f"{len(valid - set(ids))} lost, {len(set(ids) - valid)} unexpected"
    ends = end_offsets(kafka_client(env), topic)
    assert coverage_problems(offset_coverage(identities(table), topic), ends) == []
    dead = read_dead_letters(kafka_client(env), f"{topic}.dlq")
    assert {m.key.decode() for m in dead} == set(rejected), "every reject in the DLQ (at least once)"


# -- Kafka broker restart ----------------------------------------------------------------------


# Kafka client timeouts long enough for a broker that is away for minutes, through the settings
# alone: the executors' consumer (position lookups: default.api.timeout.ms; polls:
# kafkaConsumer.pollTimeoutMs, whose default is spark.network.timeout), the driver's AdminClient
# (offset lookups: default.api.timeout.ms, tried fetchOffset.numRetries = 3 times) and the DLQ
# producer (max.block.ms, delivery.timeout.ms). Kafka keys go to the source and the DLQ sink alike.
LONG_OUTAGE_ENV = {
    "GEOINGEST_KAFKA__DEFAULT_API_TIMEOUT_MS": "600000",
    "GEOINGEST_KAFKA__MAX_BLOCK_MS": "600000",
    "GEOINGEST_KAFKA__DELIVERY_TIMEOUT_MS": "600000",
    "GEOINGEST_SPARK__SPARK_NETWORK_TIMEOUT": "600s",
}


def broker_outage(broker: LocalBroker, tmp_path: Path, outage_s: float, extra_env: dict[str, str]) -> None:
    """Two waves in the topic; the broker stops while the service reads the third batch (0.3 s after
    the second snapshot), stays down outage_s, comes back with the same home and port, and a third
    wave follows. The service must never exit and the table must hold everything exactly once."""
    topic = f"faults-{uuid.uuid4().hex[:8]}"
    events = list(sample_events(3 * WAVE, seed=11))
    valid, rejected = expected_outcome(events)
    assert produce(broker.bootstrap, topic, events[: 2 * WAVE], progress=False, partitions=PARTITIONS) == 2 * WAVE
    env = service_env(broker.bootstrap, topic, tmp_path, GEOINGEST_MAX_OFFSETS_PER_TRIGGER="10000", **extra_env)
    create_table(catalog_of(env), CONTRACT)
    table = catalog_of(env).load_table(CONTRACT.table)

    service = Service(env, tmp_path, "service")
    try:
        wait_until(lambda: len(identities(table)) >= 2, 240, service, "second snapshot")
        time.sleep(0.3)
        stopped = time.monotonic()
        broker.stop()  # a clean shutdown (SIGTERM), as a rolling restart does
        while time.monotonic() - stopped < outage_s:
            if not service.alive:
                raise ServiceDied(
                    f"the service died {time.monotonic() - stopped:.0f} s into a broker outage: {died_of(service)}"
                )
            time.sleep(0.5)
        broker.start()
        down_s = time.monotonic() - stopped
        assert produce(broker.bootstrap, topic, events[2 * WAVE :], progress=False) == WAVE
        ends = end_offsets({"bootstrap_servers": broker.bootstrap}, topic)
        wait_until(lambda: all_consumed(table, topic, ends), DRAIN_TIMEOUT_S, service, "complete table")
    finally:
        code = service.stop()
    assert code == 0, service.stderr_tail()
    batches = service.batches()
    print(f"broker down {down_s:.0f} s; the longest batch took {max(b['seconds']['total'] for b in batches):.0f} s")
    check_exactly_once(env, topic, valid, rejected)


@pytest.mark.parametrize("source", ["spark-kafka", "python"])
def test_a_broker_restart_in_the_middle_of_a_stream_loses_nothing(own_broker, tmp_path, source):
    """With the default client timeouts: a restart takes seconds, the clients wait for it, with
    Spark's Kafka source and with the Python one (whose tasks' librdkafka consumers reconnect)."""
    broker_outage(own_broker, tmp_path, BROKER_OUTAGE_S, {"GEOINGEST_SOURCE": source})


def test_a_broker_away_longer_than_the_default_timeouts_is_ridden_out_with_longer_ones(own_broker, tmp_path):
    """75 s: with the defaults the executors' consumer gives up after 60 s ("Timeout of 60000ms
    expired before the position for partition ... could be determined"), the task fails, and with
    no task retry under local[N] the query and the service die. LONG_OUTAGE_ENV rides it out."""
    broker_outage(own_broker, tmp_path, LONG_BROKER_OUTAGE_S, LONG_OUTAGE_ENV)


def test_the_local_broker_formats_any_cluster_id(tmp_path, monkeypatch):
    """A random base64url cluster id starts with '-' 1 time in 64; kafka-storage's argparse took
    `-t -xyz` for two flags and the broker never started (seen twice in these test sessions)."""
    import app.local.broker

    real_urandom = os.urandom
    # 0xf8 = 0b111110..: the first base64url character is '-'
    monkeypatch.setattr(app.local.broker.os, "urandom", lambda n: b"\xf8" + real_urandom(n - 1))
    broker = LocalBroker(tmp_path / "broker", CACHE_DIR, port=free_port())
    broker.ensure_jars()
    try:
        assert broker.start().running
    finally:
        broker.stop()


# -- catalog outage ------------------------------------------------------------------------------


@dataclass
class OutageRun:
    """What one catalog outage did to the service, and what the table held in the end."""

    env: dict[str, str] = field(repr=False)
    topic: str
    valid: set[str] = field(repr=False)
    rejected: dict[str, str] = field(repr=False)
    outage_s: float = 0.0
    service_died: bool = False
    died_after_s: float | None = None  # since the catalog went away
    exit_code: int | None = None
    died_of: str = ""
    restarts: int = 0
    commit_seconds: list[float] = field(default_factory=list)  # of every batch logged
    retry_warnings: int = 0  # "catalog unavailable, retrying the commit" log lines
    batches_after_outage: int = 0  # batch lines logged after the catalog came back
    services: list[Service] = field(default_factory=list, repr=False)


@pytest.fixture(scope="module")
def catalog_outage(kafka, tmp_path_factory) -> OutageRun:
    """The service runs; its catalog goes away for 30 s while batches arrive, then comes back.

    If the service dies, it is restarted once the catalog is back (as an orchestrator would), with
    --until-idle runs until the topic is drained. The tests below read what happened."""
    tmp = tmp_path_factory.mktemp("catalog-outage")
    topic = f"outage-{uuid.uuid4().hex[:8]}"
    events = list(sample_events(3 * WAVE, seed=13))
    valid, rejected = expected_outcome(events)
    assert produce(kafka.bootstrap, topic, events[:WAVE], progress=False, partitions=PARTITIONS) == WAVE
    env = service_env(kafka.bootstrap, topic, tmp, GEOINGEST_MAX_OFFSETS_PER_TRIGGER="10000")
    create_table(catalog_of(env), CONTRACT)
    run = OutageRun(env, topic, valid, rejected)
    table = catalog_of(env).load_table(CONTRACT.table)
    folder = tmp / "catalog"
    away = tmp / "catalog.away"

    service = Service(env, tmp, "service")
    run.services.append(service)
    try:
        wait_until(lambda: len(identities(table)) >= 1, 240, service, "first snapshot")
        del table  # nothing of this process may touch the catalog while it is away
        folder.rename(away)
        gone = time.monotonic()
        try:
            # Batches arrive during the outage.
            assert produce(kafka.bootstrap, topic, events[WAVE : 2 * WAVE], progress=False) == WAVE
            while time.monotonic() - gone < CATALOG_OUTAGE_S:
                if not service.alive and not run.service_died:
                    run.service_died = True
                    run.died_after_s = round(time.monotonic() - gone, 1)
                    run.exit_code = service.process.returncode
                    run.died_of = died_of(service)
                time.sleep(0.5)
        finally:
            away.rename(folder)  # fails loudly if something re-created the folder meanwhile
            run.outage_s = round(time.monotonic() - gone, 1)
            back_at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())  # as the service's log lines
        assert produce(kafka.bootstrap, topic, events[2 * WAVE :], progress=False) == WAVE
        ends = end_offsets({"bootstrap_servers": kafka.bootstrap}, topic)
        table = catalog_of(env).load_table(CONTRACT.table)
        if service.alive:
            try:
                wait_until(lambda: all_consumed(table, topic, ends), DRAIN_TIMEOUT_S, service, "complete table")
            except ServiceDied:
                run.service_died = True
                run.exit_code = service.process.returncode
                run.died_of = died_of(service)
        if not run.service_died:
            assert service.stop() == 0, service.stderr_tail()
        else:
            service.kill()
            # The restart replays the failed batch from Spark's offset log.
            restarted = Service(env, tmp, "restart", "--until-idle")
            run.services.append(restarted)
            run.restarts += 1
            assert restarted.wait(timeout=DRAIN_TIMEOUT_S) == 0, restarted.stderr_tail()
    finally:
        for started in run.services:
            if started.alive:
                started.kill()
    run.commit_seconds = [b["seconds"].get("commit", 0.0) for s in run.services for b in s.batches()]
    lines = [line for s in run.services for line in s.log()]
    run.retry_warnings = sum(1 for line in lines if line.get("msg") == "catalog unavailable, retrying the commit")
    run.batches_after_outage = sum(1 for line in lines if line.get("msg") == "batch" and line["ts"] > back_at)
    print(f"catalog outage: {run}")
    return run


def test_commits_retry_through_a_30_s_catalog_outage_and_the_job_continues(catalog_outage):
    """streaming/table/commit.py retries a commit that cannot reach the catalog (sqlalchemy's
    OperationalError here) with Iceberg's backoff, for up to commit.retry.total-timeout-ms."""
    run = catalog_outage
    if run.service_died:
        raise ServiceDied(
            f"the service exited {run.exit_code} {run.died_after_s} s into a "
            f"{run.outage_s} s catalog outage: {run.died_of}"
        )
    assert run.outage_s >= CATALOG_OUTAGE_S
    assert run.retry_warnings >= 2, "the commit was retried while the catalog was away"
    assert max(run.commit_seconds) >= CATALOG_OUTAGE_S / 2, "a commit waited for the catalog to come back"
    assert run.batches_after_outage >= 2, "the job went on committing batches afterwards"


def test_a_catalog_outage_loses_and_duplicates_nothing(catalog_outage):
    run = catalog_outage
    check_exactly_once(run.env, run.topic, run.valid, run.rejected)
    # A batch that failed to commit left its files behind: orphans, never referenced.
    table = catalog_of(run.env).load_table(CONTRACT.table)
    referenced = referenced_files(table)
    orphans = orphan_listing(run.env)
    assert all(o["path"] not in referenced for o in orphans)
    if run.service_died:
        assert orphans, "the failed batch's files are left for `geoingest table orphans`"


def test_a_lost_commit_answer_and_a_long_outage_leave_the_committed_files_alone(kafka, spark, topic, tmp_path):
    """The commit lands, its answer is lost, and the catalog stays away past
    commit.retry.total-timeout-ms: the committer gives up without knowing. BatchProcessor used to
    take CommitRetriesExhausted for 'not in the table' and delete the batch's files, leaving a
    committed snapshot that points at deleted files."""
    from pyiceberg.table import Table
    from sqlalchemy.exc import OperationalError

    from streaming.job.config import JobConfig
    from streaming.job.processor import BatchProcessor
    from streaming.maintenance.orphans import referenced_files
    from streaming.table.catalog import open_catalog
    from streaming.table.commit import committed_snapshot
    from tests.conftest import produce_records
    from tests.streaming.job.test_reliability import good_records

    assert produce_records(kafka.bootstrap, topic, good_records("l", 50)) == 50
    catalog = open_catalog(
        "test", {"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path / 'wh'}"}
    )
    table, _ = create_table(catalog, CONTRACT)
    with table.transaction() as tx:  # a short wait for the catalog, so the test is quick
        tx.set_properties({"commit.retry.total-timeout-ms": "1500", "commit.retry.min-wait-ms": "50"})
    processor = BatchProcessor(spark, table, CONTRACT, JobConfig(kafka.bootstrap, topic, str(tmp_path / "ck"), "w-1"))
    batch = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )

    # The commit reaches the database, then the connection drops before the answer, and the
    # database stays unreachable: every later load_table (the committer's refresh) fails.
    real_commit, real_load = catalog.commit_table, catalog.load_table
    gone = []

    def commit_then_lose_the_answer(*args, **kwargs):
        real_commit(*args, **kwargs)
        gone.append(True)
        raise OperationalError("COMMIT", {}, ConnectionError("server closed the connection unexpectedly"))

    def load_while_reachable(*args, **kwargs):
        if gone:
            raise OperationalError("SELECT", {}, ConnectionError("could not connect to server"))
        return real_load(*args, **kwargs)

    catalog.commit_table, catalog.load_table = commit_then_lose_the_answer, load_while_reachable
    try:
        with pytest.raises(Exception) as failed:
            processor(batch, 0)
    finally:
        catalog.commit_table, catalog.load_table = real_commit, real_load
    print(f"the batch failed with {type(failed.value).__name__}: {str(failed.value)[:200]}")

    fresh: Table = catalog.load_table(CONTRACT.table)
    assert committed_snapshot(fresh, "w-1", 0) is not None, "the commit did land"
    missing = [p for p in referenced_files(fresh) if not Path(p).exists()]
    assert missing == [], f"{len(missing)} data files of the committed snapshot were deleted"
    assert fresh.scan().to_arrow().num_rows == 50
