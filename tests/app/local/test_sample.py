"""The demo's sample event stream: its mix, its contract, its geography, and producing it to Kafka."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import shapely

from app.local import sample
from app.local.broker import LocalBroker, free_port
from app.local.sample import KIND_SHARES, ProduceError, SampleEvent, produce, sample_events

ROOT = Path(__file__).resolve().parents[3]
MIX_SAMPLE_SIZE = 20_000
JSON_TYPES = {"string": str, "double": float, "long": int}


def classify(event: SampleEvent) -> str:
    """What the ingest should make of an event: point, track, zone, site or malformed."""
    if event.headers:
        try:
            geometry = shapely.from_wkb(event.value)
        except shapely.errors.GEOSException:
            return "malformed"
        expected = {"track": ("LineString",), "zone": ("Polygon",), "site": ("MultiPoint", "Polygon")}
        kind = dict(event.headers)["kind"].decode()
        return kind if geometry.geom_type in expected[kind] else "malformed"
    try:
        feature = json.loads(event.value)
    except json.JSONDecodeError:
        return "malformed"
    geometry = feature["geometry"]
    if geometry is None or not -90 <= geometry["coordinates"][1] <= 90:
        return "malformed"
    return "point"


@pytest.fixture(scope="module")
def events() -> list[SampleEvent]:
    return list(sample_events(MIX_SAMPLE_SIZE))


@pytest.fixture(scope="module")
def classes(events: list[SampleEvent]) -> list[str]:
    return [classify(event) for event in events]


def of_class(events: list[SampleEvent], classes: list[str], wanted: str) -> list[SampleEvent]:
    return [event for event, kind in zip(events, classes) if kind == wanted]


# -- pure -------------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_events_and_another_seed_others() -> None:
    first = list(sample_events(3_000, seed=11))
    assert first == list(sample_events(3_000, seed=11))
    assert [event.key for event in first] == [f"evt-{n}".encode() for n in range(3_000)]
    others = list(sample_events(3_000, seed=12))
    assert sum(a.value != b.value for a, b in zip(first, others)) > 2_900


def test_a_shorter_stream_is_a_prefix_of_a_longer_one() -> None:
    longer = list(sample_events(sample.CHUNK_SIZE + 10))
    assert list(sample_events(1_000)) == longer[:1_000]
    assert list(sample_events(sample.CHUNK_SIZE + 3)) == longer[: sample.CHUNK_SIZE + 3]


def test_the_mix_of_kinds_matches_the_shares(events: list[SampleEvent], classes: list[str]) -> None:
    counts = Counter(classes)
    assert sum(counts.values()) == MIX_SAMPLE_SIZE
    for kind, share in KIND_SHARES.items():
        tolerance = 4 * (share * (1 - share) / MIX_SAMPLE_SIZE) ** 0.5  # 4 sigma of a binomial
        assert abs(counts[kind] / MIX_SAMPLE_SIZE - share) < tolerance, (kind, counts)

    points = [json.loads(event.value) for event in of_class(events, classes, "point")]
    with_altitude = sum(len(point["geometry"]["coordinates"]) == 3 for point in points) / len(points)
    assert 0.02 < with_altitude < 0.04

    zones = shapely.from_wkb([event.value for event in of_class(events, classes, "zone")])
    with_hole = np.mean(shapely.get_num_interior_rings(zones) > 0)
    assert 0.2 < with_hole < 0.4

    sites = shapely.from_wkb([event.value for event in of_class(events, classes, "site")])
    assert set(shapely.get_type_id(sites)) == {shapely.GeometryType.MULTIPOINT, shapely.GeometryType.POLYGON}


def test_every_kind_of_malformed_event_is_there(events: list[SampleEvent], classes: list[str]) -> None:
    malformed = of_class(events, classes, "malformed")
    kinds = Counter()
    for event in malformed:
        if event.headers:
            kinds["garbage_bytes"] += 1
            continue
        try:
            feature = json.loads(event.value)
        except json.JSONDecodeError:
            kinds["truncated_json"] += 1
            continue
        kinds["null_geometry" if feature["geometry"] is None else "bad_latitude"] += 1
    assert set(kinds) == set(sample.MALFORMED_KINDS), kinds


def test_geojson_features_carry_the_contract_properties(events: list[SampleEvent], classes: list[str]) -> None:
    contract = json.loads((ROOT / "schemas" / "demo_events.json").read_text())
    property_types = {
        source.removeprefix("properties."): JSON_TYPES[column["type"]]
        for column in contract["columns"]
        for source in column["from"]
        if source.startswith("properties.")
    }
    assert set(property_types) == {"kind", "name", "speed", "population"}

    for event in of_class(events, classes, "point"):
        feature = json.loads(event.value)
        assert feature["type"] == "Feature"
        assert feature["id"].encode() == event.key
        assert feature["geometry"]["type"] == "Point"
        assert event.headers == ()
        properties = feature["properties"]
        assert set(properties) == set(property_types)
        for name, json_type in property_types.items():
            assert type(properties[name]) is json_type, (name, properties)  # a bool is no long
        assert properties["kind"] == "ping"
        assert properties["speed"] >= 0 and properties["population"] > 0


def test_binary_events_are_keyed_by_id_and_zones_embed_srid_3857(events: list[SampleEvent], classes: list[str]) -> None:
    for event, kind in zip(events, classes):
        if kind in ("track", "zone", "site"):
            assert event.headers == (("kind", kind.encode()),)
            assert event.key.startswith(b"evt-")

    zones = shapely.from_wkb([event.value for event in of_class(events, classes, "zone")])
    assert set(shapely.get_srid(zones)) == {3857}
    assert shapely.is_valid(zones).all()
    assert np.abs(shapely.bounds(zones)).max() < 20_037_509  # metres: inside the Web Mercator square

    for kind in ("track", "site"):  # plain WKB in EPSG:4326: no SRID, lon/lat in range
        geometries = shapely.from_wkb([event.value for event in of_class(events, classes, kind)])
        assert set(shapely.get_srid(geometries)) == {0}
        bounds = shapely.bounds(geometries)
        assert np.abs(bounds[:, [0, 2]]).max() <= 180 and np.abs(bounds[:, [1, 3]]).max() <= 90

    tracks = shapely.from_wkb([event.value for event in of_class(events, classes, "track")])
    vertices = shapely.get_num_coordinates(tracks)
    assert vertices.min() == 5 and vertices.max() == 30
    length_km = _track_lengths_km(tracks)
    assert np.percentile(length_km, 5) > 1 and np.percentile(length_km, 95) < 10


def test_points_lie_near_populated_places(events: list[SampleEvent], classes: list[str]) -> None:
    cities = sample._cities()
    tree = shapely.STRtree(shapely.points(cities.lon, cities.lat))
    points = of_class(events, classes, "point")
    coordinates = np.array([json.loads(event.value)["geometry"]["coordinates"][:2] for event in points])
    # Coarse: 0.45 degrees is 50 km of latitude (and less than that of longitude, away from the equator).
    near, _ = tree.query(shapely.points(coordinates), predicate="dwithin", distance=0.45)
    assert len(np.unique(near)) / len(coordinates) > 0.9

    # Skewed toward big cities: the 2 % of cities with a million people draw many more events.
    populations = np.array([json.loads(event.value)["properties"]["population"] for event in points])
    city_share, event_share = np.mean(cities.population >= 1e6), np.mean(populations >= 1e6)
    assert event_share > 5 * city_share


def test_producing_to_an_unreachable_broker_fails_fast_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sample, "_CONNECT_TIMEOUT_MS", 1_000)
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(ProduceError, match=bootstrap):
        produce(bootstrap, "nowhere", sample_events(10), progress=False)
    assert time.monotonic() - started < 10


def _track_lengths_km(tracks: np.ndarray) -> np.ndarray:
    coordinates, track = shapely.get_coordinates(tracks, return_index=True)
    lon, lat = np.radians(coordinates[:, 0]), np.radians(coordinates[:, 1])
    same_track = track[1:] == track[:-1]
    # Equirectangular distances between consecutive vertices: fine for steps of a few hundred metres.
    east = (lon[1:] - lon[:-1]) * np.cos((lat[1:] + lat[:-1]) / 2)
    north = lat[1:] - lat[:-1]
    steps_km = 6371.0 * np.hypot(east, north) * same_track
    return np.bincount(track[1:], weights=steps_km, minlength=len(tracks))


# -- against a real broker --------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "two-worker-processes"])
def test_produced_events_come_back_from_the_broker(kafka: LocalBroker, workers: int) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer

    count, topic = 20_000, f"sample-events-{workers}-{uuid.uuid4().hex[:8]}"
    acknowledged = produce(kafka.bootstrap, topic, sample_events(count), total=count, progress=False, workers=workers)
    assert acknowledged == count

    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        assert len(admin.describe_topics([topic])[0]["partitions"]) == 4
    finally:
        admin.close()

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka.bootstrap,
        group_id=f"sample-test-{topic}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=30_000,  # bounds a stall, not the happy path: we stop at `count`
    )
    try:
        records = []
        for record in consumer:
            records.append(record)
            if len(records) == count:
                break
        extra = consumer.poll(timeout_ms=1_000)
    finally:
        consumer.close()
    assert not any(extra.values()), "more records than were produced"
    assert len(records) == count
    assert len({record.key for record in records}) == count
    sent = {event.key: event for event in sample_events(count)}
    for record in records[::97]:
        event = sent[record.key]
        assert (record.value, tuple(record.headers)) == (event.value, event.headers)
