"""Generators of hostile Kafka records for fuzzing the decoder: valid seeds of each format, and
mutations that aim where parsers break (depth, size claims, control bytes, trailing bytes, wrong
nesting, encodings, numbers beyond the double range, WKB spellings GEOS overlooks). Shared by the
fuzz test in `make test` and the long fuzz run (`make fuzz`, bench/fuzz_decode.py).

A saved input of the formats geojson, wkb, ewkb, gpkg, json, wkt and stac is a value; one of
key_headers is a whole record packed into bytes (`pack_record`), so that any bytes a fuzzer makes are
a record too. `contract_for` names the contract each format is decoded under: the formats of
events with the geometry in fields (json), as text (wkt) and STAC Items (stac) take contracts of
their own."""

from __future__ import annotations

import dataclasses
import json
import random
import struct
from pathlib import Path

import shapely

from streaming.contract import Contract, load_contract

FORMATS = ("geojson", "wkb", "ewkb", "gpkg", "key_headers", "json", "wkt", "stac")
SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"

_SEED_GEOMETRIES = [
    "POINT (2.35 48.86)",
    "POINT Z (2.35 48.86 35)",
    "POINT M (1 2 3)",
    "POINT ZM (1 2 3 4)",
    "LINESTRING (0 0, 1 1, 2 0)",
    "POLYGON ((0 0, 1 0, 1 1, 0 1, 0 0), (0.2 0.2, 0.4 0.2, 0.4 0.4, 0.2 0.2))",
    "MULTIPOINT ((1 2), (3 4))",
    "MULTILINESTRING ((0 0, 1 1), (2 2, 3 3))",
    "MULTIPOLYGON (((0 0, 1 0, 1 1, 0 0)), ((5 5, 6 5, 6 6, 5 5)))",
    "GEOMETRYCOLLECTION (POINT (1 2), LINESTRING (0 0, 1 1))",
    "POINT EMPTY",
    "POLYGON EMPTY",
]
_SRIDS = (4326, 3857, 2154, 32633, 0, -1, 5773, 4978, 999999, 0x7FFFFFFF)
# Curves GEOS reads and shapely cannot hold, to put inside collections: a CircularString, a
# CompoundCurve of it, an empty CurvePolygon.
_CIRCULAR = b"\x01\x08\x00\x00\x00\x03\x00\x00\x00" + struct.pack("<6d", 0, 0, 1, 1, 2, 0)
_CURVE_PARTS = [_CIRCULAR, b"\x01\x09\x00\x00\x00\x01\x00\x00\x00" + _CIRCULAR, b"\x01\x0a\x00\x00\x00\x00\x00\x00\x00"]
_CONTROL = [bytes([c]) for c in range(0x20)] + [b"\x7f", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\\u0000", b"\\ud800"]


def seed_geometries() -> list[shapely.Geometry]:
    return [shapely.from_wkt(w) for w in _SEED_GEOMETRIES]


def seed_feature(rng: random.Random) -> dict:
    geometry = json.loads(shapely.to_geojson(rng.choice(seed_geometries()[:10])))
    return {
        "type": "Feature",
        "id": rng.choice(["a", 7, None, 1.5, "x" * 40]),
        "geometry": geometry,
        "properties": {"kind": "ping", "speed": rng.random() * 100, "population": rng.randrange(10**6)},
    }


def contract_for(fmt: str) -> Contract:
    """The contract records of `fmt` are decoded under."""
    demo = load_contract(SCHEMAS / "demo_events.json")
    if fmt == "json":
        return load_contract(SCHEMAS / "vehicle_positions.json")
    if fmt == "stac":
        return load_contract(SCHEMAS / "scenes.json")
    if fmt == "wkt":
        return dataclasses.replace(demo, formats=(*demo.formats, "wkt", "ewkt"))
    return dataclasses.replace(demo, formats=(*demo.formats, "gpkg"))


def seed_position(rng: random.Random) -> dict:
    """A vehicle position as schemas/vehicle_positions.json reads it."""
    position: dict = {"lon": rng.uniform(-180, 180), "lat": rng.uniform(-90, 90)}
    if rng.random() < 0.3:
        position = {k: rng.choice([v, str(v), None, [v], {"v": v}, "1e999", True]) for k, v in position.items()}
    return {
        "vehicle": rng.choice(["v1", "", "x" * 40, 7, None]),
        "position": position,
        "speed": rng.random() * 100,
        "ts": rng.choice(["2026-11-25T14:00:00Z", "yesterday", 1764079200000, None]),
    }


def json_value(rng: random.Random) -> bytes:
    doc: object = seed_position(rng)
    for _ in range(rng.randint(0, 3)):
        doc = mutate_json(doc, rng)
    try:
        text = json.dumps(doc, allow_nan=True, ensure_ascii=rng.random() < 0.7).encode("utf-8", "surrogatepass")
    except (RecursionError, ValueError):
        text = b'{"position":' + b"[" * 5000
    return mutate_text(text, rng) if rng.random() < 0.5 else text


def wkt_value(rng: random.Random) -> bytes:
    """WKT and EWKT text, damaged where text readers break: cuts, deep nesting, odd numbers and tokens."""
    text = shapely.to_wkt(rng.choice(seed_geometries()), rounding_precision=-1).encode()
    if rng.random() < 0.3:
        text = b"SRID=%d;" % rng.choice(_SRIDS) + text
    choice = rng.randrange(7)
    if choice == 0:
        return text[: rng.randrange(len(text) + 1)]
    if choice == 1:
        depth = rng.choice([10, 100, 5000])
        return b"GEOMETRYCOLLECTION (" * depth + b"POINT (1 2)" + b")" * depth
    if choice == 2:
        return text.replace(b"1", rng.choice([b"1e999", b"nan", b"-inf", b"1" * 400, b"0x1", b"1,5"]), 1)
    if choice == 3:
        return rng.choice([text.lower(), b"  \n" + text + b" \t", text + b" trailing", b"SRID=;" + text, b"SRID=4326"])
    if choice == 4:
        return rng.choice([b"CIRCULARSTRING (0 0, 1 1, 2 0)", b"TRIANGLE ((0 0, 1 0, 0 1, 0 0))", b"POINT (1 2 3 4 5)"])
    return mutate_bytes(text, rng)


def _mostly(rng: random.Random, values: list):
    """The first value three times in four, else one of the others."""
    return values[0] if rng.random() < 0.75 else rng.choice(values[1:])


def seed_item(rng: random.Random) -> dict:
    """A STAC Item of one Cloud Optimized GeoTIFF in a UTM zone, as schemas/scenes.json reads it."""
    x0, y0, pixel, width, height = 500_000.0, 5_000_000.0, 10.0, 1000, 800
    footprint = shapely.box(176.9, 45.0, 178.1, 45.1)
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": ["https://stac-extensions.github.io/projection/v1.1.0/schema.json"],
        "id": _mostly(rng, ["scene-1", "", 7, None]),
        "geometry": json.loads(shapely.to_geojson(footprint)),
        "bbox": list(footprint.bounds),
        "properties": {
            "datetime": _mostly(rng, ["2026-11-25T10:00:00Z", None, "noon"]),
            "platform": "sentinel-2a",
            "eo:cloud_cover": _mostly(rng, [12.5, "12", None]),
            "proj:code": _mostly(rng, ["EPSG:32660", "EPSG:0", "EPSG:4326", "nonsense", None]),
            "proj:transform": rng.choice(
                [[pixel, 0.0, x0, 0.0, -pixel, y0], [pixel, 0.0, x0], [0, 0, 0, 0, 0, 0], "1,2,3"]
            ),
            "proj:shape": _mostly(rng, [[height, width], [0, width], [height], [-1, 5], [10**12, 10**12]]),
        },
        "assets": {
            "visual": {
                "href": _mostly(rng, ["s3://bucket/scene-1.tif", "", None]),
                "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                "roles": ["data"],
            }
        },
        "links": [],
    }


