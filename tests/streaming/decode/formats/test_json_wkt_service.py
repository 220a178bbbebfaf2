"""Plain JSON events and WKT values through the real service: a real broker, real Spark, a real
catalog. Vehicle positions (lon / lat JSON) and WKT / EWKT values land as rows with their columns
and exact coordinates; a corpus of bad inputs reaches the dead-letter topic, each with its reason
and original bytes."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import shapely
from pyproj import Transformer

from app.service import run
from streaming.table.catalog import create_table, open_catalog
from tests.conftest import local_settings, produce_records
from tests.streaming.decode.formats.test_json_fields import BAD, VEHICLES
from tests.streaming.decode.formats.test_wkt import BAD as BAD_WKT
from tests.streaming.decode.test_dead_letter_corpus import dead_letters
from tests.streaming.decode.test_decoder import WKT_CONTRACT

pytestmark = pytest.mark.integration

TO_3857 = Transformer.from_crs("EPSG:4326", "EPSG:3857", always_xy=True)


def test_vehicle_positions_land_as_rows_and_bad_inputs_as_dead_letters(kafka, spark, topic, tmp_path):
    rng = np.random.default_rng(11)
    expected: dict[str, tuple[float, float, float]] = {}
    records = []
    for i, (x, y) in enumerate(zip(rng.uniform(-179, 179, 600).tolist(), rng.uniform(-89, 89, 600).tolist())):
        name = f"v-{i}"
        doc = {"vehicle": name, "position": {"lon": x, "lat": y, "heading": i % 360}, "speed": i / 4}
        if i % 2:
            doc["ts"] = "2026-11-25T14:00:00Z"
        expected[name] = (x, y, i / 4)
        records.append((f"key-{i}".encode(), json.dumps(doc).encode(), []))
    malformed = {f"bad-{n}".encode(): (value, reason.value) for n, (value, reason, _) in enumerate(BAD.values())}
    for n, (key, (value, _)) in enumerate(malformed.items()):
        records.insert(23 * n + 5, (key, value, []))
    assert produce_records(kafka.bootstrap, topic, records) == len(records)

    settings = local_settings(kafka, topic, tmp_path, max_offsets_per_trigger=250)
    create_table(open_catalog(settings.catalog_name, settings.catalog), VEHICLES)
    totals = run(settings, VEHICLES, until_idle=True, spark=spark)
    assert totals.commits == {"committed": totals.batches}

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(VEHICLES.table)
    rows = table.scan(selected_fields=("vehicle", "speed", "heading", "event_time", "geometry")).to_arrow().to_pylist()
    assert sorted(r["vehicle"] for r in rows) == sorted(expected)
    for row in rows:
        x, y, speed = expected[row["vehicle"]]
        point = shapely.from_wkb(row["geometry"])
        assert (point.x, point.y) == (x, y), "coordinates land bit for bit"
        assert row["speed"] == speed and row["heading"] == int(row["vehicle"][2:]) % 360
    assert sum(str(r["event_time"]).startswith("2026-11-25 14:00:00") for r in rows) == 300

    dead = dead_letters(kafka.bootstrap, settings.dead_letter_topic)
    assert {d.key: d.reason for d in dead.values()} == {key: reason for key, (_, reason) in malformed.items()}
    assert {d.key: d.value for d in dead.values()} == {key: value for key, (value, _) in malformed.items()}
    assert len(rows) + len(dead) == len(records) == totals.consumed


def test_wkt_and_ewkt_values_land_as_rows_and_bad_ones_as_dead_letters(kafka, spark, topic, tmp_path):
    rng = np.random.default_rng(12)
    expected: dict[str, shapely.Geometry] = {}
    records = []
    for i, (x, y) in enumerate(zip(rng.uniform(-170, 170, 600).tolist(), rng.uniform(-80, 80, 600).tolist())):
        if i % 3 == 0:
            geometry = shapely.LineString([(x, y), (x + 0.5, y + 0.25)])
            value = f"LINESTRING ({x!r} {y!r}, {x + 0.5!r} {y + 0.25!r})"
        elif i % 10 == 1:  # EWKT in Web Mercator: reprojected
            geometry = shapely.Point(x, y)
            mx, my = TO_3857.transform(x, y)
            value = f"SRID=3857;POINT ({mx!r} {my!r})"
        else:
            geometry = shapely.Point(x, y)
            value = f"POINT ({x!r} {y!r})"
        expected[f"w-{i}"] = geometry
        records.append((f"w-{i}".encode(), value.encode(), []))
    malformed = {f"bad-{n}".encode(): (value, reason.value) for n, (value, reason, _) in enumerate(BAD_WKT)}
    for n, (key, (value, _)) in enumerate(malformed.items()):
        records.insert(31 * n + 5, (key, value, []))
    assert produce_records(kafka.bootstrap, topic, records) == len(records)

    settings = local_settings(kafka, topic, tmp_path, max_offsets_per_trigger=250)
    contract = dataclasses.replace(
        WKT_CONTRACT, geometry=dataclasses.replace(WKT_CONTRACT.geometry, invalid_polygons="reject")
    )
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits == {"committed": totals.batches}

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    rows = table.scan(selected_fields=("event_id", "geometry")).to_arrow().to_pylist()
    assert sorted(r["event_id"] for r in rows) == sorted(expected)
    for row in rows:
        stored = shapely.from_wkb(row["geometry"])
        exact = 1e-7 if int(row["event_id"][2:]) % 10 == 1 and int(row["event_id"][2:]) % 3 else 0
        assert shapely.equals_exact(stored, expected[row["event_id"]], exact), row["event_id"]

    dead = dead_letters(kafka.bootstrap, settings.dead_letter_topic)
    assert {d.key: d.reason for d in dead.values()} == {key: reason for key, (_, reason) in malformed.items()}
    assert {d.key: d.value for d in dead.values()} == {key: value for key, (value, _) in malformed.items()}
    assert len(rows) + len(dead) == len(records) == totals.consumed
