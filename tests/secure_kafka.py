"""A Kafka broker with a SASL_SSL listener (SCRAM-SHA-512 over TLS) beside its PLAINTEXT one.

A test module that needs it imports the fixture: `from tests.secure_kafka import secure_kafka`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.local.broker import LocalBroker, free_port
from tests.conftest import CACHE_DIR


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory) -> Iterator[LocalBroker]:
    port, secure_port = distinct_free_ports(2)
    broker = LocalBroker(tmp_path_factory.mktemp("secure-kafka"), CACHE_DIR, port=port, secure_port=secure_port)
    broker.ensure_jars()
    broker.start()
    yield broker
    broker.stop()


def distinct_free_ports(count: int) -> list[int]:
    """Unused loopback ports, no two alike (each free_port() alone may hand out the last one again)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports
