"""Debezium change events of a PostGIS table with numeric, date, timestamp, timestamptz, uuid,
array and jsonb columns fill the contract's typed and nested columns: each value as the PostgreSQL
connector spells it in JSON (with its Connect schema, or without: the connector's defaults),
converted to the column's type; a value that does not fit rejects its event, naming its path."""

from __future__ import annotations

import base64
import copy
import datetime
import json
import uuid
from decimal import Decimal

import pytest

from streaming.contract import parse_contract
from streaming.decode.decoder import UNAVAILABLE
from streaming.decode.rejects import Reason
from tests.streaming.decode.formats.test_debezium import GEOMETRY_SCHEMA, POLYGON, RAW_PLACES, decode, geom
from tests.streaming.decode.test_decoder import REJECT_DETAIL, REJECT_REASON, assert_valid

UTC = datetime.UTC


def list_of(element: str, element_id: int) -> dict:
    return {"type": "list", "element-id": element_id, "element": element, "element-required": False}


def typed_contract(**extra_types) -> object:
    """places with a column of each type a PostGIS table mirrors: numeric(12,2), date, timestamp,
    timestamptz, uuid, text[], int[], jsonb parsed into a struct; and string columns of a jsonb and
    a numeric."""
    raw = copy.deepcopy(RAW_PLACES)
    types = {
        "price": "decimal(12, 2)",
        "day": "date",
        "seen": "timestamp",
        "seen_tz": "timestamptz",
        "ref": "uuid",
        "tags": list_of("string", 30),
        "counts": list_of("int", 31),
        "doc": {
            "type": "struct",
            "fields": [
                {"id": 32, "name": "a", "type": "int", "required": False},
                {"id": 33, "name": "b", "type": list_of("string", 34), "required": False},
            ],
        },
        **extra_types,
    }
    for i, (name, kind) in enumerate(types.items(), start=3):
        raw["columns"].append({"id": i, "name": name, "type": kind, "from": [f"properties.{name}"]})
    # A jsonb and a numeric(12,2) source column into string columns: the JSON's text, the number's.
    raw["columns"].append({"id": 20, "name": "doc_text", "type": "string", "from": ["properties.attrs"]})
    raw["columns"].append({"id": 21, "name": "price_text", "type": "string", "from": ["properties.amount"]})
    raw["geometry"]["id"], raw["bbox"]["id"] = 40, 41
    return parse_contract(raw)


TYPED = typed_contract()


def decimal_schema(scale: int = 2, precision: int = 12) -> dict:
    return {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)},
    }


# Each source column's Connect schema, as the PostgreSQL connector's JSON converter writes it.
FIELD_SCHEMAS = {
    "id": {"type": "int64", "optional": False},
    "name": {"type": "string", "optional": True},
    "price": decimal_schema(),
    "amount": decimal_schema(),
    "day": {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1},
    "seen": {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1},
    "seen_tz": {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1},
    "ref": {"type": "string", "optional": True, "name": "io.debezium.data.Uuid", "version": 1},
    "tags": {"type": "array", "optional": True, "items": {"type": "string", "optional": True}},
    "counts": {"type": "array", "optional": True, "items": {"type": "int32", "optional": True}},
    "doc": {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1},
    "attrs": {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1},
    "geom": GEOMETRY_SCHEMA,
}


