"""The Python Kafka source (streaming/source/python_source.py, kafka_options.py, kafka_read.py) against the real broker and Spark: what it
reads is what Spark's own Kafka source reads of the same topic, row for row."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from app.local.broker import LocalBroker
from streaming.job.config import FAST_FETCH, kafka_source_options
from streaming.source.options import KafkaDataLossError, KafkaSourceError, SourceSettings, librdkafka_config
from streaming.source.python_source import (
    KafkaStreamReader,
    OffsetRange,
    await_caught_up,
    python_kafka_stream,
    split_ranges,
)
from streaming.source.read import close_pooled_consumers, read_range
from tests.conftest import produce_records

pytestmark = pytest.mark.integration

COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")


def _records(count: int, first: int = 0) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """Small GeoJSON-ish events; every fifth has headers, one of them with a null value."""
    return [
        (
            f"k{i}".encode(),
            b'{"type":"Point","coordinates":[%d,%d]}' % (i % 180, i % 90),
            [("source", b"test"), ("trace", f"t{i}".encode())] if i % 5 == 0 else [],
        )
        for i in range(first, first + count)
    ]


def _produce_to(bootstrap: str, topic: str, partition: int, count: int, first: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value, headers in _records(count, first):
        producer.produce(topic, value=value, key=key, partition=partition, headers=headers or None)
    assert producer.flush(30) == 0


def _rows(rows) -> list[tuple]:
    """Rows as comparable tuples, headers as lists of (key, value)."""
    out = []
    for row in rows:
        headers = None if row["headers"] is None else [(h["key"], h["value"]) for h in row["headers"]]
        out.append(
            (
                bytes(row["key"]),
                bytes(row["value"]),
                row["topic"],
                row["partition"],
                row["offset"],
                row["timestamp"],
                headers,
            )
        )
    return sorted(out, key=lambda r: (r[3], r[4]))


def _spark_kafka_rows(spark, bootstrap: str, topic: str) -> list[tuple]:
    """What Spark's own Kafka source reads of the whole topic: the reference."""
    frame = (
        spark.read.format("kafka")
        .options(**kafka_source_options(bootstrap, topic, 2))
        .option("startingOffsets", "earliest")
        .load()
        .select(*COLUMNS)
    )
    return _rows(frame.collect())


class _Collected:
    """foreachBatch that keeps every row and each batch's size."""

    def __init__(self) -> None:
        self.rows: list = []
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, batch, batch_id: int) -> None:
        rows = batch.select(*COLUMNS).collect()
        with self._lock:
            self.rows.extend(rows)
            self.batch_sizes.append(len(rows))


