"""Poison pills: records that once stopped the stream, sent to the real service (`geoingest run`).

The service keeps running and healthy while they arrive, they reach the dead-letter topic, and the
records after them land. A record that crashes native code in the decoder is found and rejected as
decode_failed."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import shapely

from app.local.broker import free_port
from tests.streaming.decode.test_dead_letter_corpus import dead_letters, large_record_topic, padded_to, produce
from tests.streaming.job.test_chaos import CONTRACT, CONTRACT_FILE, Service, catalog_of, geoingest, service_env

pytestmark = pytest.mark.integration

# A WKB GeometryCollection header of one part, repeated: GEOS reads each level recursively and
# overflows its stack at this depth (tests/streaming/decode/test_isolation.py).
CRASHING_WKB = b"\x01\x07\x00\x00\x00\x01\x00\x00\x00" * 50_000 + shapely.to_wkb(shapely.Point(1, 2))


def good(prefix: str, n: int) -> list[tuple[bytes, bytes, list]]:
    return [
        (
            f"{prefix}-{i}".encode(),
            json.dumps(
                {
                    "type": "Feature",
                    "id": f"{prefix}-{i}",
                    "properties": {"kind": "ping"},
                    "geometry": {"type": "Point", "coordinates": [2.0 + i * 0.001, 48.0]},
                }
            ).encode(),
            [],
        )
        for i in range(n)
    ]


def landed(env: dict[str, str]) -> set[str]:
    table = catalog_of(env).load_table(CONTRACT.table)
    return set(table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist())


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # refused or timed out: the server is down


class Prober(threading.Thread):
    """Polls /healthz and /readyz twice a second, keeping every answer."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.urls = [f"http://127.0.0.1:{port}/healthz", f"http://127.0.0.1:{port}/readyz"]
        self.answers: list[tuple[float, int, int]] = []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.5):
            self.answers.append((time.monotonic(), *(status(url) for url in self.urls)))

    def stop(self) -> None:
        self._done.set()
        self.join(10)


def wait_for(condition, service: Service, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert service.alive, (
            f"the service exited ({service.process.returncode}) before {what}:\n{service.stderr_tail()}"
        )
        assert time.monotonic() < deadline, f"no {what} in {timeout} s:\n{service.stderr_tail()}"
        time.sleep(1)


def test_the_service_stays_healthy_through_poison_pills_and_the_records_after_them_land(kafka, tmp_path):
    topic = large_record_topic(kafka.bootstrap, partitions=2)
    port = free_port()
    env = service_env(
        kafka.bootstrap,
        topic,
        tmp_path,
        GEOINGEST_METRICS_PORT=str(port),
        GEOINGEST_TRIGGER_INTERVAL="2 seconds",
        # room for the 100,001-vertex polygon (2.4 MB of GeoJSON) to meet max_vertices
        GEOINGEST_MAX_MESSAGE_BYTES=str(4 * 1024 * 1024),
    )
    geoingest(env, "table", "create", "--contract", str(CONTRACT_FILE))
    before, after = good("before", 50), good("after", 200)
    angles = np.linspace(0, 2 * np.pi, 100_000, endpoint=False)
    circle = np.round(np.column_stack([2.0 + 0.1 * np.cos(angles), 48.0 + 0.1 * np.sin(angles)]), 7).tolist()
    ring = [*circle, circle[0]]  # 100,001 vertices
    poison = {
        "message_too_large": (b"fifty-megabytes", padded_to(50_000_000), []),
        "nesting_too_deep": (
            b"deep",
            b'{"type":"Feature","id":"deep","properties":{},"geometry":{"type":"Point",'
            b'"coordinates":' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
            [],
        ),
        "too_many_vertices": (
            b"vertices",
            json.dumps(
                {
                    "type": "Feature",
                    "id": "vertices",
                    "properties": {},
                    "geometry": {"type": "Polygon", "coordinates": [ring]},
                }
            ).encode(),
            [],
        ),
    }
    assert produce(kafka.bootstrap, topic, before) == len(before)

    service = Service(env, tmp_path, "poison", extra_env={})
    prober = Prober(port)
    try:
        wait_for(
            lambda: status(prober.urls[1]) == 200 and len(landed(env)) == len(before),
            service,
            "the first records in the table",
        )
        prober.start()
        records = [
            after[0],
            poison["message_too_large"],
            *after[1:50],
            poison["nesting_too_deep"],
            *after[50:100],
            poison["too_many_vertices"],
            *after[100:],
        ]
        assert produce(kafka.bootstrap, topic, records) == len(records)
        wait_for(
            lambda: landed(env) >= {f"after-{i}" for i in range(len(after))},
            service,
            "the records sent after the poison pills in the table",
        )
        time.sleep(3)  # a few more probes after the pills went through
    finally:
        prober.stop()
        code = service.stop()  # SIGTERM, as Kubernetes stops a pod
    assert code == 0, service.stderr_tail()

    assert len(prober.answers) >= 10
    refused = [
        (round(t - prober.answers[0][0], 1), health, ready)
        for t, health, ready in prober.answers
        if (health, ready) != (200, 200)
    ]
    assert refused == [], "/healthz and /readyz answered 200 throughout"
    assert landed(env) == {key.decode() for key, _, _ in before + after}
    dead = dead_letters(kafka.bootstrap, f"{topic}.dlq")
    assert sorted(d.reason for d in dead.values()) == sorted(poison)
    for letter in dead.values():
        key, value, _ = poison[letter.reason]
        assert (letter.key, letter.value) == (key, value), letter.reason
    assert [d.spilled for d in dead.values() if d.reason == "message_too_large"] == [True]


def test_a_record_that_crashes_the_decoder_is_dead_lettered_and_the_records_after_it_land(kafka, tmp_path):
    topic = large_record_topic(kafka.bootstrap, partitions=1)
    # The nesting guard raised above the record's depth lets GEOS meet it and crash.
    env = service_env(kafka.bootstrap, topic, tmp_path, GEOINGEST_MAX_NESTING=str(10**6))
    geoingest(env, "table", "create", "--contract", str(CONTRACT_FILE))
    before, after = good("before", 30), good("after", 30)
    assert produce(kafka.bootstrap, topic, [*before, (b"crash", CRASHING_WKB, []), *after]) == 61

    geoingest(env, "run", "--contract", str(CONTRACT_FILE), "--until-idle", timeout=900)

    assert landed(env) == {key.decode() for key, _, _ in before + after}
    dead = dead_letters(kafka.bootstrap, f"{topic}.dlq")
    assert [(d.reason, d.key, d.value) for d in dead.values()] == [("decode_failed", b"crash", CRASHING_WKB)]
