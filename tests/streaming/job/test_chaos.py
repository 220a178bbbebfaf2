"""Chaos: `kill -9` the ingest service at random moments of a long run, restart it each time with
the same checkpoint, and check that the table ends up holding every valid event exactly once.

The service is the real command (`geoingest run`) in its own process group, so SIGKILL takes the
driver, Spark's JVM and its Python workers down together, as a crashed container would. A run that
dies by itself is restarted too and recorded (the test allows none: a restarted service used to
exit after a batch recovered from Spark's offset log, see the last test). Kill
moments come from a seeded RNG: some a random time after the process started (Spark may still be
starting, or a batch be anywhere in flight), some a random fraction of a batch after the run's
newest snapshot. One kill is aimed: with GEOINGEST_HOLD_AFTER_COMMIT_FILE the service writes a
marker after an Iceberg commit and holds before Spark records the batch in its checkpoint, and
is killed there; its restart must recognise the replayed batch and skip it.

Where each kill fell is read back from the dead process's state: the Spark checkpoint
(`offsets/N` written, `commits/N` not) against the table's snapshots (is (writer id, N) there?).

The harness here is shared with bench/reliability.py, which runs it at a larger scale.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from kafka import KafkaConsumer

from app.local.sample import SampleEvent, produce, sample_events
from app.settings import load_settings
from streaming.contract import load_contract
from streaming.decode.decoder import REJECT_REASON, Decoder
from streaming.maintenance.orphans import referenced_files
from streaming.source.admin import client_config
from streaming.storage import list_files
from streaming.table.catalog import create_table, open_catalog
from streaming.table.commit import BATCH_ID, KAFKA_OFFSETS, WRITER_ID
from streaming.write.dead_letter import (
    REASON_HEADER,
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER,
)
from tests.conftest import CACHE_DIR

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
CONTRACT_FILE = ROOT / "schemas" / "demo_events.json"
CONTRACT = load_contract(CONTRACT_FILE)
GEOINGEST = Path(sys.executable).parent / "geoingest"
PARTITIONS = 4

# Kill phases, read back from the dead process's checkpoint and the table.
SPARK_STARTING = "spark_starting"  # the service had not started its query yet
BEFORE_ICEBERG_COMMIT = "before_iceberg_commit"  # a batch planned in the checkpoint, not in the table
AFTER_ICEBERG_COMMIT = "after_iceberg_commit_before_checkpoint"  # in the table, not in the checkpoint
BETWEEN_BATCHES = "between_batches"  # the last planned batch is committed on both sides
# the run was replaying a batch an earlier run had committed to the table (killed after its commit)
REPLAYING_COMMITTED = "replaying_a_batch_already_in_the_table"
# a batch planned, not in the table, and the run had written some of its data files: they stay orphans
WRITING_FILES = "data_files_written_before_iceberg_commit"


# -- the service as a process -------------------------------------------------------------------


def service_env(bootstrap: str, topic: str, workdir: Path, **extra: str) -> dict[str, str]:
    """Environment of a `geoingest` process working in `workdir` (catalog, warehouse, checkpoints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEOINGEST_")}
    env.update(
        {
            "GEOINGEST_BOOTSTRAP_SERVERS": bootstrap,
            "GEOINGEST_TOPIC": topic,
            "GEOINGEST_CATALOG__URI": f"sqlite:///{workdir / 'catalog' / 'catalog.db'}",
            "GEOINGEST_CATALOG__WAREHOUSE": f"file://{workdir / 'warehouse'}",
            "GEOINGEST_CHECKPOINT_LOCATION": str(workdir / "checkpoints"),
            "GEOINGEST_SPARK_MASTER": "local[2]",
            "GEOINGEST_DRIVER_MEMORY": "1g",
            "GEOINGEST_CACHE_DIR": str(CACHE_DIR),
            "GEOINGEST_METRICS_PORT": "0",
            "GEOINGEST_TRIGGER_INTERVAL": "1 second",
            "GEOINGEST_MAX_OFFSETS_PER_TRIGGER": "20000",
        }
    )
    env.update(extra)
    return env


def catalog_of(env: dict[str, str]):
    """The catalog the service with this environment writes to (whichever shape it is)."""
    settings = load_settings(env=env)
    return open_catalog(settings.catalog_name, settings.catalog)


def kafka_client(env: dict[str, str]) -> dict:
    """kafka-python options of the service's broker connection (SASL_SSL on the lakehouse shape)."""
    return {
        "bootstrap_servers": env["GEOINGEST_BOOTSTRAP_SERVERS"],
        **client_config(load_settings(env=env).kafka, client=KafkaConsumer),
    }


def checkpoint_dir(env: dict[str, str]) -> Path:
    return Path(env["GEOINGEST_CHECKPOINT_LOCATION"]) / CONTRACT.table


def geoingest(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    result = subprocess.run([str(GEOINGEST), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"geoingest {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


class Service:
    """One `geoingest run` process, leader of its own process group (driver, JVM, Python workers)."""

    def __init__(
        self,
        env: dict[str, str],
        log_dir: Path,
        name: str,
        *args: str,
        extra_env: dict[str, str] | None = None,
        contract: Path = CONTRACT_FILE,
    ):
        self.name = name
        self.metrics_port = int({**env, **(extra_env or {})}.get("GEOINGEST_METRICS_PORT", "0"))
        self.stderr_path = log_dir / f"{name}.stderr"
        self.stdout_path = log_dir / f"{name}.stdout"
        self.started = time.monotonic()
        self.started_wall = time.time()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                [str(GEOINGEST), "run", "--contract", str(contract), *args],
                env={**env, **(extra_env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group and wait until nothing of it is left."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        raise AssertionError(f"process group {self.process.pid} survived SIGKILL")

    def stop(self, timeout: float = 120) -> int:
        """SIGTERM the driver (it stops after the batch in progress); SIGKILL the group if it hangs."""
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(ProcessLookupError):  # leftovers of the group, if any
            os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.returncode

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not finish in {timeout} s:\n{self.stderr_tail()}") from None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stderr_tail(self, chars: int = 3000) -> str:
        return self.stderr()[-chars:]

    def log(self) -> list[dict]:
        """The service's JSON log lines (Spark's own log lines are skipped)."""
        lines = []
        for line in self.stderr().splitlines():
            if line.startswith('{"ts"'):
                with contextlib.suppress(json.JSONDecodeError):
                    lines.append(json.loads(line))
        return lines

    def batches(self) -> list[dict]:
        return [line["batch"] for line in self.log() if line.get("msg") == "batch"]

    def query_started(self) -> bool:
        return any(line.get("msg") == "starting" for line in self.log())


# -- state read back from the table and the checkpoint ------------------------------------------


@dataclass(frozen=True)
class Identity:
    writer_id: str
    batch_id: int
    offsets: dict  # topic -> partition (str) -> [first, last]
    rows: int


def identities(table) -> list[Identity]:
    table.refresh()
    result = []
    for snapshot in table.metadata.snapshots:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if WRITER_ID in props:
            result.append(
                Identity(
                    props[WRITER_ID],
                    int(props[BATCH_ID]),
                    json.loads(props.get(KAFKA_OFFSETS, "{}")),
                    int(props.get("geoingest.rows", 0)),
                )
            )
    return result


def checkpoint_batches(ckpt: Path) -> tuple[set[int], set[int]]:
    """(batch ids planned in offsets/, batch ids recorded in commits/) of a Spark checkpoint."""

    def ids(sub: str) -> set[int]:
        folder = ckpt / sub
        return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()

    return ids("offsets"), ids("commits")


def writer_id_of(ckpt: Path) -> str | None:
    path = ckpt / "geoingest-writer-id"
    return path.read_text().strip() if path.exists() else None


def files_of_batch(table, writer_id: str, batch_id: int, since_wall: float) -> list[str]:
    """Data files of one batch written since a wall-clock time (streaming/job/processor.py names them
    <writer id>-b<batch id, 9 digits>-<uuid>.parquet), wherever the table keeps them."""
    prefix = f"{writer_id}-b{batch_id:09d}-"
    return [
        f.uri
        for f in list_files(table.io, f"{table.location().rstrip('/')}/data")
        if f.uri.rsplit("/", 1)[-1].startswith(prefix)
        and f.uri.endswith(".parquet")
        and (f.mtime_s is None or f.mtime_s >= since_wall)
    ]


def kill_phase(
    service: Service, ckpt: Path, table, in_table_before: set[tuple[str, int]] = frozenset()
) -> tuple[str, int | None]:
    """Where the (dead) service was: see the phase constants above. Returns (phase, batch id).
    in_table_before: the (writer id, batch id) pairs the table held when the run started."""
    planned, committed = checkpoint_batches(ckpt)
    if not service.query_started() or not planned:
        return SPARK_STARTING, None
    last = max(planned)
    if last in committed:
        return BETWEEN_BATCHES, last
    writer = writer_id_of(ckpt)
    if (writer, last) in in_table_before:
        return REPLAYING_COMMITTED, last
    if any(i.writer_id == writer and i.batch_id == last for i in identities(table)):
        return AFTER_ICEBERG_COMMIT, last
    if files_of_batch(table, writer, last, service.started_wall):
        return WRITING_FILES, last
    return BEFORE_ICEBERG_COMMIT, last


# -- events and what should become of them -------------------------------------------------------


def expected_outcome(events: list[SampleEvent]) -> tuple[set[str], dict[str, str]]:
    """(ids of the valid events, reject reason by key of the others), by the service's own decoder."""
    decoder = Decoder(CONTRACT)
    valid: set[str] = set()
    rejected: dict[str, str] = {}
    for start in range(0, len(events), 50_000):
        chunk = events[start : start + 50_000]
        n = len(chunk)
        batch = pa.RecordBatch.from_pydict(
            {
                "key": pa.array([e.key for e in chunk], pa.binary()),
                "value": pa.array([e.value for e in chunk], pa.binary()),
                "topic": pa.array(["t"] * n),
                "partition": pa.array([0] * n, pa.int32()),
                "offset": pa.array(range(start, start + n), pa.int64()),
                "timestamp": pa.array([0] * n, pa.timestamp("us")),
                "headers": pa.array(
                    [[{"key": k, "value": v} for k, v in e.headers] or None for e in chunk],
                    pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
                ),
            }
        )
        decoded = decoder.decode(batch)
        reasons = decoded.column(REJECT_REASON).to_pylist()
        for event, reason in zip(chunk, reasons):
            if reason is None:
                valid.add(event.key.decode())
            else:
                rejected[event.key.decode()] = reason
    return valid, rejected


def read_dead_letters(client: dict, topic: str, timeout_ms: int = 10_000) -> list:
    consumer = KafkaConsumer(
        topic, **client, auto_offset_reset="earliest", consumer_timeout_ms=timeout_ms, enable_auto_commit=False
    )
    try:
        return list(consumer)
    finally:
        consumer.close()


def offset_coverage(idents: Iterable[Identity], topic: str) -> dict[int, list[tuple[int, int]]]:
    """Per partition, the sorted offset ranges the table's snapshots recorded for `topic`."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for ident in idents:
        for partition, (first, last) in ident.offsets.get(topic, {}).items():
            ranges.setdefault(int(partition), []).append((first, last))
    return {p: sorted(r) for p, r in ranges.items()}


def coverage_problems(ranges: dict[int, list[tuple[int, int]]], end_offsets: dict[int, int]) -> list[str]:
    """Gaps and overlaps between the recorded ranges, and what is missing at either end."""
    problems = []
    for partition, end in sorted(end_offsets.items()):
        expected_next = 0
        for first, last in ranges.get(partition, []):
            if first > expected_next:
                problems.append(f"partition {partition}: offsets {expected_next}..{first - 1} in no snapshot")
            elif first < expected_next:
                problems.append(
                    f"partition {partition}: offsets {first}..{min(last, expected_next - 1)} in two snapshots"
                )
            expected_next = max(expected_next, last + 1)
        if expected_next != end:
            problems.append(f"partition {partition}: snapshots end at {expected_next}, the topic at {end}")
    return problems


def all_consumed(table, topic: str, ends: dict[int, int]) -> bool:
    """The table's snapshots record every offset of the topic (each once)."""
    return coverage_problems(offset_coverage(identities(table), topic), ends) == []


def end_offsets(client: dict, topic: str) -> dict[int, int]:
    from kafka import TopicPartition

    consumer = KafkaConsumer(**client)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return {tp.partition: off for tp, off in consumer.end_offsets(parts).items()}
    finally:
        consumer.close()


# -- the chaos run ------------------------------------------------------------------------------


@dataclass
class Kill:
    number: int
    strategy: str
    phase: str
    batch_id: int | None
    after_s: float  # since the process started
    batches_logged: int  # batch lines the run logged before it died


@dataclass
class SelfExit:
    """A run that died before the harness killed it."""

    run: str
    code: int
    after_s: float
    error: str  # the `geoingest: ...` line, or the tail of stderr


class ExitedByItself(Exception):
    pass


@dataclass
class ChaosRun:
    kills: list[Kill] = field(default_factory=list)
    self_exits: list[SelfExit] = field(default_factory=list)
    services: list[Service] = field(default_factory=list)
    hold_batch_ids: list[int] = field(default_factory=list)
    final_summary: dict = field(default_factory=dict)
    seconds: float = 0.0

    def batch_lines(self) -> list[tuple[str, dict]]:
        return [(s.name, b) for s in self.services for b in s.batches()]


def wait_for(condition, timeout: float, service: Service | None = None, every_s: float = 0.2) -> bool:
    """Poll `condition` until true; False on timeout. Raises ExitedByItself if the service died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if service is not None and not service.alive:
            raise ExitedByItself()
        time.sleep(every_s)
    return False


def self_exit_of(service: Service) -> SelfExit:
    stderr = service.stderr()
    error = next((line for line in reversed(stderr.splitlines()) if line.startswith("geoingest: ")), stderr[-500:])
    return SelfExit(service.name, service.process.returncode, round(time.monotonic() - service.started, 2), error)


def run_chaos(
    env: dict[str, str],
    log_dir: Path,
    kills: int,
    rng: random.Random,
    hold_kills: Iterable[int],
    write_kills: Iterable[int] = (),
    batch_s: float = 4.0,
    startup_s: float = 25.0,
    step_timeout_s: float = 240.0,
    max_self_exits: int | None = None,
    progress=lambda message: None,
    result: ChaosRun | None = None,
    serve_metrics: bool = False,
    contract: Path = CONTRACT_FILE,
) -> ChaosRun:
    """Start the service and SIGKILL it `kills` times, restarting it each time with the same
    checkpoint; kills numbered in `hold_kills` are aimed between the Iceberg commit and the
    checkpoint commit with the hold hook, those in `write_kills` at a batch writing its data files
    (a random 0-0.2 s after its first file appears). Then drain the topic with --until-idle.

    Other kills pick a moment at random: either a random time after the process started (up to
    startup_s plus two batches: Spark may still be starting, or any batch be in flight), or a
    random fraction of a batch (batch_s) after the run commits a new snapshot.

    A run that exits by itself before its kill is recorded as a SelfExit and restarted (the kill
    is then tried again on the new run), up to max_self_exits (default: 2 per kill).

    Once the topic is drained (all its offsets in the table) a kill waits no longer for a new
    snapshot, but comes a random fraction of a batch after the run started its query. With
    serve_metrics, every run serves /metrics on a port of its own (Service.metrics_port); `result`
    may be passed in to watch the runs while they happen. `contract`: the service's contract file,
    of the same table as CONTRACT (an upsert version of it, say)."""
    result = ChaosRun() if result is None else result
    try:
        _chaos(
            result,
            env,
            log_dir,
            kills,
            rng,
            hold_kills,
            set(write_kills),
            batch_s,
            startup_s,
            step_timeout_s,
            max_self_exits,
            progress,
            serve_metrics,
            contract,
        )
    finally:
        for service in result.services:  # nothing of a failed run is left behind
            if service.alive:
                service.kill()
    return result


def _chaos(
    result: ChaosRun,
    env,
    log_dir,
    kills,
    rng,
    hold_kills,
    write_kills,
    batch_s,
    startup_s,
    step_timeout_s,
    max_self_exits,
    progress,
    serve_metrics,
    contract,
) -> None:
    from app.local.broker import free_port

    hold_kills = set(hold_kills)
    max_self_exits = 2 * kills if max_self_exits is None else max_self_exits
    table = catalog_of(env).load_table(CONTRACT.table)
    ckpt = checkpoint_dir(env)
    topic = env["GEOINGEST_TOPIC"]
    ends = end_offsets(kafka_client(env), topic)

    def drained() -> bool:
        return all_consumed(table, topic, ends)

    started = time.monotonic()
    attempt = 0
    for number in range(kills):
        hold = number in hold_kills
        while True:
            marker = log_dir / f"hold-{number}-{attempt}.marker"
            extra = {"GEOINGEST_HOLD_AFTER_COMMIT_FILE": str(marker)} if hold else {}
            if serve_metrics:
                extra["GEOINGEST_METRICS_PORT"] = str(free_port())
            in_table_before = {(i.writer_id, i.batch_id) for i in identities(table)}
            service = Service(env, log_dir, f"run-{attempt:02d}", extra_env=extra, contract=contract)
            attempt += 1
            result.services.append(service)
            try:
                strategy = _wait_for_kill_moment(
                    service,
                    hold,
                    number in write_kills,
                    marker,
                    table,
                    ckpt,
                    rng,
                    batch_s,
                    startup_s,
                    step_timeout_s,
                    drained,
                )
                if not service.alive:
                    raise ExitedByItself()
            except ExitedByItself:
                service.kill()  # whatever is left of its process group
                exit_ = self_exit_of(service)
                result.self_exits.append(exit_)
                progress(
                    f"{service.name} exited {exit_.code} by itself after {exit_.after_s} s ({exit_.error}); restarting"
                )
                if len(result.self_exits) > max_self_exits:
                    raise AssertionError(
                        f"{len(result.self_exits)} runs exited by themselves; the last:\n{service.stderr_tail()}"
                    ) from None
                continue
            except BaseException:
                service.kill()
                raise
            service.kill()
            if hold:
                result.hold_batch_ids.append(int(marker.read_text()))
            break
        phase, batch_id = kill_phase(service, ckpt, table, in_table_before)
        kill = Kill(
            number, strategy, phase, batch_id, round(time.monotonic() - service.started, 2), len(service.batches())
        )
        result.kills.append(kill)
        progress(
            f"kill {number + 1}/{kills} ({service.name}): {strategy} after {kill.after_s} s -> {phase} "
            f"(batch {batch_id}), {kill.batches_logged} batches logged"
        )

    for drain in range(max_self_exits + 1):
        final = Service(
            env,
            log_dir,
            f"final-{drain}",
            "--until-idle",
            extra_env={"GEOINGEST_METRICS_PORT": str(free_port())} if serve_metrics else None,
            contract=contract,
        )
        result.services.append(final)
        code = final.wait(timeout=max(step_timeout_s, 900))
        if code == 0:
            break
        exit_ = self_exit_of(final)
        result.self_exits.append(exit_)
        progress(f"{final.name} exited {code} ({exit_.error}); restarting")
        if len(result.self_exits) > max_self_exits:
            raise AssertionError(f"the final --until-idle run exited {code}:\n{final.stderr_tail()}")
    result.final_summary = json.loads(final.stdout_path.read_text().strip().splitlines()[-1])
    result.seconds = time.monotonic() - started
    progress(f"drained: {result.final_summary}")


def _wait_for_kill_moment(
    service: Service,
    hold: bool,
    writing: bool,
    marker: Path,
    table,
    ckpt: Path,
    rng: random.Random,
    batch_s: float,
    startup_s: float,
    timeout: float,
    drained,
) -> str:
    """Wait until the moment to kill `service`; returns the strategy that chose it."""
    if drained():  # nothing left to commit: kill while it idles, or replays what it had in flight
        wait_for(service.query_started, timeout, service)
        time.sleep(rng.uniform(0.0, 2 * batch_s))
        return "random_while_drained"
    if hold:
        if not wait_for(marker.exists, timeout, service):
            raise AssertionError(f"no hold marker after {timeout} s:\n{service.stderr_tail()}")
        time.sleep(rng.uniform(0.0, 1.0))
        return "hold_after_commit"
    if writing:
        writer = writer_id_of(ckpt)
        polls = 0

        def uncommitted_files() -> bool:  # cheap first: a glob every 20 ms, the table only then
            nonlocal polls, writer
            polls += 1
            if polls % 100 == 0 and drained():
                return True
            writer = writer or writer_id_of(ckpt)  # a first run makes it as it starts
            if writer is None:
                return False
            planned, committed = checkpoint_batches(ckpt)
            writing = [
                b
                for b in sorted(planned)[-2:]
                if b not in committed and files_of_batch(table, writer, b, service.started_wall)
            ]
            return bool(writing) and any(
                b not in {i.batch_id for i in identities(table) if i.writer_id == writer} for b in writing
            )

        if not wait_for(uncommitted_files, timeout, service, every_s=0.02):
            raise AssertionError(f"no batch wrote files in {timeout} s:\n{service.stderr_tail()}")
        if drained():
            time.sleep(rng.uniform(0.0, 2 * batch_s))
            return "random_while_drained"
        time.sleep(rng.uniform(0.0, 0.05))
        return "while_writing_files"
    if rng.random() < 0.35:
        delay = rng.uniform(0.3 * startup_s, startup_s + 2 * batch_s)
        wait_for(lambda: time.monotonic() - service.started >= delay, delay + 1, service)
        return "random_after_start"
    before = len(identities(table))
    if not wait_for(lambda: len(identities(table)) > before or drained(), timeout, service):
        raise AssertionError(f"no new snapshot in {timeout} s:\n{service.stderr_tail()}")
    time.sleep(rng.uniform(0.0, batch_s))
    return "random_after_new_snapshot"


# -- the checks, shared with the benchmark ------------------------------------------------------


@dataclass
class Verdict:
    events: int
    valid_expected: int
    rows_in_table: int
    lost: int
    duplicated: int
    unexpected: int
    rejected_expected: int
    dlq_records: int
    dlq_distinct_sources: int
    dlq_resent: int
    dlq_missing_keys: int
    dlq_wrong_reason: int
    dlq_by_reason: dict[str, int]
    snapshots: int
    writer_ids: int
    duplicate_identities: int
    offset_problems: list[str]
    replays_skipped: int
    replayed_hold_batches: list[int]


def verify(
    env: dict[str, str],
    topic: str,
    events: list[SampleEvent],
    valid: set[str],
    rejected: dict[str, str],
    chaos: ChaosRun,
) -> Verdict:
    table = catalog_of(env).load_table(CONTRACT.table)
    ids = table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()
    present = set(ids)

    client = kafka_client(env)
    dead = read_dead_letters(client, f"{topic}.dlq")
    by_source: dict[tuple, tuple[str, str]] = {}
    for message in dead:
        headers = dict(message.headers)
        source = (headers[SOURCE_TOPIC_HEADER], headers[SOURCE_PARTITION_HEADER], headers[SOURCE_OFFSET_HEADER])
        by_source[source] = (message.key.decode(), headers[REASON_HEADER].decode())
    dlq_keys = {key: reason for key, reason in by_source.values()}

    idents = identities(table)
    pairs = Counter((i.writer_id, i.batch_id) for i in idents)
    skipped = [(name, b["batch_id"]) for name, b in chaos.batch_lines() if b.get("commit") == "skipped_replay"]
    skipped_ids = {batch_id for _, batch_id in skipped}
    return Verdict(
        events=len(events),
        valid_expected=len(valid),
        rows_in_table=len(ids),
        lost=len(valid - present),
        duplicated=len(ids) - len(present),
        unexpected=len(present - valid),
        rejected_expected=len(rejected),
        dlq_records=len(dead),
        dlq_distinct_sources=len(by_source),
        dlq_resent=len(dead) - len(by_source),
        dlq_missing_keys=len(set(rejected) - set(dlq_keys)),
        dlq_wrong_reason=sum(1 for key, reason in dlq_keys.items() if rejected.get(key) != reason),
        dlq_by_reason=dict(sorted(Counter(reason for _, reason in by_source.values()).items())),
        snapshots=len(idents),
        writer_ids=len({i.writer_id for i in idents}),
        duplicate_identities=sum(n - 1 for n in pairs.values() if n > 1),
        offset_problems=coverage_problems(offset_coverage(idents, topic), end_offsets(client, topic)),
        replays_skipped=len(skipped),
        replayed_hold_batches=sorted(b for b in chaos.hold_batch_ids if b in skipped_ids),
    )


def orphan_listing(
    env: dict[str, str], delete: bool = False, stored_at: Callable[[str], str] = lambda path: path
) -> list[dict]:
    """The orphans of every age; with `delete`, dated back two hours first, as a run that late finds
    them, and deleted at the default age (a younger one is refused: a commit may be in flight).
    `stored_at` gives the local file behind a table path (an object store's, on the lakehouse)."""
    args = ["table", "orphans", "--table", CONTRACT.table]
    if delete:
        two_hours_ago = time.time() - 2 * 3600
        for orphan in orphan_listing(env):
            os.utime(stored_at(orphan["path"]), (two_hours_ago, two_hours_ago))
        args.append("--delete")
    else:
        args += ["--min-age-minutes", "0"]
    out = geoingest(env, *args).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def prepare(
    bootstrap: str, topic: str, workdir: Path, events_count: int, seed: int = 7, **extra_env: str
) -> tuple[dict[str, str], list[SampleEvent]]:
    """Produce the sample events and create the table; returns the service environment and events."""
    events = list(sample_events(events_count, seed=seed))
    acknowledged = produce(bootstrap, topic, events, total=len(events), progress=False, partitions=PARTITIONS)
    assert acknowledged == len(events), f"the broker acknowledged {acknowledged} of {len(events)} events"
    env = service_env(bootstrap, topic, workdir, **extra_env)
    create_table(catalog_of(env), CONTRACT)
    return env, events


# -- the test -----------------------------------------------------------------------------------

EVENTS = 200_000
KILLS = 5  # one of them held between the Iceberg commit and the checkpoint commit
SEED = 20240611


def test_kill_9_at_random_moments_loses_and_duplicates_nothing(kafka, tmp_path):
    started = time.monotonic()
    topic = f"chaos-{uuid.uuid4().hex[:8]}"
    env, events = prepare(kafka.bootstrap, topic, tmp_path, EVENTS)
    print(f"{EVENTS} events produced in {time.monotonic() - started:.0f} s")
    # The kill while files are written comes early: a fast service drains the topic in a few runs.
    check_kill_9_chaos(env, topic, events, tmp_path, KILLS, hold_kills={2}, write_kills={1})


def check_kill_9_chaos(
    env: dict[str, str],
    topic: str,
    events: list[SampleEvent],
    log_dir: Path,
    kills: int,
    hold_kills: set[int],
    write_kills: set[int],
    stored_at: Callable[[str], str] = lambda path: path,
) -> None:
    """Kill the service `kills` times, then check the table, the dead letters and the orphans
    (`stored_at`: the local file behind a table path, as orphan_listing's)."""
    valid, rejected = expected_outcome(events)
    assert 0 < len(rejected) < 0.02 * len(events)  # the demo mix: ~0.5 % malformed

    rng = random.Random(SEED)
    chaos = run_chaos(env, log_dir, kills, rng, hold_kills=hold_kills, write_kills=write_kills, progress=print)

    phases = Counter(k.phase for k in chaos.kills)
    assert len(chaos.kills) >= kills
    assert chaos.self_exits == [], "every run lived until its kill (or drained the topic)"
    assert phases[AFTER_ICEBERG_COMMIT] >= 1, phases
    assert phases[BEFORE_ICEBERG_COMMIT] + phases[WRITING_FILES] >= 1, f"no kill in the middle of a batch: {phases}"

    verdict = verify(env, topic, events, valid, rejected, chaos)
    print(f"chaos run {chaos.seconds:.0f} s, {len(chaos.self_exits)} self-exits; {verdict}")
    assert (verdict.lost, verdict.duplicated, verdict.unexpected) == (0, 0, 0)
    assert verdict.rows_in_table == len(valid)
    assert verdict.offset_problems == [], "every offset recorded by exactly one snapshot"
    assert verdict.duplicate_identities == 0 and verdict.writer_ids == 1
    assert verdict.replayed_hold_batches == chaos.hold_batch_ids, (
        "the batch held after its Iceberg commit was replayed and skipped",
        chaos.hold_batch_ids,
    )
    assert verdict.dlq_missing_keys == 0 and verdict.dlq_wrong_reason == 0
    assert verdict.dlq_distinct_sources == len(rejected), "DLQ at least once, deduplicated by source offset"

    # Files of killed batches are orphans: never referenced, deleted on request, the table intact.
    table = catalog_of(env).load_table(CONTRACT.table)

    def stored(path: str) -> bool:
        return table.io.new_input(path).exists()

    referenced = referenced_files(table)
    orphans = orphan_listing(env)
    assert all(o["path"] not in referenced for o in orphans)
    assert all(stored(o["path"]) for o in orphans)
    if phases[WRITING_FILES]:
        assert orphans, "a batch killed while writing its files leaves them behind"
    deleted = orphan_listing(env, delete=True, stored_at=stored_at)
    assert [o["path"] for o in deleted] == [o["path"] for o in orphans]
    assert all(not stored(o["path"]) for o in orphans)
    assert orphan_listing(env) == []
    table.refresh()
    ids = table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()
    assert len(ids) == len(set(ids)) == len(valid) and set(ids) == valid
    assert all(stored(p) for p in referenced_files(table))


# What Spark reports for the first batch of a restarted query when that batch is recovered from the
# offset log (the previous process died before recording it in commits/): no start or latest
# offset. Captured from a restart after a kill with the hold hook.
RECOVERED_BATCH_PROGRESS = {
    "id": "388b3720-90d6-4aea-9fc6-d70b04ad56d0",
    "runId": "6097ca95-feee-4a9e-809a-79840622dacb",
    "name": "geoingest-demo.events",
    "timestamp": "2026-11-21T06:09:25.124Z",
    "batchId": 0,
    "batchDuration": 9908,
    "durationMs": {
        "triggerExecution": 9906,
        "queryPlanning": 424,
        "getBatch": 25,
        "addBatch": 9188,
        "commitOffsets": 245,
    },
    "eventTime": {},
    "stateOperators": [],
    "sources": [
        {
            "description": "KafkaV2[Subscribe[t]]",
            "startOffset": None,
            "endOffset": '{"t":{"0":2499,"1":2500,"2":2499,"3":2500}}',
            "latestOffset": None,
            "numInputRows": 9998,
            "inputRowsPerSecond": 0.0,
            "processedRowsPerSecond": 1009.08,
            "metrics": {},
        }
    ],
    "sink": {"description": "ForeachBatchSink", "numOutputRows": -1, "metrics": {}},
    "numInputRows": 9998,
    "inputRowsPerSecond": 0.0,
    "processedRowsPerSecond": 1009.08,
    "observedMetrics": {},
}


@pytest.mark.parametrize("rendering", ["spark-json", "pyspark"])
def test_a_restarted_service_survives_the_progress_of_a_recovered_batch(rendering):
    """Such a batch has a null latestOffset: null in Spark's JSON of its progress, which the
    service reads (app/progress.py), and the string 'None' in pyspark 4.0's rendering of it
    (SourceProgress.fromJObject does str(None)), which it read before. app.metrics._offsets used to
    json.loads it and the JSONDecodeError escaped the service's watch loop: the restarted service
    exited 2 right after the replayed batch, and since Spark had already planned the next batch,
    every restart did the same, one batch each (seen in the chaos runs). Fixed in app/metrics.py
    and app/service.py. The query is a stand-in: a restart's first progress, captured from one."""
    from prometheus_client import CollectorRegistry
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    from app.metrics import Health, IngestMetrics
    from app.progress import ProgressReader
    from app.service import Lane

    if rendering == "pyspark":
        report = StreamingQueryProgress.fromJson(RECOVERED_BATCH_PROGRESS)
        assert report["sources"][0]["latestOffset"] == "None", "what pyspark hands a reader"
        rendered = report.json
    else:
        rendered = json.dumps(RECOVERED_BATCH_PROGRESS)

    class JavaProgress:
        def json(self):
            return rendered

    class JavaQuery:
        def recentProgress(self):
            return [JavaProgress()]

    class RecoveredQuery:  # a query that ran the recovered batch, then stopped
        def __init__(self):
            self.polls = 0
            self._jsq = JavaQuery()

        @property
        def isActive(self):
            self.polls += 1
            return self.polls <= 2

        status = {"isTriggerActive": False}

        def awaitTermination(self, timeout):
            return None

        def exception(self):
            return None

    class QuietProcessor:  # its batches raised nothing the service must stop for
        fatal_error = None

    metrics = IngestMetrics(CollectorRegistry(), CONTRACT.table, "t")
    query = RecoveredQuery()
    # Only what the watch loop reads: the query's progress, the processor's error, metrics and health.
    lane = Lane(None, CONTRACT, None, None, QuietProcessor(), metrics, Health(max_silence_s=60), None, query=query)  # type: ignore[arg-type]
    lane.progress = ProgressReader(query, CONTRACT.table)
    while query.isActive:
        lane.watch()
    assert lane.failure() is None
    assert metrics.registry.get_sample_value("geoingest_last_progress_timestamp_seconds", {"table": CONTRACT.table}) > 0


def test_kill_9_with_the_python_source_loses_and_duplicates_nothing(kafka, tmp_path):
    """The same promise when the tasks read their offset ranges themselves (source "python"):
    Spark's checkpoint still holds the offsets, the table's snapshots still recognise a replay.
    The kill while files are written comes first: a fast service can drain the topic within
    two runs, after which no batch is left to kill in the middle of."""
    topic = f"chaos-py-{uuid.uuid4().hex[:8]}"
    env, events = prepare(kafka.bootstrap, topic, tmp_path, 100_000, GEOINGEST_SOURCE="python")
    check_kill_9_chaos(env, topic, events, tmp_path, kills=3, hold_kills={1}, write_kills={0})