def _drain(spark, options: dict[str, str], checkpoint: Path, timeout_s: float = 60) -> _Collected:
    """Run the source with endingOffsets=latest until it has caught up (the stand-in for
    Trigger.AvailableNow), collecting what it reads."""
    collected = _Collected()
    query = (
        python_kafka_stream(spark, {**options, "endingOffsets": "latest"})
        .writeStream.foreachBatch(collected)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        await_caught_up(query, timeout_s=timeout_s)
    finally:
        query.stop()
    return collected


def _options(bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    return {**kafka_source_options(bootstrap, topic, 2), **extra}


def test_every_record_is_read_once_across_capped_batches_a_restart_and_an_added_partition(
    kafka: LocalBroker, spark, topic: str, tmp_path: Path
) -> None:
    assert produce_records(kafka.bootstrap, topic, _records(300)) == 300
    options = _options(kafka.bootstrap, topic, startingOffsets="earliest", maxOffsetsPerTrigger="100")

    first = _drain(spark, options, tmp_path / "checkpoint")
    assert len(first.rows) == 300
    assert len(first.batch_sizes) >= 3 and max(first.batch_sizes) <= 100

    # More records, and a partition the first run never saw: the restart starts where the
    # checkpoint says, and the new partition from its earliest offset.
    assert produce_records(kafka.bootstrap, topic, _records(90, first=300)) == 90
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    _produce_to(kafka.bootstrap, topic, partition=3, count=30, first=390)
    second = _drain(spark, options, tmp_path / "checkpoint")

    read = _rows(first.rows + second.rows)
    assert len({(r[3], r[4]) for r in read}) == len(read) == 420  # once each
    produced = sorted((k, v, h or None) for k, v, h in _records(420))  # headers: null where none, as Spark has it
    assert sorted((r[0], r[1], r[6]) for r in read) == produced
    assert read == _spark_kafka_rows(spark, kafka.bootstrap, topic)  # every column, offsets and timestamps too
    assert {r[3] for r in _rows(second.rows)} >= {3}


def test_starting_offsets_json_resumes_each_partition_where_it_says(
    kafka: LocalBroker, spark, topic: str, tmp_path: Path
) -> None:
    for partition in range(3):
        _produce_to(kafka.bootstrap, topic, partition, count=20, first=100 * partition)
    # As `--resume-from-table` writes it: next offsets, -2 for a partition never seen, -1 for latest.
    starting = json.dumps({topic: {"0": 5, "1": -2, "2": -1}})
    collected = _drain(spark, _options(kafka.bootstrap, topic, startingOffsets=starting), tmp_path / "ck")
    read = {(r[3], r[4]) for r in _rows(collected.rows)}
    assert read == {(0, o) for o in range(5, 20)} | {(1, o) for o in range(20)}


def test_starting_offsets_json_must_name_every_partition_as_with_spark(kafka: LocalBroker, topic: str) -> None:
    partial = json.dumps({topic: {"0": 0, "1": 0}})
    reader = KafkaStreamReader(SourceSettings.parse(_options(kafka.bootstrap, topic, startingOffsets=partial)))
    try:
        with pytest.raises(
            KafkaSourceError,
            match=rf"every partition.*given: {topic}/0, {topic}/1; the topics have: {topic}/0, {topic}/1, {topic}/2",
        ):
            reader.initialOffset()
    finally:
        reader.stop()


@pytest.fixture
def pooled_consumers_closed():
    """Consumers of read_range called here live in this process: closed before the broker goes."""
    yield
    close_pooled_consumers()


def _delete_below(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([KafkaTopicPartition(topic, partition, offset)])
    for future in futures.values():
        future.result(30)


def test_offsets_deleted_by_retention_fail_the_query_naming_them(
    kafka: LocalBroker, spark, topic: str, tmp_path: Path
) -> None:
    _produce_to(kafka.bootstrap, topic, partition=0, count=30, first=0)
    _delete_below(kafka.bootstrap, topic, partition=0, offset=10)
    starting = json.dumps({topic: {"0": 0, "1": 0, "2": 0}})  # a checkpoint from before the deletion
    with pytest.raises(
        KafkaSourceError,
        match=rf"topic {topic} partition 0: offsets 0 to 9 of the range \[0, 30\) to read are gone from Kafka "
        r"\(the partition now starts at offset 10\).*failOnDataLoss",
    ):
        _drain(spark, _options(kafka.bootstrap, topic, startingOffsets=starting), tmp_path / "ck")

    # failOnDataLoss=false: the batch is planned from where the partition now starts.
    lenient = SourceSettings.parse(_options(kafka.bootstrap, topic, startingOffsets=starting, failOnDataLoss="false"))
    reader = KafkaStreamReader(lenient)
    try:
        start, end = reader.initialOffset(), reader.latestOffset()
        ranges = reader.partitions(start, end)
    finally:
        reader.stop()
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 10, 20), (0, 20, 30)]  # minPartitions=2


def test_a_reader_finding_its_start_deleted_since_planning_reports_it_or_skips(
    kafka: LocalBroker, topic: str, pooled_consumers_closed
) -> None:
    _produce_to(kafka.bootstrap, topic, partition=1, count=20, first=0)
    _delete_below(kafka.bootstrap, topic, partition=1, offset=8)
    settings = SourceSettings.parse(_options(kafka.bootstrap, topic, includeHeaders="true"))
    with pytest.raises(
        KafkaDataLossError, match=rf"topic {topic} partition 1: of the range \[3, 15\) to read, offsets 3 to 7 are gone"
    ):
        list(read_range(settings, topic, 1, 3, 15))
    lenient = SourceSettings.parse(_options(kafka.bootstrap, topic, failOnDataLoss="false"))
    batches = list(read_range(lenient, topic, 1, 3, 15))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(8, 15))


