"""The correctness matrix: features tested in combination, not one by one.

One small keyed stream (features created, moved anywhere on the map and across days, 10 %
tombstones, a few hostile records among them) goes through the real broker and Spark in every
cell, in two runs of the service (the second resumes from the checkpoint the first left), with
maintenance beside the stream at a short interval. The cells vary the topic's partitions {1, 2, 5},
the source {spark-kafka, python}, the clustering {batch, task}, the mode {append, upsert} and the
layout {unpartitioned, day + geohash}: every pair of values is in some cell (pairwise, checked by
the first test), and the 1-partition upsert stream runs on both sources and both clusterings
with default settings. Some upsert cells choose the reduce job over the last task's reduction.

Every cell checks the table, after each run and after a compaction, against the reference state
computed here from what was produced, with two readers that share no code (`geoingest query`'s
reader, streaming/read/query.py, and DuckDB's iceberg_scan):
  - append: each good record exactly once, with its values; each bad one in the dead-letter topic
    exactly once;
  - upsert: each key's last version in Kafka order, tombstoned keys absent, no key twice.
The three counts a user would look for are reported per cell: keys duplicated, deleted keys back,
keys at a stale version.

Beyond the pairs, cells combine the stream with the moments things break: a kill -9 between the
Iceberg commit and Spark's checkpoint, `table evolve` of the partition spec while batches run, and
orphan removal racing a slow compaction; and a PostGIS table with large values mirrored through
Debezium under both replica identities.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import shapely
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from prometheus_client import CollectorRegistry

from app.maven import configure_iceberg_java
from app.service import run
from streaming.contract import parse_contract
from streaming.maintenance.maintain import maintain
from streaming.maintenance.plan import MaintenancePolicy
from streaming.read.predicate import Predicate
from streaming.read.query import query
from streaming.table.catalog import create_table, open_catalog
from streaming.table.native import is_native
from streaming.write.dead_letter import REASON_HEADER, SOURCE_OFFSET_HEADER, SOURCE_PARTITION_HEADER
from tests.conftest import CACHE_DIR, duckdb_connection, local_settings
from tests.debezium import kafka_connect, postgis  # noqa: F401

pytestmark = pytest.mark.integration

configure_iceberg_java(CACHE_DIR)  # native-geometry tables are made through Iceberg Java

ROOT = Path(__file__).resolve().parents[3]
DEMO = json.loads((ROOT / "schemas" / "demo_events.json").read_text())
WORLD = Predicate.from_bbox((-180.0, -90.0, 180.0, 90.0))
DAY_MS = 86_400_000
# Cells of geohash length 1 (32): three days of points anywhere fall in ~90 partitions, a file each
# per batch, as a partitioned table's small batches do.
LAYOUTS = {"none": [], "day+geohash": ["day(event_time)", "geohash(geometry, 1)"]}
FACTORS = {
    "partitions": (1, 2, 5),
    "source": ("spark-kafka", "python"),
    "clustering": ("batch", "task"),
    "mode": ("append", "upsert"),
    "layout": tuple(LAYOUTS),
}


@dataclass(frozen=True)
class Cell:
    partitions: int
    source: str
    clustering: str
    mode: str
    layout: str
    # Every stage to its Spark job: an upsert batch's versions meet in a reduce job, not in the
    # last task of the batch (merge_in_task_max_rows 0), and the batch's runs in a merge job.
    jobs: bool = False
    # Run as a new user runs it: every setting at its default but the ones naming the cell (source,
    # clustering) and the test's broker and catalog; else small batches, maintenance at every chance.
    defaults: bool = False
    # An Iceberg v3 table whose geometry is Iceberg's own type (`geometry.native`).
    native: bool = False
    # False: the table stores no bbox covering (`bbox.stored: false`; native tables only).
    covering: bool = True

    @property
    def name(self) -> str:
        return (
            f"p{self.partitions}-{self.source}-{self.clustering}-{self.mode}-{self.layout}"
            + ("-jobs" if self.jobs else "-defaults" if self.defaults else "")
            + ("-v3" if self.native else "")
            + ("" if self.covering else "-nobbox")
        )

    @property
    def contract(self):
        geometry = {**DEMO["geometry"], "native": True} if self.native else DEMO["geometry"]
        bbox = DEMO["bbox"] if self.covering else {"stored": False}
        return parse_contract(
            {**DEMO, "mode": self.mode, "partition": LAYOUTS[self.layout], "geometry": geometry, "bbox": bbox}
        )

    def values(self) -> tuple:
        return tuple(getattr(self, factor) for factor in FACTORS)


CELLS = [
    # The 1-partition upsert stream, default settings: both sources, both clusterings.
    Cell(1, "spark-kafka", "batch", "upsert", "none", defaults=True),
    Cell(1, "spark-kafka", "task", "upsert", "none", defaults=True),
    Cell(1, "python", "batch", "upsert", "none", defaults=True),
    Cell(1, "python", "task", "upsert", "none", defaults=True),
    # The rest of every pair of values (five cells are the fewest that cover them with the four above).
    Cell(1, "spark-kafka", "batch", "append", "day+geohash"),
    Cell(2, "spark-kafka", "batch", "append", "none"),
    Cell(2, "python", "task", "upsert", "day+geohash", jobs=True),
    Cell(5, "spark-kafka", "batch", "upsert", "none", jobs=True),
    Cell(5, "python", "task", "append", "day+geohash"),
]
# Native-geometry (v3) tables, written and maintained through Iceberg Java: the 1-partition upsert
# stream at its defaults, an upsert and an append table partitioned by day and cell, both sources.
V3_CELLS = [
    Cell(1, "python", "batch", "upsert", "none", defaults=True, native=True),
    Cell(2, "spark-kafka", "task", "upsert", "day+geohash", native=True),
    Cell(5, "python", "batch", "append", "day+geohash", jobs=True, native=True),
    # Without the covering: the cells and the Hilbert key from a covering the rows carry, not the
    # table; an upsert row filled from the key's current row gets its covering made again.
    Cell(5, "spark-kafka", "task", "upsert", "day+geohash", native=True, covering=False),
    Cell(1, "spark-kafka", "task", "upsert", "none", defaults=True, native=True, covering=False),
]


def test_the_cells_cover_every_pair_of_values():
    def pairs(values: tuple) -> set:
        return {((i, values[i]), (j, values[j])) for i, j in itertools.combinations(range(len(values)), 2)}

    every = set().union(*(pairs(v) for v in itertools.product(*FACTORS.values())))
    covered = set().union(*(pairs(c.values()) for c in CELLS))
    assert every - covered == set()
    assert len({c.name for c in CELLS}) == len(CELLS)


# -- the stream -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Produced:
    key: bytes
    value: bytes | None
    timestamp_ms: int
    bad: str | None  # the reason a hostile record is rejected for, None for a good one or a tombstone


def _feature(key: str, lon: float, lat: float, speed: float) -> bytes:
    return json.dumps(
        {
            "type": "Feature",
            "id": key,
            "properties": {"kind": "probe", "speed": speed},
            "geometry": {"type": "Point", "coordinates": [lon, lat]},
        }
    ).encode()


HOSTILE = {
    "unknown_format": lambda key: b"\x07 not an event",
    "malformed_json": lambda key: b'{"type": "Feature", "id": "' + key.encode() + b'", "geometry": {',
    "outside_crs_area": lambda key: _feature(key, 10.0, 123.0, -1.0),
    "bad_wkb": lambda key: shapely.to_wkb(shapely.Point(1, 2))[:12],
}


def make_stream(n_keys: int, n_events: int, seed: int) -> list[Produced]:
    """Every key created once, then versions that move anywhere on the map and across three days
    (up to yesterday: a broker refuses records stamped ahead of its clock), 10 % tombstones, and
    a hostile record with a live key every 150 records."""
    rng = np.random.default_rng(seed)
    now = int(time.time() * 1000)
    first_day = now - now % DAY_MS - 3 * DAY_MS
    records: list[Produced] = []
    alive: set[int] = set()
    order = list(range(n_keys)) + rng.integers(0, n_keys, n_events - n_keys).tolist()
    reasons = list(HOSTILE)
    for i, k in enumerate(order):
        key = f"k{k}"
        stamp = int(first_day + rng.integers(0, 3 * DAY_MS))
        if i % 150 == 149:
            reason = reasons[(i // 150) % len(reasons)]
            records.append(Produced(key.encode(), HOSTILE[reason](key), stamp, reason))
        if k in alive and rng.random() < 0.1:
            records.append(Produced(key.encode(), None, stamp, None))
            alive.discard(k)
            continue
        lon, lat = round(float(rng.uniform(-179, 179)), 5), round(float(rng.uniform(-80, 80)), 5)
        records.append(Produced(key.encode(), _feature(key, lon, lat, float(i)), stamp, None))
        alive.add(k)
    return records


def produce(bootstrap: str, topic: str, records: list[Produced]) -> list[tuple[int, int]]:
    """Send the records, keyed (a key's records share a partition); their (partition, offset)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        futures = [producer.send(topic, key=r.key, value=r.value, timestamp_ms=r.timestamp_ms) for r in records]
        producer.flush(timeout=60)
        return [(f.get(10).partition, f.get(10).offset) for f in futures]
    finally:
        producer.close()


@dataclass
class Reference:
    """What the table must hold after the records produced so far, and the dead-letter topic."""

    mode: str
    rows: dict  # append: (partition, offset) -> (key, lon, lat, speed); upsert: key -> (lon, lat, speed)
    dead: dict[tuple[int, int], str]  # (partition, offset) -> reason

    @classmethod
    def of(cls, mode: str, records: list[Produced], positions: list[tuple[int, int]]) -> Reference:
        rows: dict = {}
        dead: dict[tuple[int, int], str] = {}
        for record, where in sorted(zip(records, positions), key=lambda rp: rp[1]):
            key = record.key.decode()
            if record.bad is not None:
                dead[where] = record.bad
            elif record.value is None:
                if mode == "upsert":
                    rows.pop(key, None)
                else:
                    dead[where] = "null_value"
            else:
                doc = json.loads(record.value)
                lon, lat = doc["geometry"]["coordinates"]
                version = (lon, lat, doc["properties"]["speed"])
                if mode == "upsert":
                    rows[key] = version
                else:
                    rows[where] = (key, *version)
        return cls(mode, rows, dead)


# -- the readers ------------------------------------------------------------------------------------
def _rounded(point: shapely.Geometry) -> tuple[float, float]:
    return round(float(shapely.get_x(point)), 5), round(float(shapely.get_y(point)), 5)


def read_by_query(table) -> list[tuple]:
    """(event_id, partition, offset, lon, lat, speed) of every row, as `geoingest query` reads them."""
    result = query(table, WORLD).table
    points = shapely.from_wkb(result.column("geometry").to_numpy(zero_copy_only=False))
    columns = [result.column(n).to_pylist() for n in ("event_id", "source_partition", "source_offset", "speed")]
    return [(i, p, o, *_rounded(g), s) for (i, p, o, s), g in zip(zip(*columns), points)]


def read_by_duckdb(table) -> list[tuple]:
    con = duckdb_connection()
    con.execute("SET enable_geoparquet_conversion = false")
    geometry = "ST_AsWKB(geometry)" if is_native(table) else "geometry"  # v3: DuckDB's GEOMETRY
    found = con.execute(
        f"SELECT event_id, source_partition, source_offset, {geometry}, speed "
        f"FROM iceberg_scan('{table.metadata_location}')"
    ).fetchall()
    return [(i, p, o, *_rounded(shapely.from_wkb(bytes(g))), s) for i, p, o, g, s in found]


def differences(reference: Reference, rows: list[tuple]) -> dict[str, int]:
    """What a user would count as wrong, zero everywhere for a table that equals the reference."""
    if reference.mode == "upsert":
        ids = Counter(r[0] for r in rows)
        state = {r[0]: r[3:] for r in rows}
        return {
            "duplicated keys": sum(1 for n in ids.values() if n > 1),
            "deleted keys back": sum(1 for k in state if k not in reference.rows),
            "stale keys": sum(1 for k, v in state.items() if k in reference.rows and v != reference.rows[k]),
            "missing keys": sum(1 for k in reference.rows if k not in state),
        }
    places = Counter((r[1], r[2]) for r in rows)
    return {
        "rows twice": sum(1 for n in places.values() if n > 1),
        "rows not produced as good": sum(1 for where in places if where not in reference.rows),
        "rows with other values": sum(
            1 for r in rows if (r[1], r[2]) in reference.rows and (r[0], *r[3:]) != reference.rows[(r[1], r[2])]
        ),
        "good records missing": sum(1 for where in reference.rows if where not in places),
    }


def dead_letters(bootstrap: str, topic: str) -> Counter:
    """(partition, offset, reason) of every dead letter, counted."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    try:
        found: Counter = Counter()
        for message in consumer:
            headers = dict(message.headers)
            found[
                (
                    int(headers[SOURCE_PARTITION_HEADER]),
                    int(headers[SOURCE_OFFSET_HEADER]),
                    headers[REASON_HEADER].decode(),
                )
            ] += 1
        return found
    finally:
        consumer.close()


def check(cell: Cell, table, reference: Reference, when: str) -> None:
    for reader in (read_by_query, read_by_duckdb):
        wrong = differences(reference, reader(table))
        assert set(wrong.values()) == {0}, f"{cell.name}, {when}, read by {reader.__name__}: {wrong}"


# -- the cells --------------------------------------------------------------------------------------
def new_topic(bootstrap: str, partitions: int) -> str:
    name = f"matrix-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()
    return name


@pytest.mark.parametrize("cell", CELLS + V3_CELLS, ids=lambda c: c.name)
def test_every_cell_holds_its_reference_state(kafka, spark, tmp_path, cell: Cell):
    started = time.monotonic()
    contract = cell.contract
    topic = new_topic(kafka.bootstrap, cell.partitions)
    records = make_stream(n_keys=300, n_events=3_000, seed=cell.partitions * 7 + len(cell.name))
    half = len(records) // 2
    settings = local_settings(
        kafka,
        topic,
        tmp_path,
        source=cell.source,
        clustering=cell.clustering,
        max_offsets_per_trigger=400,
        merge_in_task_max_rows=0 if cell.jobs else 1_000_000,
        # Maintenance beside the stream, as often as it may run.
        maintenance_interval_commits=2,
        maintenance_min_gap_s=0,
        maintenance_cpu_percent=100,
        maintenance_min_file_age_s=0,
        maintenance_steps="retention,compact,expire",
        maintenance_keep_snapshots=5,
        maintenance_snapshot_max_age_s=0,
    )
    if cell.defaults:
        settings = local_settings(kafka, topic, tmp_path, source=cell.source, clustering=cell.clustering)
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    create_table(catalog, contract)

    took: Counter = Counter()  # seconds per phase, printed with the cell
    mark = time.monotonic()

    def lap(phase: str) -> None:
        nonlocal mark
        took[phase] += round(time.monotonic() - mark, 1)
        mark = time.monotonic()

    registries = [CollectorRegistry(), CollectorRegistry()]  # a run's metrics are its own
    positions = produce(kafka.bootstrap, topic, records[:half])
    lap("produce")
    first = run(settings, contract, until_idle=True, spark=spark, registry=registries[0])
    assert first.commits.get("failed", 0) == 0
    lap("runs")
    table = catalog.load_table(contract.table)
    check(cell, table, Reference.of(cell.mode, records[:half], positions), "after the first run")
    lap("checks")

    positions += produce(kafka.bootstrap, topic, records[half:])
    lap("produce")
    second = run(settings, contract, until_idle=True, spark=spark, registry=registries[1])
    assert second.commits.get("failed", 0) == 0
    lap("runs")
    reference = Reference.of(cell.mode, records, positions)
    table.refresh()
    check(cell, table, reference, "after the restart")
    assert first.batches + second.batches >= (2 if cell.defaults else 6), "several batches, both runs"
    lap("checks")

    report = maintain(
        table,
        MaintenancePolicy(min_file_age_s=0, snapshot_max_age_s=0, keep_snapshots=1),
        steps=("compact", "expire"),
    )
    assert report.skipped is None
    lap("compaction")
    table.refresh()
    check(cell, table, reference, "after a compaction")
    lap("checks")

    dead = dead_letters(kafka.bootstrap, settings.dead_letter_topic)
    lap("dead letters")
    expected = Counter({(*where, reason): 1 for where, reason in reference.dead.items()})
    assert dead == expected, f"{cell.name}: each bad record dead-lettered exactly once"
    beside = {
        outcome: sum(
            r.get_sample_value("geoingest_maintenance_runs_total", {"table": contract.table, "outcome": outcome}) or 0
            for r in registries
        )
        for outcome in ("completed", "skipped", "gave_up", "failed")
    }
    assert beside["failed"] == 0, f"{cell.name}: maintenance beside the stream failed"
    print(
        f"{cell.name}: {len(records)} records, {first.batches + second.batches} batches, "
        f"{len(reference.rows)} {'keys' if cell.mode == 'upsert' else 'rows'}, {len(reference.dead)} dead letters, "
        f"maintenance beside: {beside}, {time.monotonic() - started:.1f} s ({dict(took)})"
    )


# -- cells beyond the pairs: a kill at commit time, a spec changed under the running service -------
def killed_after_a_commit_then_rerun(env: dict[str, str], tmp_path: Path, contract_file: Path, table_name: str):
    """The service (the real command, its own process group) holds after an Iceberg commit, before
    Spark records the batch, and is killed there with SIGKILL; its restart replays the batch, which
    the table must recognise by its offsets and skip, committing no batch twice. Returns the table."""
    from tests.streaming.job.test_chaos import Service, catalog_of, checkpoint_dir, identities

    marker = tmp_path / "held"
    held = Service(
        env,
        tmp_path,
        "held",
        "--until-idle",
        extra_env={"GEOINGEST_HOLD_AFTER_COMMIT_FILE": str(marker)},
        contract=contract_file,
    )
    deadline = time.monotonic() + 300
    while not marker.exists() and held.alive and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), f"the service never held after a commit:\n{held.stderr_tail()}"
    held.kill()
    batch = int(marker.read_text())
    table = catalog_of(env).load_table(table_name)
    assert any(i.batch_id == batch for i in identities(table)), "killed after its Iceberg commit"
    offsets = checkpoint_dir(env)
    assert (offsets / "offsets" / str(batch)).exists() and not (offsets / "commits" / str(batch)).exists(), (
        "killed before Spark recorded it"
    )

    again = Service(env, tmp_path, "again", "--until-idle", contract=contract_file)
    assert again.wait(600) == 0, again.stderr_tail()
    assert any(b["batch_id"] == batch and b["commit"] == "skipped_replay" for b in again.batches())
    table.refresh()
    ids = [(i.writer_id, i.batch_id) for i in identities(table)]
    assert len(ids) == len(set(ids)), "no batch committed twice"
    return table


def test_kill_9_at_commit_time_on_a_one_partition_upsert_topic_leaves_each_keys_last_version(kafka, tmp_path):
    """A kill -9 between an Iceberg commit and Spark's record of it (killed_after_a_commit_then_rerun)
    on a 1-partition topic on the Python source, so every batch's versions are split over tasks."""
    from tests.streaming.job.test_chaos import catalog_of, service_env

    contract_raw = {**DEMO, "mode": "upsert"}
    contract_file = tmp_path / "upsert.json"
    contract_file.write_text(json.dumps(contract_raw))
    contract = parse_contract(contract_raw)
    topic = new_topic(kafka.bootstrap, 1)
    records = make_stream(n_keys=300, n_events=3_000, seed=91)
    positions = produce(kafka.bootstrap, topic, records)
    env = service_env(
        kafka.bootstrap,
        topic,
        tmp_path / "work",
        GEOINGEST_SOURCE="python",
        GEOINGEST_MAX_OFFSETS_PER_TRIGGER="500",
    )
    create_table(catalog_of(env), contract)
    table = killed_after_a_commit_then_rerun(env, tmp_path, contract_file, contract.table)
    reference = Reference.of("upsert", records, positions)
    check(Cell(1, "python", "batch", "upsert", "none"), table, reference, "after kill -9 at commit time")


def test_a_spec_changed_under_the_running_service_leaves_every_file_in_its_own_spec(kafka, spark, tmp_path):
    """`geoingest table evolve` from day(event_time) to hour(event_time) while back-to-back batches
    run: the batch in flight across the change lands under the spec it was written with, the next
    ones under the new one; every file's partition values are its rows' (no day read as an hour),
    and an hour's window finds exactly its rows."""
    import threading

    import pyarrow.parquet as pq

    from streaming.table.catalog import partition_layout
    from streaming.table.evolve import apply_evolution

    raw = {**DEMO, "partition": ["day(event_time)"]}
    topic = new_topic(kafka.bootstrap, 2)
    records = make_stream(n_keys=1_000, n_events=3_000, seed=17)
    positions = produce(kafka.bootstrap, topic, records)
    settings = local_settings(kafka, topic, tmp_path, max_offsets_per_trigger=250, maintenance_mode="off")
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    contract = parse_contract(raw)
    table, _ = create_table(catalog, contract)
    hourly = parse_contract({**raw, "partition": ["hour(event_time)"]})
    evolved_at: list[int] = []

    def evolve_after_four_batches() -> None:
        watched = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
        deadline = time.monotonic() + 300
        while len(watched.metadata.snapshots) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
            watched.refresh()
        evolved_at.append(int(time.time() * 1000))
        apply_evolution(watched, hourly)  # what `geoingest table evolve --contract` commits

    evolver = threading.Thread(target=evolve_after_four_batches)
    evolver.start()
    totals = run(settings, contract, until_idle=True, spark=spark)
    evolver.join(60)
    assert evolved_at and totals.commits.get("failed", 0) == 0 and totals.batches >= 10

    table.refresh()
    day_spec, hour_spec = 1, table.spec().spec_id
    assert [str(f.transform) for f in table.specs()[day_spec].fields] == ["day"]
    assert partition_layout(table).fields[0].transform == "hour"
    check(Cell(2, "spark-kafka", "batch", "append", "day"), table, Reference.of("append", records, positions), "")
    micros_per = {day_spec: 86_400_000_000, hour_spec: 3_600_000_000}
    straddled = 0
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io):
                data_file = entry.data_file
                times = pq.read_table(data_file.file_path.removeprefix("file://"), columns=["event_time"])
                units = {t // micros_per[data_file.spec_id] for t in times.column(0).cast("int64").to_pylist()}
                assert units == {data_file.partition[0]}, f"{data_file.file_path}: spec {data_file.spec_id}"
                straddled += data_file.spec_id == day_spec and snapshot.timestamp_ms > evolved_at[0]
    assert straddled > 0, "a batch written before the change committed after it (the race this cell is for)"
    hour = max(record.timestamp_ms for record in records) // 3_600_000 * 3_600_000
    expected = {
        where
        for record, where in zip(records, positions)
        if record.bad is None and record.value is not None and hour <= record.timestamp_ms < hour + 3_600_000
    }
    found = query(table, WORLD, time_from=hour, time_to=hour + 3_600_000).table
    assert set(zip(found.column("source_partition").to_pylist(), found.column("source_offset").to_pylist())) == expected


def test_orphan_removal_racing_a_slow_compaction_of_a_one_partition_upsert_table(kafka, spark, tmp_path, monkeypatch):
    """The service writes an upsert table from a 1-partition topic; a compaction that applies its
    deletes pauses after writing its files (dated an hour back, as a rewrite at a quarter of a core
    leaves them) for longer than two of its leases, while an orphans step runs: the step waits for
    the lease, the compaction lands, and the table still holds each key's last version."""
    import threading

    from streaming.maintenance.orphans import orphan_age_floor_s
    from tests.streaming.maintenance.test_orphans import pause_compactions_after_writing

    contract = parse_contract({**DEMO, "mode": "upsert"})
    topic = new_topic(kafka.bootstrap, 1)
    records = make_stream(n_keys=300, n_events=3_000, seed=23)
    positions = produce(kafka.bootstrap, topic, records)
    settings = local_settings(
        kafka, topic, tmp_path, source="python", max_offsets_per_trigger=500, maintenance_mode="off"
    )
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    create_table(catalog, contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.batches >= 6 and totals.commits.get("failed", 0) == 0
    reference = Reference.of("upsert", records, positions)

    written, go = pause_compactions_after_writing(monkeypatch)
    compacting = catalog.load_table(contract.table)
    reports = []
    compaction = threading.Thread(
        target=lambda: reports.append(
            maintain(compacting, MaintenancePolicy(min_file_age_s=0, lease_s=4), steps=("compact",))
        )
    )
    compaction.start()
    try:
        assert written.wait(120)
        time.sleep(8)  # two leases
        removing = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
        floor = orphan_age_floor_s(removing)
        orphans = maintain(removing, MaintenancePolicy(orphan_min_age_s=floor), steps=("orphans",))
    finally:
        go.set()
        compaction.join(120)
    assert orphans.skipped is not None and "lease held" in orphans.skipped, orphans
    assert reports[0].skipped is None and reports[0].compaction.files_rewritten > 0
    table = catalog.load_table(contract.table)
    check(Cell(1, "python", "batch", "upsert", "none"), table, reference, "after compaction raced orphan removal")


# -- a PostGIS table with large values, mirrored through Debezium -------------------------------------
def _ring(x: float, y: float, vertices: int, radius: float = 0.5) -> str:
    import math

    points = [
        f"{x + radius * math.cos(2 * math.pi * i / vertices)!r} {y + radius * math.sin(2 * math.pi * i / vertices)!r}"
        for i in range(vertices)
    ]
    return f"ST_GeomFromText('POLYGON(({', '.join([*points, points[0]])}))', 4326)"


def _large_row(i: int, rng: np.random.Generator) -> str:
    """Even ids: a 12,000-character name and a 600-vertex polygon, both stored out of line (TOAST);
    odd ids: a short name and a point. A score, NaN for every seventh."""
    x, y = float(rng.uniform(-170, 170)), float(rng.uniform(-80, 80))
    score = "'NaN'" if i % 7 == 0 else repr(float(i))
    if i % 2 == 0:
        return f"({i}, repeat('n{i}-', 3000), {score}, {_ring(x, y, 600)})"
    return f"({i}, 'short {i}', {score}, ST_SetSRID(ST_MakePoint({x!r}, {y!r}), 4326))"


def mirrored_state(server, table: str) -> dict[int, tuple]:
    from tests.debezium import connect_db

    with connect_db(server) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, name, score, ST_AsBinary(geom) FROM {table}")
        return {i: (name, _score(s), _normalised(bytes(g))) for i, name, s, g in cur.fetchall()}


def _score(value) -> float | str | None:
    return "NaN" if value is not None and value != value else value


def _normalised(wkb: bytes) -> str:
    return shapely.to_wkb(shapely.normalize(shapely.from_wkb(wkb))).hex()


def iceberg_mirror(table) -> dict[int, tuple]:
    table.refresh()
    rows = query(table, WORLD).table
    ids = rows.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "one row per key"
    return {
        i: (name, _score(s), _normalised(g))
        for i, name, s, g in zip(
            ids, rows.column("name").to_pylist(), rows.column("score").to_pylist(), rows.column("geometry").to_pylist()
        )
    }


def duckdb_mirror(table) -> dict[int, tuple]:
    con = duckdb_connection()
    con.execute("SET enable_geoparquet_conversion = false")
    found = con.execute(f"SELECT id, name, score, geometry FROM iceberg_scan('{table.metadata_location}')").fetchall()
    assert len(found) == len({r[0] for r in found}), "one row per key"
    return {i: (name, _score(s), _normalised(bytes(g))) for i, name, s, g in found}


def test_a_postgis_table_with_large_values_is_mirrored_row_for_row_under_both_replica_identities(
    kafka, spark, postgis, kafka_connect, tmp_path
):
    """Updates that leave a large (TOASTed) text or geometry unchanged, under REPLICA IDENTITY
    DEFAULT, reach Kafka without it (Debezium's placeholder for the text, null for the geometry):
    the table keeps the key's current value, from an earlier event of the batch or from its own
    row. Under FULL the events are whole, and `before` (NaN scores among its values) is read for the
    key only. Debezium's connector without its reselect post-processor, so that the events do lack
    the values; one connector for both tables, each a 1-partition topic, read by the Python source."""
    from tests.debezium import connect_db, start_connector

    identities = {"DEFAULT": "big_default", "FULL": "big_full"}
    rng = np.random.default_rng(5)
    with connect_db(postgis) as conn, conn.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS postgis")
        for identity, name in identities.items():
            cur.execute(f"DROP TABLE IF EXISTS {name}")
            cur.execute(
                f"CREATE TABLE {name} (id bigint PRIMARY KEY, name text, score double precision, "
                "geom geometry(Geometry, 4326) NOT NULL)"
            )
            cur.execute(f"ALTER TABLE {name} REPLICA IDENTITY {identity}")
            cur.execute(f"INSERT INTO {name} VALUES {', '.join(_large_row(i, rng) for i in range(120))}")
    prefix, _ = start_connector(
        kafka_connect, postgis, [f"public.{name}" for name in identities.values()], reselect=False
    )

    def drained(topic: str, expected_events: int) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            consumer = KafkaConsumer(
                topic, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=2000
            )
            n = sum(1 for _ in consumer)
            consumer.close()
            if n >= expected_events:
                return
            time.sleep(1)
        raise AssertionError(f"the connector wrote fewer than {expected_events} events to {topic}")

    mirrors = {}
    for identity, name in identities.items():
        topic = f"{prefix}.public.{name}"
        raw = json.loads((ROOT / "schemas" / "postgis_places.json").read_text())
        raw["table"] = f"mirror.{name}"
        raw["columns"].append({"id": 3, "name": "score", "type": "double", "from": ["properties.score"]})
        raw["geometry"]["id"], raw["bbox"]["id"] = 4, 5
        contract = parse_contract(raw)
        settings = local_settings(kafka, topic, tmp_path / name, source="python", max_offsets_per_trigger=150)
        catalog = open_catalog(settings.catalog_name, settings.catalog)
        create_table(catalog, contract)
        drained(topic, 120)
        run(settings, contract, until_idle=True, spark=spark)
        table = catalog.load_table(contract.table)
        assert iceberg_mirror(table) == mirrored_state(postgis, name), f"{identity}: after the snapshot"
        mirrors[identity] = (topic, settings, contract, table)

    events = dict.fromkeys(identities, 120)
    with connect_db(postgis) as conn, conn.cursor() as cur:
        for identity, name in identities.items():
            for statement in (
                # the table's rows: a new score (text and geometry unchanged), a new name, a moved geometry
                f"UPDATE {name} SET score = score + 1 WHERE id % 3 = 0",
                f"UPDATE {name} SET name = 'renamed ' || id WHERE id % 4 = 1 OR id % 4 = 2",
                f"UPDATE {name} SET geom = ST_Translate(geom, 0.25, 0.25) WHERE id % 5 = 0",
                f"UPDATE {name} SET score = 'NaN' WHERE id % 11 = 0",
                f"DELETE FROM {name} WHERE id % 13 = 0",
                # rows new in this batch, then changed in it: their earlier event carries what the later lacks
                f"INSERT INTO {name} VALUES {', '.join(_large_row(i, rng) for i in range(1000, 1040))}",
                f"UPDATE {name} SET score = -1 WHERE id >= 1000",
                f"UPDATE {name} SET name = 'new ' || id WHERE id >= 1000 AND id % 2 = 0",
            ):
                cur.execute(statement)
                # a delete's event and its tombstone
                events[identity] += cur.rowcount * (2 if statement.startswith("DELETE") else 1)

    for identity, name in identities.items():
        topic, settings, contract, table = mirrors[identity]
        expected = mirrored_state(postgis, name)
        drained(topic, events[identity])
        run(settings, contract, until_idle=True, spark=spark)
        table.refresh()
        for reader in (iceberg_mirror, duckdb_mirror):
            state = reader(table)
            wrong = sorted(i for i in expected.keys() | state.keys() if expected.get(i) != state.get(i))
            assert not wrong, f"{identity}, read by {reader.__name__}: {len(wrong)} rows differ, e.g. {wrong[:5]}"
        assert not any("__debezium_unavailable_value" in (n or "") for n, _, _ in iceberg_mirror(table).values())