def stac_value(rng: random.Random) -> bytes:
    doc: object = seed_item(rng)
    for _ in range(rng.randint(0, 3)):
        doc = mutate_json(doc, rng)
    try:
        text = json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
    except (RecursionError, ValueError):
        text = b'{"type":"Feature","assets":' + b"[" * 5000
    return mutate_text(text, rng) if rng.random() < 0.5 else text


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
            data[at:at] = struct.pack(
                rng.choice("<>") + "I",
                rng.choice(
                    [0, 1, 7, 1007, 0x7FFFFFFF, 0xFFFFFFFF, 0x20000001, 0x80000007, 0x01000007, 0x00010007, 0x00000107]
                ),
            )
        elif choice == 5 and data:
            j = rng.randrange(len(data))
            data[at:at] = data[j : j + rng.randint(1, 64)]
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
        return doc[:i] + [mutate_json(doc[i], rng, depth + 1)] + doc[i + 1 :]
    if choice == 3:
        levels = rng.choice([2, 40, 2000])
        inner = doc
        for _ in range(levels):
            inner = rng.choice(
                [[inner], {"type": "GeometryCollection", "geometries": [inner]}, {"type": "Feature", "geometry": inner}]
            )
        return inner
    if choice == 4 and isinstance(doc, dict):
        return {
            **doc,
            "geometry": rng.choice(
                [
                    {"type": "Feature", "geometry": doc.get("geometry")},
                    "POINT (1 2)",
                    [1, 2],
                    {"type": "FeatureCollection", "features": []},
                    {"type": "Point"},
                    {"coordinates": [1, 2]},
                ]
            ),
        }
    if choice == 5 and isinstance(doc, dict):
        return {**doc, "type": rng.choice(["Feature", "feature", "FeatureCollection", 5, None, "Point"])}
    if choice == 6 and isinstance(doc, dict):
        return {
            **doc,
            "properties": rng.choice(
                [[], "x", {"speed": "fast"}, {"population": 2**70}, {"kind": {"nested": [1, 2]}}, None]
            ),
        }
    if choice == 7 and isinstance(doc, list):
        return doc * rng.choice([0, 2, 50])
    if choice == 8 and isinstance(doc, dict) and isinstance(doc.get("geometry"), dict):
        g = dict(doc["geometry"])
        g["coordinates"] = rng.choice(
            [[1, 2, 3, 4], [[1, 2]], [], "1,2", [1e999, 2], [["1", "2"]], [[0, 0], [1, 1]] * 5000]
        )
        return {**doc, "geometry": g}
    if choice == 9 and depth < 3:
        return [doc, mutate_json(doc, rng, depth + 1)]
    if choice == 10 and isinstance(doc, dict):
        return {
            **doc,
            "id": rng.choice(
                [
                    10**400,
                    -(2**63) - 1,
                    2**64,
                    1e308,
                    float("nan"),
                    float("inf"),
                    0.5,
                    -0.0,
                    "\ud800",
                    "a\u0000b",
                    "",
                    "x" * 5000,
                    [],
                    {},
                    True,
                ]
            ),
        }
    if choice == 11 and isinstance(doc, dict):
        props = doc.get("properties") if isinstance(doc.get("properties"), dict) else {}
        return {
            **doc,
            "properties": {
                **props,
                rng.choice(["speed", "population", "kind", "name"]): rng.choice(
                    [
                        float("nan"),
                        float("-inf"),
                        10**400,
                        1e-400,
                        "\udc00",
                        "x\u2028y",
                        2**63,
                        -(2**63),
                        [[]] * 3,
                        "2024-02-30T25:61:00Z",
                        None,
                    ]
                ),
            },
        }
    return doc


def geojson_value(rng: random.Random) -> bytes:
    doc = seed_feature(rng)
    for _ in range(rng.randint(0, 3)):
        doc = mutate_json(doc, rng)
    try:
        text = json.dumps(
            doc, allow_nan=True, indent=rng.choice([None, None, 2]), ensure_ascii=rng.random() < 0.7
        ).encode("utf-8", "surrogatepass")
    except (RecursionError, ValueError):
        text = b'{"type":"Feature","geometry":' + b"[" * 5000
    return mutate_text(text, rng) if rng.random() < 0.5 else text


def mutate_text(text: bytes, rng: random.Random) -> bytes:
    """Damage where JSON readers disagree: raw line breaks and control bytes inside strings,
    other encodings, byte order marks, numbers beyond the double range, duplicate members."""
    choice = rng.randrange(8)
    quotes = [i for i, b in enumerate(text) if b == ord('"')]
    if choice == 0 and quotes:
        at = rng.choice(quotes) + 1
        return text[:at] + rng.choice([b"\n", b"\r", b"\r\n", b"\t", b"\x00", b"\x1b", b"\\\n"]) + text[at:]
    if choice == 1:
        return text.decode("utf-8", "replace").encode(rng.choice(["utf-16-le", "utf-16-be", "utf-16", "utf-32"]))
    if choice == 2:
        return rng.choice([b"\xef\xbb\xbf", b" \n\t", b"\x00", b"\xfe\xff"]) + text
    if choice == 3:
        return text.replace(
            b"[",
            b"["
            + rng.choice(
                [b"1" * 5000, b"1e999", b"-1e-999", b"NaN", b"-Infinity", b"0x10", b"01", b"+1", b"1.e5", b".5"]
            )
            + b",",
            1,
        )
    if choice == 4 and text.startswith(b"{"):
        member = rng.choice(
            [
                b'"type":"FeatureCollection",',
                b'"geometry":{"type":"Feature","geometry":null},',
                b'"geometry":"POINT (1 2)",',
                b'"id":{"a":1},',
                b'"properties":[1],',
            ]
        )
        return text[:-1] + b"," + member[:-1] + b"}" if rng.random() < 0.5 else b"{" + member + text[1:]
    return mutate_bytes(text, rng)


