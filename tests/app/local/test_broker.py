"""The local Kafka broker, for real: started from its jars, spoken to with kafka-python."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from app.local.broker import BrokerError, LocalBroker, free_port
from tests.conftest import CACHE_DIR

pytestmark = pytest.mark.integration

MESSAGE_COUNT = 1000


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBroker]:
    broker = LocalBroker(tmp_path / "kafka", CACHE_DIR, port=free_port())
    yield broker
    broker.stop()  # also after a failed assertion: never leak a JVM


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def test_messages_round_trip_through_the_broker(broker: LocalBroker) -> None:
    broker.start()
    topic = "geo-events"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics({topic: {"num_partitions": 4, "replication_factor": 1}})
    finally:
        admin.close()

    sent = [{"id": i, "lon": -180 + i * 0.36, "lat": -90 + i * 0.18} for i in range(MESSAGE_COUNT)]
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    try:
        for event in sent:
            producer.send(topic, key=str(event["id"]).encode(), value=json.dumps(event).encode())
        producer.flush(timeout=30)
    finally:
        producer.close()

    # A consumer group exercises the group coordinator and the single-replica offsets topic.
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        group_id="test-broker",
        auto_offset_reset="earliest",
        consumer_timeout_ms=1000,
    )
    received: list[dict] = []
    deadline = time.monotonic() + 60
    try:
        while len(received) < MESSAGE_COUNT and time.monotonic() < deadline:
            received.extend(json.loads(record.value) for record in consumer)
    finally:
        consumer.close()

    assert len(received) == MESSAGE_COUNT
    assert sorted(received, key=lambda event: event["id"]) == sent


def test_start_is_idempotent_and_stop_closes_the_port(broker: LocalBroker) -> None:
    first = broker.start()
    assert first.running and first.pid is not None
    assert first.bootstrap == broker.bootstrap == f"127.0.0.1:{broker.port}"
    assert broker.status() == first

    # Another handle on the same home (as another process would create) finds the same broker.
    same_home = LocalBroker(broker.home, CACHE_DIR, port=broker.port)
    assert same_home.start() == first
    assert broker.start().pid == first.pid

    broker.stop()
    assert broker.status().running is False
    assert not (broker.home / "broker.pid").exists()
    assert not _port_accepts(broker.port)
    broker.stop()  # stopping a stopped broker is a no-op


def test_taken_port_fails_fast_naming_the_port(broker: LocalBroker) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", broker.port))
        squatter.listen()
        started = time.monotonic()
        with pytest.raises(BrokerError, match=str(broker.port)):
            broker.start(timeout=30)
        assert time.monotonic() - started < 25
    assert broker.status().running is False