def test_a_range_is_read_up_to_its_end_and_never_past_it(
    kafka: LocalBroker, topic: str, pooled_consumers_closed
) -> None:
    _produce_to(kafka.bootstrap, topic, partition=2, count=50, first=0)
    settings = SourceSettings.parse({**_options(kafka.bootstrap, topic), "kafka.max.poll.records": "7"})
    for start, end in ((0, 50), (10, 11), (13, 40), (0, 50)):  # the last again on a pooled consumer
        batches = list(read_range(settings, topic, 2, start, end))
        assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(start, end))
        assert max(b.num_rows for b in batches) <= 7


def test_a_reader_fetches_about_one_read_past_its_range(kafka: LocalBroker, topic: str) -> None:
    """librdkafka fetches ahead until queued.min.messages records wait (100,000 by default); a task
    gives its consumer back at its range's end, dropping what was fetched past it for the next
    task to fetch again. The reader's settings keep that to about one read (kafka.max.poll.records)
    and the fetch responses in flight. The consumer here reads as a task does, with librdkafka's
    statistics counting what came; fetch responses are cut small so that there is more than one."""
    # Record batches of 1,000: a fetch response holds whole batches.
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "batch.num.messages": 1000})
    for i in range(20_000):
        producer.produce(topic, value=b"%020d" % i, partition=0)
    assert producer.flush(30) == 0
    settings = SourceSettings.parse(
        _options(
            kafka.bootstrap, topic, **{"kafka.max.poll.records": "100", "kafka.max.partition.fetch.bytes": "65536"}
        )
    )
    fetched: list[int] = []

    def statistics(report: str) -> None:
        fetched.append(json.loads(report)["rxmsgs"])

    consumer = Consumer({**settings.consumer_config(), "statistics.interval.ms": 100, "stats_cb": statistics})
    try:
        consumer.assign([KafkaTopicPartition(topic, 0, 0)])
        read = 0
        while read < 500:
            read += sum(m.error() is None for m in consumer.consume(100, timeout=1))
        time.sleep(1)  # what librdkafka fetches meanwhile, as while a task decodes
        consumer.poll(0.5)  # serves the statistics callback
    finally:
        consumer.close()
    # 64 KiB holds about 2,300 of these records; librdkafka's default would fetch all 20,000.
    assert fetched and 500 <= fetched[-1] <= 500 + 100 + 2 * 2_300, fetched


def test_the_secured_listener_is_read_with_the_services_java_client_settings(
    kafka: LocalBroker, spark, topic: str, tmp_path: Path
) -> None:
    assert produce_records(kafka.bootstrap, topic, _records(60)) == 60
    options = {
        **kafka_source_options(kafka.secure_bootstrap, topic, 2, kafka.client_options()),
        "startingOffsets": "earliest",
    }
    collected = _drain(spark, options, tmp_path / "ck")
    assert sorted((r[0], r[1]) for r in _rows(collected.rows)) == sorted((k, v) for k, v, _ in _records(60))


@pytest.mark.parametrize("store_type", ["JKS", "PKCS12"])
def test_a_java_truststore_is_read_as_the_java_client_reads_it(
    kafka: LocalBroker, spark, topic: str, tmp_path: Path, store_type: str
) -> None:
    """The JVM's default store type, JKS, and PKCS12: librdkafka gets their certificates as PEM."""
    import subprocess

    from streaming.source.options import _keytool

    store = tmp_path / f"ca.{store_type.lower()}"
    subprocess.run(
        [str(_keytool()), "-importcert", "-noprompt", "-alias", "ca", "-file", str(kafka.ca_file)]
        + ["-keystore", str(store), "-storetype", store_type, "-storepass", "changeit"],
        check=True,
        capture_output=True,
    )
    java = {**kafka.client_options(), "ssl.truststore.location": str(store), "ssl.truststore.password": "changeit"}
    if store_type == "JKS":
        del java["ssl.truststore.type"]  # the Java default
    else:
        java["ssl.truststore.type"] = store_type
    assert produce_records(kafka.bootstrap, topic, _records(20)) == 20
    options = {**kafka_source_options(kafka.secure_bootstrap, topic, 2, java), "startingOffsets": "earliest"}
    collected = _drain(spark, options, tmp_path / "ck")
    assert sorted((r[0], r[1]) for r in _rows(collected.rows)) == sorted((k, v) for k, v, _ in _records(20))


