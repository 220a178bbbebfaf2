"""Shared real components for the tests: one Kafka broker and one Spark session per test run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from app.local.broker import LocalBroker, free_port
from app.local.schema_registry import LocalSchemaRegistry
from app.settings import load_settings
from streaming.table.catalog import open_catalog

# Property tests draw new examples on every run, except under .ci/run (HYPOTHESIS_PROFILE=ci): a
# landing is judged on the same examples every time, and `make fuzz` is where inputs are explored.
hypothesis_settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Jars (Kafka broker, Spark's Kafka connector) are shared with dev work and the demo.
CACHE_DIR = Path(load_settings(env=dict(os.environ)).cache_dir)


def local_settings(kafka: LocalBroker, topic: str, tmp_path: Path, **more):
    """Settings of a service on the test broker, its embedded SQLite catalog, warehouse and
    checkpoints under tmp_path, no metrics server; `more` as load_settings takes them (a `catalog`
    of its own too)."""
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path / 'wh'}"}
    return load_settings(
        env={},
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        metrics_port=0,
        cache_dir=str(CACHE_DIR),
        checkpoint_location=str(tmp_path / "ck"),
        **{"catalog": catalog, **more},
    )


# The Spark session of a module's shape (local, or a standalone cluster) and the lakehouse's servers.
from tests.lakehouse import object_store, rest_catalog  # noqa: E402,F401
from tests.spark_shapes import cluster_spark, spark, spark_cluster, spark_sessions  # noqa: E402,F401


@pytest.fixture(scope="session")
def kafka(tmp_path_factory) -> Iterator[LocalBroker]:
    # Both listeners: the tests' own clients use the plain one, the lakehouse shape's service the
    # SASL_SSL one (tests/streaming/job/test_lakehouse.py).
    broker = LocalBroker(tmp_path_factory.mktemp("kafka"), CACHE_DIR, port=free_port(), secure_port=free_port())
    broker.ensure_jars()
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def catalog(tmp_path: Path):
    return open_catalog(
        "test",
        {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
            "warehouse": f"file://{tmp_path / 'warehouse'}",
        },
    )


@pytest.fixture
def topic(kafka: LocalBroker) -> str:
    """A fresh topic with 3 partitions."""
    name = f"geo-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1)])
    finally:
        admin.close()
    return name


def produce_records(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]],
    max_request_size: int = 8 * 1024 * 1024,
    flush_timeout_s: float = 60,
) -> int:
    """Send (key, value, headers) records; returns how many the broker acknowledged."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_request_size=max_request_size)
    try:
        futures = [producer.send(topic, key=k, value=v, headers=h or None) for k, v, h in records]
        producer.flush(timeout=flush_timeout_s)
        return sum(1 for f in futures if f.succeeded())
    finally:
        producer.close()


def duckdb_connection():
    """DuckDB with its avro, iceberg and spatial extensions loaded from their PyPI wheels."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg
    import duckdb_extension_spatial

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for module in (duckdb_extension_avro, duckdb_extension_iceberg, duckdb_extension_spatial):
        for extension in Path(module.__file__).parent.glob("extensions/*/*.duckdb_extension"):
            con.execute(f"LOAD '{extension}'")
    return con


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory) -> Iterator[LocalSchemaRegistry]:
    """Apicurio Registry on loopback, in-memory storage (assembled from Maven Central once)."""
    registry = LocalSchemaRegistry(tmp_path_factory.mktemp("schema-registry"), CACHE_DIR)
    registry.start()
    yield registry
    registry.stop()