def wkb_value(rng: random.Random, with_srid: bool = False) -> bytes:
    geometry = rng.choice(seed_geometries())
    if with_srid:
        blob = shapely.to_wkb(
            shapely.set_srid(geometry, rng.choice(_SRIDS)),
            include_srid=True,
            byte_order=rng.choice([0, 1]),
            output_dimension=4,
        )
    else:
        blob = shapely.to_wkb(
            geometry, byte_order=rng.choice([0, 1]), output_dimension=4, flavor=rng.choice(["iso", "extended"])
        )
    if rng.random() < 0.15:  # spellings GEOS overlooks: undefined type bits, odd byte orders, part SRIDs
        part = shapely.to_wkb(
            rng.choice(seed_geometries()[:4]),
            byte_order=rng.choice([0, 1]),
            output_dimension=rng.choice([2, 3, 4]),
            include_srid=False,
        )
        code = rng.choice([4, 7, 1004, 3007, 0x80000007, 0x20000007, 0x00010007, 0x01000004, 0x200003EF])
        order = rng.choice([0, 1, 2, 7, 255])
        fmt = "<" if order != 0 else ">"
        head = bytes([order]) + struct.pack(fmt + "I", code)
        if code & 0x20000000:
            head += struct.pack(fmt + "i", rng.choice(_SRIDS))
        blob = (
            head
            + struct.pack(fmt + "I", rng.choice([1, 2, 0]))
            + part
            + rng.choice([b"", part, ewkb_part(rng), *_CURVE_PARTS])
        )
    if rng.random() < 0.1:  # collections nested in collections, deeper than GEOS's stack allows
        # GEOS reads the type from the low 16 bits: the high ones may hold anything
        code = rng.choice([7, 6, 3007]) | rng.choice([0, 0x01000000, 0x00010000, 0x10000000, 0x80000000])
        order = rng.choice("<>")
        header = (b"\x01" if order == "<" else b"\x00") + struct.pack(order + "II", code, 1)
        blob = header * rng.choice([3, 40, 50_000]) + blob
    return mutate_bytes(blob, rng) if rng.random() < 0.8 else blob


