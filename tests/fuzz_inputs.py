"""Generators of hostile Kafka records for fuzzing the decoder: valid seeds of each format, and
mutations that aim where parsers break (depth, size claims, control bytes, trailing bytes, wrong
nesting). Shared by the fuzz test in `make test` and the long fuzz run in `make bench`."""

from __future__ import annotations

import json
import random
import struct

import shapely

FORMATS = ("geojson", "wkb", "ewkb", "key_headers")

_SEED_GEOMETRIES = [
    "POINT (2.35 48.86)", "POINT Z (2.35 48.86 35)", "POINT M (1 2 3)", "POINT ZM (1 2 3 4)",
    "LINESTRING (0 0, 1 1, 2 0)", "POLYGON ((0 0, 1 0, 1 1, 0 1, 0 0), (0.2 0.2, 0.4 0.2, 0.4 0.4, 0.2 0.2))",
    "MULTIPOINT ((1 2), (3 4))", "MULTILINESTRING ((0 0, 1 1), (2 2, 3 3))",
    "MULTIPOLYGON (((0 0, 1 0, 1 1, 0 0)), ((5 5, 6 5, 6 6, 5 5)))",
    "GEOMETRYCOLLECTION (POINT (1 2), LINESTRING (0 0, 1 1))", "POINT EMPTY", "POLYGON EMPTY",
]
_SRIDS = (4326, 3857, 2154, 32633, 0, -1, 5773, 4978, 999999, 0x7FFFFFFF)
_CONTROL = [bytes([c]) for c in range(0x20)] + [b"\x7f", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\\u0000", b"\\ud800"]


def seed_geometries() -> list[shapely.Geometry]:
    return [shapely.from_wkt(w) for w in _SEED_GEOMETRIES]


def seed_feature(rng: random.Random) -> dict:
    geometry = json.loads(shapely.to_geojson(rng.choice(seed_geometries()[:10])))
    return {"type": "Feature", "id": rng.choice(["a", 7, None, 1.5, "x" * 40]),
            "geometry": geometry, "properties": {"kind": "ping", "speed": rng.random() * 100,
                                                 "population": rng.randrange(10**6)}}


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Byte-level damage: flips, cuts, inserts, appends, splices, control bytes."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(8)
        at = rng.randrange(len(data) + 1)
        if choice == 0 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif choice == 1:
            del data[at:]
        elif choice == 2:
            data[at:at] = rng.choice(_CONTROL)
        elif choice == 3:
            data += rng.choice([b"junk", b"\x00", b" {}", b"\x01", bytes(rng.randrange(256) for _ in range(9))])
        elif choice == 4:
            data[at:at] = struct.pack(rng.choice("<>") + "I", rng.choice([0, 1, 7, 1007, 0x7FFFFFFF, 0xFFFFFFFF,
                                                                           0x20000001, 0x80000007, 0x01000007,
                                                                           0x00010007, 0x00000107]))
        elif choice == 5 and data:
            j = rng.randrange(len(data))
            data[at:at] = data[j:j + rng.randint(1, 64)]
        elif choice == 6:
            data[at:at] = rng.choice([b"[", b"{", b"]", b"}", b'"', b"\\", b",", b":"]) * rng.choice([1, 3, 1000])
        elif data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
    return bytes(data)


def mutate_json(doc: object, rng: random.Random, depth: int = 0) -> object:
    """Structure-level damage: wrong types, wrong nesting, deep nesting, odd numbers."""
    choice = rng.randrange(12)
    if choice == 0:
        return rng.choice([None, True, 0, -1, 1e308, 1e999 if rng.random() < 0.5 else float("nan"), "", [], {}])
    if choice == 1 and isinstance(doc, dict) and doc:
        key = rng.choice(list(doc))
        return {**doc, key: mutate_json(doc[key], rng, depth + 1)}
    if choice == 2 and isinstance(doc, list) and doc:
        i = rng.randrange(len(doc))
        return doc[:i] + [mutate_json(doc[i], rng, depth + 1)] + doc[i + 1:]
    if choice == 3:
        levels = rng.choice([2, 40, 2000])
        inner = doc
        for _ in range(levels):
            inner = rng.choice([[inner], {"type": "GeometryCollection", "geometries": [inner]},
                                {"type": "Feature", "geometry": inner}])
        return inner
    if choice == 4 and isinstance(doc, dict):
        return {**doc, "geometry": rng.choice([{"type": "Feature", "geometry": doc.get("geometry")},
                                               "POINT (1 2)", [1, 2], {"type": "FeatureCollection", "features": []},
                                               {"type": "Point"}, {"coordinates": [1, 2]}])}
    if choice == 5 and isinstance(doc, dict):
        return {**doc, "type": rng.choice(["Feature", "feature", "FeatureCollection", 5, None, "Point"])}
    if choice == 6 and isinstance(doc, dict):
        return {**doc, "properties": rng.choice([[], "x", {"speed": "fast"}, {"population": 2**70},
                                                 {"kind": {"nested": [1, 2]}}, None])}
    if choice == 7 and isinstance(doc, list):
        return doc * rng.choice([0, 2, 50])
    if choice == 8 and isinstance(doc, dict) and isinstance(doc.get("geometry"), dict):
        g = dict(doc["geometry"])
        g["coordinates"] = rng.choice([[1, 2, 3, 4], [[1, 2]], [], "1,2", [1e999, 2], [["1", "2"]],
                                       [[0, 0], [1, 1]] * 5000])
        return {**doc, "geometry": g}
    if choice == 9 and depth < 3:
        return [doc, mutate_json(doc, rng, depth + 1)]
    return doc


def geojson_value(rng: random.Random) -> bytes:
    doc = seed_feature(rng)
    for _ in range(rng.randint(0, 3)):
        doc = mutate_json(doc, rng)
    try:
        text = json.dumps(doc, allow_nan=True).encode()
    except (RecursionError, ValueError):
        text = b'{"type":"Feature","geometry":' + b"[" * 5000
    return mutate_bytes(text, rng) if rng.random() < 0.5 else text


def wkb_value(rng: random.Random, with_srid: bool = False) -> bytes:
    geometry = rng.choice(seed_geometries())
    if with_srid:
        blob = shapely.to_wkb(shapely.set_srid(geometry, rng.choice(_SRIDS)), include_srid=True,
                              byte_order=rng.choice([0, 1]), output_dimension=4)
    else:
        blob = shapely.to_wkb(geometry, byte_order=rng.choice([0, 1]), output_dimension=4,
                              flavor=rng.choice(["iso", "extended"]))
    if rng.random() < 0.1:  # collections nested in collections, deeper than GEOS's stack allows
        # GEOS reads the type from the low 16 bits: the high ones may hold anything
        code = rng.choice([7, 6, 3007]) | rng.choice([0, 0x01000000, 0x00010000, 0x10000000, 0x80000000])
        order = rng.choice("<>")
        header = (b"\x01" if order == "<" else b"\x00") + struct.pack(order + "II", code, 1)
        blob = header * rng.choice([3, 40, 50_000]) + blob
    return mutate_bytes(blob, rng) if rng.random() < 0.8 else blob


def record(fmt: str, rng: random.Random) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """One (key, value, headers) record of a format."""
    key: bytes | None = b"k"
    headers: list[tuple[str, bytes | None]] = []
    if fmt == "geojson":
        value = geojson_value(rng)
    elif fmt == "wkb":
        value = wkb_value(rng)
    elif fmt == "ewkb":
        value = wkb_value(rng, with_srid=True)
    else:
        value = rng.choice([geojson_value(rng), wkb_value(rng)])
        key = rng.choice([None, b"", mutate_bytes(b"key-1", rng), bytes(rng.randrange(256) for _ in range(20))])
        headers = [(rng.choice(["source", "event_id", "kind", "x" * 300, ""]),
                    rng.choice([None, b"", mutate_bytes(b"value", rng), b"\xff\xfe"]))
                   for _ in range(rng.randint(0, 4))]
    if rng.random() < 0.02:
        value = None
    return key, value, headers
