"""PostGIS changes through Debezium, as real parts for the tests: a throwaway PostgreSQL with
PostGIS and logical decoding (tests/postgres.py), and a Kafka Connect worker running Debezium's
PostgreSQL connector against the session's broker (app/local/kafka_connect.py).

    from tests.debezium import kafka_connect, postgis  # noqa: F401  (the fixtures, in a test module)

`postgis` skips the tests that use it if no server can be run here (as `postgres_uri` does);
`kafka_connect` is a worker with no connector yet: a test starts it with its own
(`start_connector`), and the fixture stops it, so no JVM outlives the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from app.local.broker import LocalBroker
from app.local.kafka_connect import LocalKafkaConnect, PostgresSource, debezium_postgres_config
from tests.conftest import CACHE_DIR
from tests.postgres import PostgresServer, PostgresUnavailable, postgres_server


@pytest.fixture(scope="module")
def postgis() -> Iterator[PostgresServer]:
    """A PostgreSQL server with PostGIS and wal_level=logical, its user allowed to replicate."""
    try:
        with postgres_server(logical=True, postgis=True) as server:
            yield server
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server with PostGIS: {exc}")


def connect_db(server: PostgresServer):
    """A psycopg2 connection to the server's database, autocommit: each statement is a transaction."""
    conn = psycopg2.connect(
        host=server.host, port=server.port, dbname=server.database, user=server.user, password=server.password
    )
    conn.autocommit = True
    return conn


def source_of(server: PostgresServer) -> PostgresSource:
    return PostgresSource(server.host, server.port, server.database, server.user, server.password)


@pytest.fixture
def kafka_connect(kafka: LocalBroker, tmp_path: Path) -> Iterator[LocalKafkaConnect]:
    worker = LocalKafkaConnect(tmp_path / "connect", CACHE_DIR, kafka.bootstrap)
    worker.ensure_jars()
    yield worker
    worker.stop()


def start_connector(
    worker: LocalKafkaConnect,
    server: PostgresServer,
    tables: list[str],
    schemas: bool = True,
    avro_registry: str = "",
    reselect: bool = True,
) -> tuple[str, dict[str, dict[str, str]]]:
    """Run a Debezium connector of these tables on the worker (the JSON converter, or with
    `avro_registry`, Apicurio's Avro converter against that registry's root URL; without `reselect`,
    the values an update left out stay out); returns its topic prefix and the worker's connectors
    (to start it again with). Its replication slot and publication have names of their own, so
    tests never share one."""
    suffix = uuid.uuid4().hex[:8]
    prefix = f"dbz{suffix}"
    config = debezium_postgres_config(
        source_of(server),
        tables,
        prefix,
        f"slot_{suffix}",
        schemas=schemas,
        avro_registry=avro_registry,
        reselect=reselect,
    )
    connectors = {f"pg-{suffix}": config}
    worker.start(connectors)
    return prefix, connectors