def gpkg_value(rng: random.Random) -> bytes:
    """A GeoPackage geometry: a header (either byte order, any envelope kind, the reserved ones
    and odd flags now and then, an srs_id of every kind) over a WKB value (a seed geometry, or a
    hostile value of wkb_value), its envelope right, off or cut short; often damaged byte by byte
    as a whole."""
    from tests.gpkg_blobs import envelope_of, header

    # The envelope is a seed geometry's: reading a hostile value here would meet what the decoder must survive.
    shape = rng.choice(seed_geometries())
    hostile = rng.random() < 0.3
    wkb = wkb_value(rng) if hostile else shapely.to_wkb(shape, output_dimension=4, byte_order=rng.choice([0, 1]))
    kind = rng.choice([0, 0, 1, 1, 2, 3, 4, 5, 7])
    envelope = envelope_of(shape, kind) if kind <= 4 else [rng.random()] * (2 * (kind % 5) + 2)
    if rng.random() < 0.2 and envelope:
        envelope[rng.randrange(len(envelope))] += rng.choice([1e-12, 1e-3, 1e9, float("nan"), float("inf")])
    blob = header(
        srs_id=rng.choice((0, 0, -1, 4326, 3857, 2154, 999999, 5773, -7, 0x7FFFFFFF)),
        kind=kind,
        little=rng.random() < 0.7,
        empty=rng.random() < 0.1 or (not hostile and bool(shapely.is_empty(shape))),
        extended=rng.random() < 0.05,
        envelope=envelope,
        version=rng.choice([0] * 20 + [1, 255]),
        magic=rng.choice([b"GP"] * 30 + [b"GQ", b"G", b"Gp"]),
        extra_flags=rng.choice([0] * 20 + [0x40, 0x80]),
    )
    if rng.random() < 0.1:
        blob = blob[: rng.randrange(len(blob) + 1)]
    blob += wkb
    return mutate_bytes(blob, rng) if rng.random() < 0.5 else blob


def ewkb_part(rng: random.Random) -> bytes:
    return shapely.to_wkb(
        shapely.set_srid(shapely.Point(1, 2), rng.choice(_SRIDS)), include_srid=True, byte_order=rng.choice([0, 1])
    )


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
    elif fmt == "gpkg":
        value = gpkg_value(rng)
    elif fmt == "json":
        value = json_value(rng)
    elif fmt == "wkt":
        value = wkt_value(rng)
    elif fmt == "stac":
        value = stac_value(rng)
    else:
        value = rng.choice([geojson_value(rng), wkb_value(rng)])
        key = rng.choice(
            [
                None,
                b"",
                mutate_bytes(b"key-1", rng),
                bytes(rng.randrange(256) for _ in range(20)),
                b"k" * rng.choice([1000, 70_000]),
                b"\xed\xa0\x80",
            ]
        )
        headers = [
            (
                rng.choice(["source", "event_id", "kind", "x" * 300, "", "kind\u0000", "\u00e9t\u00e9"]),
                rng.choice([None, b"", mutate_bytes(b"value", rng), b"\xff\xfe", b"ping", b"v" * 70_000]),
            )
            for _ in range(rng.randint(0, 4))
        ]
    if rng.random() < 0.02:
        value = None
    return key, value, headers


_NONE = 0xFFFFFFFF


def pack_record(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> bytes:
    """A record as bytes: key, header count, each header's name and value, then the value; each
    part after its 4-byte length (0xFFFFFFFF: none)."""

    def part(data: bytes | None) -> bytes:
        return struct.pack("<I", _NONE) if data is None else struct.pack("<I", len(data)) + data

    out = part(key) + bytes([len(headers)])
    for name, header_value in headers:
        out += part(name.encode("utf-8", "surrogatepass")) + part(header_value)
    return out + (value if value is not None else b"")


def unpack_record(data: bytes) -> tuple[bytes | None, bytes, list[tuple[str, bytes | None]]]:
    """The record of any bytes (the inverse of pack_record where they came from it): a length
    beyond the bytes left takes what is left."""
    pos = 0

    def part() -> bytes | None:
        nonlocal pos
        if len(data) - pos < 4:
            pos = len(data)
            return None
        (length,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if length == _NONE:
            return None
        chunk = data[pos : pos + length]
        pos += len(chunk)
        return chunk

    key = part()
    count = data[pos] % 5 if pos < len(data) else 0
    pos += 1
    headers = []
    for _ in range(count):
        name = part()
        headers.append(((name or b"").decode("utf-8", "replace"), part()))
    return key, data[pos:], headers


def saved_record(path: Path) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """The record a saved input of fuzz_corpus/<format>/ stands for."""
    data = path.read_bytes()
    return unpack_record(data) if path.parent.name == "key_headers" else (b"k", data, [])


def saved_input(fmt: str, record: tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]) -> bytes:
    """What is saved of a record of a format (see saved_record)."""
    key, value, headers = record
    return pack_record(key, value, headers) if fmt == "key_headers" else (value or b"")