def test_a_wrong_password_fails_fast_naming_the_authentication(kafka: LocalBroker, topic: str) -> None:
    options = kafka_source_options(kafka.secure_bootstrap, topic, 2, kafka.client_options(password="not-the-password"))
    reader = KafkaStreamReader(SourceSettings.parse(options))
    started = time.monotonic()
    try:
        with pytest.raises(KafkaSourceError, match="SASL authentication error: Authentication failed"):
            reader.latestOffset()
    finally:
        reader.stop()  # its admin client would go on trying to log in
    assert time.monotonic() - started < 10  # not after the 30 s librdkafka would retry for


def test_available_now_runs_one_batch_only_with_a_python_source(
    kafka: LocalBroker, spark, topic: str, tmp_path: Path
) -> None:
    """Spark 4.0 falls back to a single batch for a Python source under Trigger.AvailableNow: with
    maxOffsetsPerTrigger that is one capped batch. If this starts failing, Spark runs it as it
    does its own sources, and the service's --until-idle can use it with this source."""
    assert produce_records(kafka.bootstrap, topic, _records(90)) == 90
    collected = _Collected()
    query = (
        python_kafka_stream(
            spark, _options(kafka.bootstrap, topic, startingOffsets="earliest", maxOffsetsPerTrigger="30")
        )
        .writeStream.foreachBatch(collected)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    assert query.awaitTermination(60)
    assert len(collected.batch_sizes) == 1 and 0 < collected.batch_sizes[0] <= 30


# -- settings, without a broker ------------------------------------------------------------------


def test_the_services_secured_client_settings_map_to_librdkafka(kafka: LocalBroker) -> None:
    connection, consumer = librdkafka_config({**FAST_FETCH, **kafka.client_options()})
    assert connection == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": kafka.user,
        "sasl.password": kafka.password,
        "ssl.ca.location": str(kafka.ca_file),
    }
    assert consumer == {
        "max.partition.fetch.bytes": FAST_FETCH["max.partition.fetch.bytes"],
        "fetch.max.bytes": FAST_FETCH["fetch.max.bytes"],
        "fetch.wait.max.ms": FAST_FETCH["fetch.max.wait.ms"],
    }
    # max.poll.records sizes the Arrow batches.
    assert SourceSettings.parse(_options("b:9092", "t")).records_per_batch == int(FAST_FETCH["max.poll.records"])


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        (
            {"ssl.truststore.location": "/no/such/ca.jks"},
            r"kafka.ssl.truststore.location=/no/such/ca.jks: no certificate read from this JKS truststore",
        ),
        ({"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config": "x required;"}, "sasl.mechanism=OAUTHBEARER"),
        (
            {
                "sasl.mechanism": "PLAIN",
                "sasl.jaas.config": 'com.sun.security.auth.module.Krb5LoginModule required principal="p";',
            },
            "not with com.sun.security.auth.module.Krb5LoginModule",
        ),
        ({"ssl.endpoint.identification.algorithm": "dns"}, "ssl.endpoint.identification.algorithm='dns'"),
    ],
)
def test_secured_settings_librdkafka_cannot_honour_are_refused_by_name(settings: dict[str, str], error: str) -> None:
    java = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";',
        **settings,
    }
    with pytest.raises(KafkaSourceError, match=error):
        librdkafka_config(java)


def test_source_options_are_checked_where_the_stream_is_defined() -> None:
    base = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t"}
    with pytest.raises(KafkaSourceError, match="option kafka.sasl.login.class: .* knows no librdkafka equivalent"):
        SourceSettings.parse({**base, "kafka.sasl.login.class": "x"})
    with pytest.raises(KafkaSourceError, match="option subscribepattern: not supported"):
        SourceSettings.parse({**base, "subscribePattern": "t.*"})
    with pytest.raises(KafkaSourceError, match="option startingOffsets: topic 'other' is not one of subscribe"):
        SourceSettings.parse({**base, "startingOffsets": '{"other": {"0": 1}}'})
    with pytest.raises(KafkaSourceError, match="option maxOffsetsPerTrigger='0': expected a number above 0"):
        SourceSettings.parse({**base, "maxOffsetsPerTrigger": "0"})
    assert (
        SourceSettings.parse({**base, "librdkafka.queued.min.messages": "5000"}).consumer_config()[
            "queued.min.messages"
        ]
        == "5000"
    )