def precise(value: str, scale: int = 2) -> str:
    """A numeric as precise mode writes it: base64 of the big-endian two's-complement unscaled value."""
    unscaled = int(Decimal(value).scaleb(scale))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def event(op: str, after: dict | None, before: dict | None = None, schemas: bool = True, **field_schemas) -> bytes:
    envelope = {
        "before": before,
        "after": after,
        "source": {"version": "3.6.1.Final", "connector": "postgresql", "lsn": 7, "ts_ms": 1_764_000_000_000},
        "op": op,
        "ts_ms": 1_764_000_000_100,
    }
    if not schemas:
        return json.dumps(envelope).encode()
    specs = {**FIELD_SCHEMAS, **field_schemas}
    columns = dict.fromkeys([*(after or {}), *(before or {})])
    fields = [{**specs.get(c, {"type": "string", "optional": True}), "field": c} for c in columns]
    row = {"type": "struct", "fields": fields, "optional": True, "name": "dbz.public.places.Value"}
    schema = {
        "type": "struct",
        "fields": [{**row, "field": "before"}, {**row, "field": "after"}],
        "optional": False,
        "name": "dbz.public.places.Envelope",
    }
    return json.dumps({"schema": schema, "payload": envelope}).encode()


REF = uuid.UUID("6f1c1d5e-9f2b-4c1e-8a61-0b7e5d2c9a10")


def row(i: int, **changes) -> dict:
    """A row of the source table as the connector's defaults spell it."""
    values = {
        "id": i,
        "name": f"p{i}",
        "price": precise("1234.50"),
        "day": 20_000,  # days since 1970-01-01: 2024-10-04
        "seen": 1_700_000_000_123_456,  # us since the epoch
        "seen_tz": "2024-03-01T10:20:30.123456Z",
        "ref": str(REF),
        "tags": ["a", None, "ß"],
        "counts": [1, -2, 2_147_483_647],
        "doc": '{"a": 7, "b": ["x", "y"], "c": {"unread": true}}',
        "attrs": '{"a": 7, "b": ["x", "y"], "c": {"unread": true}}',
        "amount": precise("1234.50"),
        "geom": geom(POLYGON),
    }
    return {**values, **changes}


