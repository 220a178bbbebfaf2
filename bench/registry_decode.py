"""Avro in the Confluent wire format against GeoJSON points: events per second through the whole
decoder (streaming.decode.decoder.Decoder: format, geometry rules, columns, Hilbert keys, output
batch), on one core, for the same places.

  geojson   GeoJSON Feature documents {"type":"Feature","id":..,"geometry":{Point},"properties":{kind, speed}}
  avro      the same events as Avro records {id, lon, lat, kind, speed} behind the wire format's
            5-byte header, the geometry from the lon / lat fields (contract registry section)
  protobuf  the same events as Protobuf messages {id, lon, lat, kind, speed}, likewise
  fastavro  for reference: fastavro's per-record reader (schemaless_reader in a Python loop) on
            the same Avro bodies, to Python dicts only (no geometry, no columns)

The schema is put in the format's cache by id beforehand: a registry is asked once per schema id,
not per batch. The process is pinned to one CPU and timed in process CPU seconds, so other work
on the machine does not count. Each figure is the best of --repeats runs. Prints a table and writes
bench/results/registry_decode.json and .md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):  # run as a script: streaming/ and bench/cities.py
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import fastavro  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from cities import city_points  # noqa: E402

from streaming.contract import parse_contract  # noqa: E402
from streaming.decode.decoder import REJECT_REASON, Decoder  # noqa: E402
from streaming.decode.formats.avro import AvroFormat  # noqa: E402
from streaming.decode.formats.avro_schema import compile_schema  # noqa: E402
from streaming.decode.formats.protobuf import ProtobufFormat, compile_proto  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SCHEMA_ID = 1
SCHEMA = {
    "type": "record",
    "name": "Ping",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "lon", "type": "double"},
        {"name": "lat", "type": "double"},
        {"name": "kind", "type": "string"},
        {"name": "speed", "type": "long"},
    ],
}


PROTO = """syntax = "proto3";
message Ping { string id = 1; double lon = 2; double lat = 3; string kind = 4; int64 speed = 5; }
"""


def ping_class():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="bench_ping.proto", syntax="proto3")
    m = fdp.message_type.add(name="Ping")
    for number, (name, kind) in enumerate(
        [
            ("id", F.TYPE_STRING),
            ("lon", F.TYPE_DOUBLE),
            ("lat", F.TYPE_DOUBLE),
            ("kind", F.TYPE_STRING),
            ("speed", F.TYPE_INT64),
        ],
        start=1,
    ):
        m.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("Ping"))


def contract(formats: list[str]) -> dict:
    raw = {
        "table": "bench.pings",
        "formats": formats,
        "columns": [
            {"id": 1, "name": "event_id", "type": "string", "required": True, "from": ["id", "properties.id"]},
            {"id": 2, "name": "kind", "type": "string", "from": ["properties.kind"]},
            {"id": 3, "name": "speed", "type": "double", "from": ["properties.speed"]},
            {"id": 4, "name": "event_time", "type": "timestamptz", "required": True, "from": ["kafka.timestamp"]},
        ],
        "geometry": {"id": 5, "name": "geometry", "types": ["Point"], "dimensions": ["XY"], "crs": "EPSG:4326"},
        "bbox": {"id": 6, "name": "bbox"},
        "clustering": {"extent": [-180.0, -90.0, 180.0, 90.0]},
    }
    if formats in (["avro"], ["protobuf"]):
        raw["registry"] = {"lon_field": "lon", "lat_field": "lat"}
    return raw


def kafka_batch(values: list[bytes]) -> pa.RecordBatch:
    n = len(values)
    return pa.record_batch(
        {
            "key": pa.nulls(n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array(["pings"] * n, pa.string()),
            "partition": pa.array(np.zeros(n, dtype=np.int32)),
            "offset": pa.array(np.arange(n, dtype=np.int64)),
            "timestamp": pa.array(1_700_000_000_000_000 + np.arange(n), pa.timestamp("us")),
        }
    )


def events(n: int) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """The same events as GeoJSON documents, Avro bodies and wire-format values."""
    x, y = city_points(n, seed=5, jitter_deg=0.05, bounds=(-179.0, -84.0, 179.0, 84.0))
    x, y = np.round(x, 6), np.round(y, 6)  # what the GeoJSON text holds, so both carry the same places
    geojson = [
        (
            '{"type":"Feature","id":"e%d","geometry":{"type":"Point","coordinates":[%.6f,%.6f]},'
            '"properties":{"kind":"ping","speed":%d}}' % (i, a, b, i % 120)
        ).encode()
        for i, (a, b) in enumerate(zip(x, y))
    ]
    parsed = fastavro.parse_schema(SCHEMA)
    bodies = []
    for i, (a, b) in enumerate(zip(x, y)):
        out = io.BytesIO()
        fastavro.schemaless_writer(
            out, parsed, {"id": f"e{i}", "lon": float(a), "lat": float(b), "kind": "ping", "speed": i % 120}
        )
        bodies.append(out.getvalue())
    header = b"\x00" + struct.pack(">I", SCHEMA_ID)
    return geojson, bodies, [header + body for body in bodies]


def protobuf_events(n: int) -> list[bytes]:
    x, y = city_points(n, seed=5, jitter_deg=0.05, bounds=(-179.0, -84.0, 179.0, 84.0))
    x, y = np.round(x, 6), np.round(y, 6)
    ping = ping_class()
    header = b"\x00" + struct.pack(">I", SCHEMA_ID) + b"\x00"  # message indexes: the first message
    return [
        header + ping(id=f"e{i}", lon=float(a), lat=float(b), kind="ping", speed=i % 120).SerializeToString()
        for i, (a, b) in enumerate(zip(x, y))
    ]


def best_rate(work: Callable[[], object], n: int, repeats: int) -> int:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return int(n / best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # 20,000: the Arrow batch a Python worker decodes at a time (spark.sql.execution.arrow.maxRecordsPerBatch)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    geojson, bodies, wire = events(args.events)
    geojson_batch, avro_batch = kafka_batch(geojson), kafka_batch(wire)
    geojson_decoder = Decoder(parse_contract(contract(["geojson"])))
    avro_decoder = Decoder(parse_contract(contract(["avro"])))
    (avro_format,) = [f for f in avro_decoder._formats if isinstance(f, AvroFormat)]
    avro_format._plans[SCHEMA_ID] = compile_schema(SCHEMA_ID, json.dumps(SCHEMA))

    protobuf_batch = kafka_batch(protobuf_events(args.events))
    protobuf_decoder = Decoder(parse_contract(contract(["protobuf"])))
    (protobuf_format,) = [f for f in protobuf_decoder._formats if isinstance(f, ProtobufFormat)]
    protobuf_format._plans[SCHEMA_ID] = compile_proto(SCHEMA_ID, PROTO)

    # All read every event, and to the same places.
    out_geojson, out_avro = geojson_decoder.decode(geojson_batch), avro_decoder.decode(avro_batch)
    out_protobuf = protobuf_decoder.decode(protobuf_batch)
    assert out_protobuf.column(REJECT_REASON).null_count == args.events
    assert out_protobuf.column("geometry").equals(out_geojson.column("geometry"))
    assert out_geojson.column(REJECT_REASON).null_count == args.events
    assert out_avro.column(REJECT_REASON).null_count == args.events
    assert out_avro.column("geometry").equals(out_geojson.column("geometry"))
    assert out_avro.column("event_id").equals(out_geojson.column("event_id"))

    parsed = fastavro.parse_schema(SCHEMA)

    def fastavro_loop() -> None:
        for body in bodies:
            fastavro.schemaless_reader(io.BytesIO(body), parsed, None)

    rows = [
        {
            "path": "geojson points, Decoder",
            "events_per_s": best_rate(lambda: geojson_decoder.decode(geojson_batch), args.events, args.repeats),
        },
        {
            "path": "avro points (lon/lat fields), Decoder",
            "events_per_s": best_rate(lambda: avro_decoder.decode(avro_batch), args.events, args.repeats),
        },
        {
            "path": "protobuf points (lon/lat fields), Decoder",
            "events_per_s": best_rate(lambda: protobuf_decoder.decode(protobuf_batch), args.events, args.repeats),
        },
        {
            "path": "fastavro schemaless_reader per record, to dicts only",
            "events_per_s": best_rate(fastavro_loop, args.events, args.repeats),
        },
    ]
    ratio = rows[1]["events_per_s"] / rows[0]["events_per_s"]
    protobuf_ratio = rows[2]["events_per_s"] / rows[0]["events_per_s"]
    report = {
        "events": args.events,
        "repeats": args.repeats,
        "cores": 1,
        "rows": rows,
        "avro_over_geojson": round(ratio, 2),
        "protobuf_over_geojson": round(protobuf_ratio, 2),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "registry_decode.json").write_text(json.dumps(report, indent=2))
    lines = [
        f"Events per second on one core (CPU time), {args.events:,} point events per batch, best of {args.repeats}",
        "",
        "| path | events/s |",
        "|---|---|",
        *(f"| {row['path']} | {row['events_per_s']:,} |" for row in rows),
        "",
        f"Avro over GeoJSON: {ratio:.2f}x; Protobuf over GeoJSON: {protobuf_ratio:.2f}x",
    ]
    text = "\n".join(lines) + "\n"
    (RESULTS / "registry_decode.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
