"""The local broker's SASL_SSL listener, reached by both Kafka clients with `client_options()`:
kafka-python through `client_config`, Spark's source (the Java client) as it is."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from app.local.broker import LocalBroker
from streaming.job.config import kafka_source_options
from streaming.source.admin import client_config, ensure_topic, partitions_of
from tests.conftest import CACHE_DIR
from tests.secure_kafka import distinct_free_ports, secure_kafka  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

MESSAGE_COUNT = 200
# A refused client gives up after this instead of kafka-python's 30 s (pyproject allows 2.2 as well as 3.x,
# so only the options this kafka-python knows are passed).
_FAIL_FAST = {
    key: value
    for key, value in {"bootstrap_timeout_ms": 3000, "request_timeout_ms": 3000}.items()
    if key in KafkaAdminClient.DEFAULT_CONFIG
}


@pytest.fixture
def secure_topic(secure_kafka: LocalBroker) -> str:  # noqa: F811
    """A fresh topic with 3 partitions holding MESSAGE_COUNT records, made over SASL_SSL."""
    options = secure_kafka.client_options()
    name = f"secure-{uuid.uuid4().hex[:10]}"
    ensure_topic(secure_kafka.secure_bootstrap, name, options, partitions=3)
    producer = KafkaProducer(
        bootstrap_servers=secure_kafka.secure_bootstrap, acks="all", **client_config(options, KafkaProducer)
    )
    try:
        futures = [producer.send(name, key=str(i).encode(), value=f"event-{i}".encode()) for i in range(MESSAGE_COUNT)]
        producer.flush(timeout=30)
    finally:
        producer.close()
    assert all(future.succeeded() for future in futures)
    return name


def _admin(broker: LocalBroker, options: dict[str, str]) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=broker.secure_bootstrap, **client_config(options, KafkaAdminClient), **_FAIL_FAST
    )


def test_kafka_python_creates_produces_and_consumes_over_sasl_ssl(
    secure_kafka: LocalBroker,  # noqa: F811
    secure_topic: str,
) -> None:
    options = secure_kafka.client_options()
    # 3 partitions: the admin client made the topic (the broker would auto-create it with 4).
    assert partitions_of(secure_kafka.secure_bootstrap, secure_topic, options) == [0, 1, 2]

    consumer = KafkaConsumer(
        secure_topic,
        bootstrap_servers=secure_kafka.secure_bootstrap,
        group_id="secure-test",
        auto_offset_reset="earliest",
        consumer_timeout_ms=1000,
        **client_config(options, KafkaConsumer),
    )
    received: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(received) < MESSAGE_COUNT and time.monotonic() < deadline:
            received.extend(record.value for record in consumer)
    finally:
        consumer.close()
    assert sorted(received) == sorted(f"event-{i}".encode() for i in range(MESSAGE_COUNT))


def test_a_wrong_password_is_refused_as_an_authentication_failure(secure_kafka: LocalBroker) -> None:  # noqa: F811
    refusals_before = _refused_logins(secure_kafka)
    started = time.monotonic()
    # kafka-python retries a refused login until its bootstrap timeout and then reports only the
    # timeout; whether it logs the broker's reason first depends on whether it reads the error
    # response before the broker closes the connection. The broker's log always has it.
    with pytest.raises(KafkaError):
        _admin(secure_kafka, secure_kafka.client_options(password="not-the-password")).close()
    assert time.monotonic() - started < 15
    assert _refused_logins(secure_kafka) > refusals_before


def _refused_logins(broker: LocalBroker) -> int:
    log = broker.log_file.read_text(errors="replace")
    return log.count("due to invalid credentials with SASL mechanism SCRAM-SHA-512")


def test_a_client_that_does_not_trust_the_ca_is_refused(secure_kafka: LocalBroker, caplog) -> None:  # noqa: F811
    # The kafka logger's own level, as the CLI run in-process by another test in this worker sets it to CRITICAL.
    caplog.set_level(logging.WARNING, logger="kafka")
    options = {k: v for k, v in secure_kafka.client_options().items() if not k.startswith("ssl.truststore.")}
    started = time.monotonic()
    with pytest.raises(KafkaError):
        _admin(secure_kafka, options).close()
    assert time.monotonic() - started < 15
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


def test_spark_reads_the_topic_over_sasl_ssl(
    secure_kafka: LocalBroker,
    secure_topic: str,  # noqa: F811
    spark,
) -> None:
    options = kafka_source_options(secure_kafka.secure_bootstrap, secure_topic, 2, secure_kafka.client_options())
    assert spark.read.format("kafka").options(**options).load().count() == MESSAGE_COUNT


def test_spark_with_a_wrong_password_fails_naming_the_authentication(
    secure_kafka: LocalBroker,  # noqa: F811
    secure_topic: str,
    spark,
) -> None:
    options = kafka_source_options(
        secure_kafka.secure_bootstrap, secure_topic, 2, secure_kafka.client_options(password="not-the-password")
    )
    started = time.monotonic()
    with pytest.raises(Exception, match="SaslAuthenticationException"):
        spark.read.format("kafka").options(**options).load().count()
    assert time.monotonic() - started < 30


def test_a_home_made_without_the_secure_listener_gains_it_with_keytool_certificates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, secure_port = distinct_free_ports(2)
    home = tmp_path / "kafka"
    try:
        plain = LocalBroker(home, CACHE_DIR, port=port)
        plain.start()
        plain.stop()
        assert not plain.tls_dir.exists() and not plain.scram_marker_file.exists()

        # No openssl on the PATH: the certificates come from the Java runtime's keytool.
        monkeypatch.setenv("PATH", str(tmp_path / "no-openssl-here"))
        secure = LocalBroker(home, CACHE_DIR, port=port, secure_port=secure_port)
        secure.start()
        assert (secure.tls_dir / "broker.p12").is_file()
        assert secure.ca_file.read_text().startswith("-----BEGIN CERTIFICATE-----")
        admin = _admin(secure, secure.client_options())  # the SCRAM user was added to the running broker
        try:
            assert isinstance(admin.list_topics(), list)
        finally:
            admin.close()

        ca = secure.ca_file.read_bytes()
        secure.stop()
        secure.start()
        assert secure.ca_file.read_bytes() == ca  # kept across restarts: clients keep trusting it
        admin = _admin(secure, secure.client_options())
        admin.close()
    finally:
        LocalBroker(home, CACHE_DIR).stop()