@pytest.mark.parametrize("schemas", [False, True], ids=["bare", "schemas"])
def test_each_postgres_type_fills_its_typed_column(schemas: bool):
    rows = decode(
        [
            event("c", row(1), schemas=schemas),
            event("r", row(2, price=precise("-0.07"), amount=precise("-0.07")), schemas=schemas),
        ],
        contract=TYPED,
    )
    for r in rows:
        assert_valid(r)
    first = rows[0]
    assert first["price"] == Decimal("1234.50") and rows[1]["price"] == Decimal("-0.07")
    # A string column takes a numeric's text where the event's schema says it is one; without
    # schemas, the value as the connector spelt it (precise mode's base64).
    assert [r["price_text"] for r in rows] == (
        ["1234.50", "-0.07"] if schemas else [precise("1234.50"), precise("-0.07")]
    )
    assert first["day"] == datetime.date(2024, 10, 4)
    assert first["seen"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert first["seen_tz"] == datetime.datetime(2024, 3, 1, 10, 20, 30, 123456, tzinfo=UTC)
    assert uuid.UUID(bytes=first["ref"]) == REF
    assert first["tags"] == ["a", None, "ß"]
    assert first["counts"] == [1, -2, 2_147_483_647]
    assert first["doc"] == {"a": 7, "b": ["x", "y"]}
    assert json.loads(first["doc_text"]) == {"a": 7, "b": ["x", "y"], "c": {"unread": True}}


def test_the_largest_numeric_and_nulls_of_every_type():
    nulls = dict.fromkeys(["price", "day", "seen", "seen_tz", "ref", "tags", "counts", "doc", "attrs", "amount"])
    values = [
        event("c", row(1, price=precise("9999999999.99"))),
        event("c", row(2, price=precise("-9999999999.99"))),
        event("c", row(3, **nulls)),
        event("c", row(4, tags=[], counts=[], doc="{}")),
    ]
    rows = decode(values, contract=TYPED)
    for r in rows:
        assert_valid(r)
    assert [r["price"] for r in rows[:2]] == [Decimal("9999999999.99"), Decimal("-9999999999.99")]
    assert all(rows[2][name] is None for name in [*nulls, "doc_text", "price_text"] if name in rows[2])
    assert (rows[3]["tags"], rows[3]["counts"], rows[3]["doc"]) == ([], [], {"a": None, "b": None})


def test_numerics_of_every_decimal_handling_mode_read_alike():
    string_mode = {"type": "string", "optional": True}
    double_mode = {"type": "double", "optional": True}
    variable = {
        "type": "struct",
        "optional": True,
        "name": "io.debezium.data.VariableScaleDecimal",
        "version": 1,
        "fields": [
            {"type": "int32", "optional": False, "field": "scale"},
            {"type": "bytes", "optional": False, "field": "value"},
        ],
    }
    spellings = [
        (precise("12.5", scale=1), decimal_schema(scale=1)),
        ("12.50", string_mode),
        (12.5, double_mode),
        ({"scale": 3, "value": precise("12.500", scale=3)}, variable),
        ({"scale": 0, "value": precise("-12", scale=0)}, variable),
    ]
    values = [
        event("c", row(i, price=value, amount=value), price=schema, amount=schema)
        for i, (value, schema) in enumerate(spellings)
    ]
    # One batch, its events in four schemas and none: each read in its own spelling.
    values.insert(2, event("c", row(9, price=precise("12.50")), schemas=False))
    rows = decode(values, contract=TYPED)
    for r in rows:
        assert_valid(r)
    assert [r["price"] for r in rows] == [Decimal("12.50")] * 5 + [Decimal("-12.00")]
    # A string column takes the numeric's text at its source scale (without a schema, as sent).
    assert [r["price_text"] for r in rows] == ["12.5", "12.50", precise("1234.50"), "12.5", "12.500", "-12"]


def test_timestamps_of_every_precision_read_alike():
    instant = datetime.datetime(2024, 3, 1, 10, 20, 30, 123000)
    ms = int(instant.replace(tzinfo=UTC).timestamp() * 1000)
    values = [
        event("c", row(1, seen=ms), seen={"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp"}),
        event("c", row(2, seen=ms * 1000)),
        event("c", row(3, seen=ms * 1_000_000), seen={"type": "int64", "name": "io.debezium.time.NanoTimestamp"}),
        # A timestamp column of a timestamptz: its UTC time; the other way round, taken as UTC.
        event(
            "c",
            row(4, seen="2024-03-01T11:20:30.123+01:00", seen_tz=ms * 1000),
            seen=FIELD_SCHEMAS["seen_tz"],
            seen_tz=FIELD_SCHEMAS["seen"],
        ),
    ]
    rows = decode(values, contract=TYPED)
    for r in rows:
        assert_valid(r)
    assert [r["seen"] for r in rows] == [instant] * 4
    assert rows[3]["seen_tz"] == instant.replace(tzinfo=UTC)


@pytest.mark.parametrize("schemas", [False, True], ids=["bare", "schemas"])
def test_a_value_that_does_not_fit_its_column_rejects_its_event_naming_the_path(schemas: bool):
    values = [
        event("c", row(1, price=precise("123456789012.34")), schemas=schemas),  # 14 digits, numeric(12,2)
        event("c", row(2, price="not base64!"), schemas=schemas),
        event("c", row(3, ref="not-a-uuid"), schemas=schemas),
        event("c", row(4, counts=[1, "two"]), schemas=schemas),
        event("c", row(5, counts=[1, 2_147_483_648]), schemas=schemas),
        event("c", row(6, doc='{"a": "seven"}'), schemas=schemas),
        event("c", row(7, doc='{"a": 1, "b": "x"}'), schemas=schemas),
        event("c", row(8, doc="not json"), schemas=schemas),
        event("c", row(9, seen_tz="yesterday"), schemas=schemas),
        event("c", row(10), schemas=schemas),
    ]
    rows = decode(values, contract=TYPED)
    paths = [
        "after.price",
        "after.price",
        "ref",
        "counts",
        "counts",
        "after.doc.a",
        "after.doc.b",
        "after.doc",
        "after.seen_tz",
    ]
    for r, path in zip(rows, paths):
        assert r[REJECT_REASON] == Reason.PROPERTY_TYPE_MISMATCH, (path, r[REJECT_DETAIL])
        assert path in r[REJECT_DETAIL], (path, r[REJECT_DETAIL])
    assert_valid(rows[-1])


def test_string_mode_nan_and_more_fraction_digits_do_not_fit_a_decimal():
    string_mode = {"type": "string", "optional": True}
    values = [
        event("c", row(1, price="NaN"), price=string_mode),
        event("c", row(2, price="Infinity"), price=string_mode),
        event("c", row(3, price="1.234"), price=string_mode),  # never rounded
        event("c", row(4, price=precise("1.234", scale=3)), price=decimal_schema(scale=3, precision=13)),
        event("c", row(5, price="NaN"), price={"type": "double", "optional": True}),
    ]
    rows = decode(values, contract=TYPED)
    for r in rows:
        assert r[REJECT_REASON] == Reason.PROPERTY_TYPE_MISMATCH and "after.price" in r[REJECT_DETAIL], r[REJECT_DETAIL]


def test_a_jsonb_an_update_left_unchanged_is_listed_never_parsed():
    placeholder = "__debezium_unavailable_value"
    values = [event("u", row(1, doc=placeholder, attrs=placeholder)), event("c", row(2, doc=placeholder))]
    rows = decode(values, contract=TYPED)
    assert_valid(rows[0])
    assert rows[0]["doc"] is None and rows[0]["doc_text"] is None and set(rows[0][UNAVAILABLE]) == {"doc", "doc_text"}
    # An insert holds every value: the placeholder there is a value, and no JSON.
    assert rows[1][REJECT_REASON] == Reason.PROPERTY_TYPE_MISMATCH and "after.doc" in rows[1][REJECT_DETAIL]


def test_a_delete_is_read_by_its_key_whatever_its_old_values_hold():
    values = [event("d", None, before=row(1, price="garbage", doc="not json")), event("c", row(2))]
    rows = decode(values, contract=TYPED)
    for r in rows:
        assert_valid(r)
    assert [r["id"] for r in rows] == [1, 2]


def test_a_jsonb_array_fills_a_list_column_and_a_jsonb_object_a_map_column():
    contract = typed_contract(
        tags={"type": "map", "key-id": 35, "key": "string", "value-id": 36, "value": "int", "value-required": False}
    )
    json_text = FIELD_SCHEMAS["doc"]
    values = [
        event("c", row(1, tags='{"x": 1, "y": null}', counts="[3, 4]"), tags=json_text, counts=json_text),
        event("c", row(2, tags='{"x": "one"}'), tags=json_text),
    ]
    rows = decode(values, contract=contract)
    assert_valid(rows[0])
    assert (rows[0]["tags"], rows[0]["counts"]) == ([("x", 1), ("y", None)], [3, 4])
    assert rows[1][REJECT_REASON] == Reason.PROPERTY_TYPE_MISMATCH and "after.tags" in rows[1][REJECT_DETAIL]


def test_a_double_column_takes_a_numeric_of_any_mode_nan_and_infinities_as_they_are():
    contract = typed_contract(ratio="double")
    string_mode = {"type": "string", "optional": True}
    values = [
        event("c", row(1, ratio=precise("-12.25")), ratio=decimal_schema()),
        event("c", row(2, ratio="NaN"), ratio=string_mode),
        event("c", row(3, ratio="-Infinity"), ratio=string_mode),
        event("c", row(4, ratio="Infinity"), ratio={"type": "double", "optional": True}),
    ]
    rows = decode(values, contract=contract)
    for r in rows:
        assert_valid(r)
    assert [r["ratio"] for r in rows[::2]] == [-12.25, float("-inf")]
    assert rows[1]["ratio"] != rows[1]["ratio"] and rows[3]["ratio"] == float("inf")