def test_the_planner_waits_for_the_broker_as_long_as_sparks_source_does() -> None:
    """Spark's source tries an offsets request fetchOffset.numRetries (3) times, each bounded by the
    admin client's default.api.timeout.ms (60 s): a broker restart must not stop the Python
    source's planner sooner, and the settings that lengthen one lengthen the other."""
    base = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t"}
    assert SourceSettings.parse(base).metadata_timeout_s == 180
    longer = SourceSettings.parse({**base, "kafka.default.api.timeout.ms": "600000", "fetchOffset.numRetries": "2"})
    assert longer.metadata_timeout_s == 1200
    # Read here, never handed to librdkafka, which has no such property.
    assert "default.api.timeout.ms" not in {**longer.connection, **longer.consumer}
    with pytest.raises(KafkaSourceError, match="option kafka.default.api.timeout.ms='0'"):
        SourceSettings.parse({**base, "kafka.default.api.timeout.ms": "0"})


def test_big_ranges_are_split_to_reach_min_partitions_as_spark_does() -> None:
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 10), OffsetRange("t", 2, 5, 5)]
    assert split_ranges(ranges, 4) == [
        OffsetRange("t", 0, 0, 33),
        OffsetRange("t", 0, 33, 66),
        OffsetRange("t", 0, 66, 100),
        OffsetRange("t", 1, 0, 10),
    ]
    assert split_ranges(ranges, 2) == ranges[:2]


class _StalledConsumer:
    """A real consumer that hands out no record, as librdkafka's assign()ed consumer sometimes does
    after a broker restart (confluentinc/librdkafka#5153). A fake of that fault: it comes by
    chance, not on demand."""

    def __init__(self, pooled) -> None:
        self._real = pooled.consumer

    def consume(self, num_messages: int, timeout: float) -> list:
        self._real.consume(num_messages=num_messages, timeout=timeout)
        return []

    def __getattr__(self, name: str):
        return getattr(self._real, name)


def test_a_consumer_that_stops_fetching_is_replaced_and_the_range_read_whole(
    kafka: LocalBroker, topic: str, pooled_consumers_closed, monkeypatch
) -> None:
    import streaming.source.read as read

    _produce_to(kafka.bootstrap, topic, partition=1, count=40, first=0)
    real_new_consumer = read._new_consumer
    made: list = []

    def new_consumer(config):
        pooled = real_new_consumer(config)
        if not made:
            pooled.consumer = _StalledConsumer(pooled)
        made.append(pooled)
        return pooled

    close_pooled_consumers()
    monkeypatch.setattr(read, "_new_consumer", new_consumer)
    monkeypatch.setattr(read, "STALLED_CONSUMER_S", 1.0)
    settings = SourceSettings.parse(_options(kafka.bootstrap, topic))
    batches = list(read_range(settings, topic, 1, 5, 40))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(5, 40))
    assert len(made) == 2

    # The replacement still fails the read after kafkaConsumer.pollTimeoutMs when nothing comes.
    made.clear()
    close_pooled_consumers()
    monkeypatch.setattr(read, "_new_consumer", lambda config: _stalled(real_new_consumer(config), made))
    impatient = SourceSettings.parse(_options(kafka.bootstrap, topic, **{"kafkaConsumer.pollTimeoutMs": "3500"}))
    with pytest.raises(KafkaSourceError, match=rf"topic {topic} partition 1: no record arrived in 3.5 s at offset 5"):
        list(read_range(impatient, topic, 1, 5, 40))
    assert len(made) >= 3


def _stalled(pooled, made: list):
    pooled.consumer = _StalledConsumer(pooled)
    made.append(pooled)
    return pooled
