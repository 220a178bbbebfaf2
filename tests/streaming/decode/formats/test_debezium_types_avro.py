"""Debezium change events of typed PostgreSQL columns (numeric(12,2), date, timestamp, timestamptz,
uuid, text[], int[], jsonb) through an Avro converter: the Connect types the converter notes in the Avro schema
(`connect.name`, a Decimal's bytes with its scale) fill the contract's typed and nested columns as
the JSON converter's events do (tests/streaming/decode/formats/test_debezium_types.py). The schema
is registered in the real registry (Apicurio, tests/conftest.py), the records written by fastavro."""

from __future__ import annotations

import datetime
import json
import uuid
from decimal import Decimal

import pytest
import shapely

from streaming.decode.rejects import Reason
from tests.app.local.test_schema_registry import register
from tests.streaming.decode.formats.test_avro import avro_bytes, wire
from tests.streaming.decode.formats.test_debezium_avro import GEOMETRY, SOURCE, change, decoder, ewkb, optional
from tests.streaming.decode.formats.test_debezium_types import REF, TYPED
from tests.streaming.decode.test_decoder import REJECT_DETAIL, REJECT_REASON, assert_valid, kafka_batch

pytestmark = pytest.mark.integration

UTC = datetime.UTC
DECIMAL_12_2 = {
    "type": "bytes",
    "scale": 2,
    "precision": 12,
    "connect.version": 1,
    "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"},
    "connect.name": "org.apache.kafka.connect.data.Decimal",
    "logicalType": "decimal",
}


def connect(avro_type: str, name: str) -> dict:
    return {"type": avro_type, "connect.version": 1, "connect.name": name}


def envelope(prefix: str) -> dict:
    """The value schema of a table (id, name, price numeric(14,2), day date, seen timestamp, seen_tz
    timestamptz, ref uuid, tags text[], counts int[], doc jsonb, attrs jsonb, amount numeric(12,2),
    geom) as Apicurio's Avro converter writes Debezium's Connect schema: an array column an Avro
    array of optional items."""
    columns = {
        "name": "string",
        # numeric(14,2) at the source, wider than the contract's decimal(12, 2)
        "price": {
            **DECIMAL_12_2,
            "precision": 14,
            "connect.parameters": {"scale": "2", "connect.decimal.precision": "14"},
        },
        "day": connect("int", "io.debezium.time.Date"),
        "seen": connect("long", "io.debezium.time.MicroTimestamp"),
        "seen_tz": connect("string", "io.debezium.time.ZonedTimestamp"),
        "ref": connect("string", "io.debezium.data.Uuid"),
        "tags": {"type": "array", "items": optional("string")},
        "counts": {"type": "array", "items": optional("int")},
        "doc": connect("string", "io.debezium.data.Json"),
        "attrs": connect("string", "io.debezium.data.Json"),
        "amount": DECIMAL_12_2,
        "geom": GEOMETRY,
    }
    fields = [{"name": "id", "type": "long"}]
    fields += [{"name": name, "type": optional(kind), "default": None} for name, kind in columns.items()]
    value = {"type": "record", "name": "Value", "fields": fields, "connect.name": f"{prefix}.public.places.Value"}
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": f"{prefix}.public.places",
        "fields": [
            {"name": "before", "type": optional(value), "default": None},
            {"name": "after", "type": optional("Value"), "default": None},
            {"name": "source", "type": SOURCE},
            {"name": "transaction", "type": "null", "default": None},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": optional("long"), "default": None},
            {"name": "ts_us", "type": optional("long"), "default": None},
            {"name": "ts_ns", "type": optional("long"), "default": None},
        ],
        "connect.name": f"{prefix}.public.places.Envelope",
    }


def typed_row(i: int, **changes) -> dict:
    values = {
        "id": i,
        "name": f"p{i}",
        "price": Decimal("1234.50"),
        "day": 20_000,
        "seen": 1_700_000_000_123_456,
        "seen_tz": "2024-03-01T10:20:30.123456Z",
        "ref": str(REF),
        "tags": ["a", None, "ß"],
        "counts": [1, -2, 2_147_483_647],
        "doc": '{"a": 7, "b": ["x", "y"]}',
        "attrs": '{"a": 7}',
        "amount": Decimal("-0.07"),
        "geom": ewkb(shapely.Point(2.0, 48.0)),
    }
    return {**values, **changes}


def test_typed_columns_through_the_avro_converter_read_as_the_json_events(schema_registry):
    prefix = f"dbz{uuid.uuid4().hex[:8]}"
    schema = envelope(prefix)
    schema_id = register(schema_registry.url, f"{prefix}.public.places-value", schema)
    records = [
        change("c", typed_row(1)),
        change("u", typed_row(2, price=Decimal("-9999999999.99"), doc=None, ref=None, tags=None, counts=[])),
        change("c", typed_row(3, price=Decimal("123456789012.34"))),  # 14 digits: no decimal(12, 2)
        change("c", typed_row(4, doc='{"a": "seven"}')),
        change("d", before=typed_row(5, doc="not json")),
    ]
    values = [wire(schema_id, avro_bytes(schema, r)) for r in records]
    rows = decoder(schema_registry, TYPED).decode(kafka_batch(values)).to_pylist()
    for r in (rows[0], rows[1], rows[4]):
        assert_valid(r)
    first = rows[0]
    assert (first["price"], first["price_text"]) == (Decimal("1234.50"), "-0.07")
    assert first["day"] == datetime.date(2024, 10, 4)
    assert first["seen"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert first["seen_tz"] == datetime.datetime(2024, 3, 1, 10, 20, 30, 123456, tzinfo=UTC)
    assert uuid.UUID(bytes=first["ref"]) == REF
    assert (first["tags"], first["counts"]) == (["a", None, "ß"], [1, -2, 2_147_483_647])
    assert (rows[1]["tags"], rows[1]["counts"]) == (None, [])
    assert first["doc"] == {"a": 7, "b": ["x", "y"]} and json.loads(first["doc_text"]) == {"a": 7}
    assert (rows[1]["price"], rows[1]["doc"], rows[1]["ref"]) == (Decimal("-9999999999.99"), None, None)
    assert rows[4]["id"] == 5
    for r, path in ((rows[2], "after.price"), (rows[3], "after.doc.a")):
        assert r[REJECT_REASON] == Reason.PROPERTY_TYPE_MISMATCH and path in r[REJECT_DETAIL], r[REJECT_DETAIL]
