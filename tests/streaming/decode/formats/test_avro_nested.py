"""Avro schemas the flat reader does not read (arrays, maps, unions of several types, logical
types beyond timestamps, record fields read as structs): the nested reader fills the contract's
nested and typed columns, decided per writer schema, as fastavro reads the same bytes (checked on
generated schemas against the general reader); a value that does not fit its column is rejected
naming its nested path."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streaming.contract import parse_contract
from streaming.decode.arrow_values import fit
from streaming.decode.decoder import REJECT_DETAIL, REJECT_REASON, Decoder
from streaming.decode.formats.avro import AvroFormat, GeneralReader, RecordReader
from streaming.decode.formats.avro_nested import NestedReader
from streaming.decode.formats.avro_schema import GeneralPlan, NestedPlan, compile_avro, compile_schema, general_plan
from streaming.decode.schema_registry import RegisteredSchema
from streaming.kernels.buffers import offsets_and_bytes
from tests.streaming.decode.formats.test_avro import POINT_SCHEMA, avro_bytes, contract, record, wire
from tests.streaming.decode.test_decoder import kafka_batch

UTC = datetime.UTC
READING = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "value", "type": "double"},
    ],
}
READING_COLUMN = {
    "type": "struct",
    "fields": [
        {"name": "sensor", "type": "string", "required": True},
        {"name": "value", "type": "double"},
    ],
}
AN_ID = uuid.UUID("6f1c2b8e-6d2a-4b8e-9c3e-2a1d0b7f5e11")

# (the Avro type of field "x", the contract's column type, the values sent, the values the table holds
# as the decoder hands them on: a UUID and fixed bytes as bytes, a time as microseconds)
KINDS: dict[str, tuple[Any, Any, list[Any], list[Any]]] = {
    "record": (
        READING,
        READING_COLUMN,
        [{"sensor": "t1", "value": 1.5}],
        [{"sensor": "t1", "value": 1.5}],
    ),
    "array of records": (
        {"type": "array", "items": READING},
        {"type": "list", "element": READING_COLUMN},
        [[{"sensor": "a", "value": 1.0}, {"sensor": "b", "value": -2.5}], []],
        [[{"sensor": "a", "value": 1.0}, {"sensor": "b", "value": -2.5}], []],
    ),
    "map": (
        {"type": "map", "values": "long"},
        {"type": "map", "key": "string", "value": "long"},
        [{"a": 1, "b": -(2**40)}, {}],
        [[("a", 1), ("b", -(2**40))], []],
    ),
    "union of two non-null types": (
        ["null", "long", "string"],
        "string",
        ["seven", None, 7],
        ["seven", None, "7"],
    ),
    "union of two numbers": (["int", "double"], "double", [3, 2.5], [3.0, 2.5]),
    "enum": (
        {"type": "enum", "name": "State", "symbols": ["IDLE", "MOVING"]},
        "string",
        ["MOVING", "IDLE"],
        ["MOVING", "IDLE"],
    ),
    "fixed": ({"type": "fixed", "name": "Tag", "size": 4}, "fixed[4]", [b"\x00\x01\x02\x03"], [b"\x00\x01\x02\x03"]),
    "array of enums": (
        {"type": "array", "items": {"type": "enum", "name": "Level", "symbols": ["LOW", "HIGH"]}},
        {"type": "list", "element": "string"},
        [["HIGH", "LOW"], []],
        [["HIGH", "LOW"], []],
    ),
    "fixed in a record": (
        {
            "type": "record",
            "name": "Signed",
            "fields": [{"name": "sig", "type": {"type": "fixed", "name": "Sig", "size": 2}}],
        },
        {"type": "struct", "fields": [{"name": "sig", "type": "fixed[2]"}]},
        [{"sig": b"\xff\x00"}],
        [{"sig": b"\xff\x00"}],
    ),
    "decimal": (
        {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        "decimal(12, 2)",
        [decimal.Decimal("-1234567890.12"), decimal.Decimal("0.05")],
        [decimal.Decimal("-1234567890.12"), decimal.Decimal("0.05")],
    ),
    "date": (
        {"type": "int", "logicalType": "date"},
        "date",
        [datetime.date(1969, 7, 20), datetime.date(2038, 1, 19)],
        [datetime.date(1969, 7, 20), datetime.date(2038, 1, 19)],
    ),
    "time-millis": (
        {"type": "int", "logicalType": "time-millis"},
        "time",
        [datetime.time(13, 45, 7, 123000)],
        [((13 * 60 + 45) * 60 + 7) * 1_000_000 + 123000],
    ),
    "time-micros": (
        {"type": "long", "logicalType": "time-micros"},
        "time",
        [datetime.time(0, 0, 0, 1)],
        [1],
    ),
    "timestamp-micros in a nested record": (
        {
            "type": "record",
            "name": "Stamp",
            "fields": [{"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}}],
        },
        {"type": "struct", "fields": [{"name": "at", "type": "timestamptz"}]},
        [{"at": datetime.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC)}],
        [{"at": datetime.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC)}],
    ),
    "local-timestamp-millis": (
        {"type": "long", "logicalType": "local-timestamp-millis"},
        "timestamp",
        [datetime.datetime(2024, 5, 1, 8, 30)],
        [datetime.datetime(2024, 5, 1, 8, 30)],
    ),
    "uuid": (
        {"type": "string", "logicalType": "uuid"},
        "uuid",
        [AN_ID],
        [AN_ID.bytes],
    ),
}


def schema_with(field_type: Any) -> dict:
    return {
        "type": "record",
        "name": "Event",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "lon", "type": "double"},
            {"name": "lat", "type": "double"},
            {"name": "x", "type": field_type},
        ],
    }


def decoder_for(schema: dict, column_type: Any) -> Decoder:
    raw = contract(
        {"lon_field": "lon", "lat_field": "lat"},
        [{"id": 4, "name": "x", "type": column_type, "from": ["properties.x"]}],
    )
    decoder = Decoder(parse_contract(raw))
    (fmt,) = decoder._formats
    assert isinstance(fmt, AvroFormat)
    fmt._plans[1] = compile_avro(1, json.dumps(schema), (), fmt.property_types)
    return decoder


def events(schema: dict, xs: list[Any]) -> pa.RecordBatch:
    return kafka_batch(
        [wire(1, avro_bytes(schema, {"id": f"e{i}", "lon": 1.0 + i, "lat": 2.0, "x": x})) for i, x in enumerate(xs)]
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_avro_kind_fills_its_typed_column(kind):
    field_type, column_type, sent, held = KINDS[kind]
    schema = schema_with(field_type)
    decoder = decoder_for(schema, column_type)
    (fmt,) = decoder._formats
    assert isinstance(fmt._plans[1], GeneralPlan) == (kind not in ("enum", "fixed"))  # those two stay columnar
    out = decoder.decode(events(schema, sent))
    assert out.column(REJECT_REASON).to_pylist() == [None] * len(sent), out.column(REJECT_DETAIL).to_pylist()
    assert out.column("event_id").to_pylist() == [f"e{i}" for i in range(len(sent))]
    assert out.column("x").to_pylist() == held


def test_a_value_that_does_not_fit_is_rejected_naming_its_nested_path():
    schema = schema_with({"type": "array", "items": READING})
    strict = {
        "type": "list",
        "element": {
            "type": "struct",
            "fields": [{"name": "sensor", "type": "string"}, {"name": "value", "type": "int"}],
        },
    }
    decoder = decoder_for(schema, strict)
    out = decoder.decode(
        events(
            schema, [[{"sensor": "a", "value": 1.0}], [{"sensor": "a", "value": 1.0}, {"sensor": "b", "value": 2.5}]]
        )
    )
    assert out.column(REJECT_REASON).to_pylist() == [None, "property_type_mismatch"]
    assert out.column(REJECT_DETAIL)[1].as_py() == "properties.x[1].value: expected int, got 2.5"


def test_a_required_member_left_null_is_rejected_naming_it():
    schema = schema_with({"type": "record", "name": "Opt", "fields": [{"name": "sensor", "type": ["null", "string"]}]})
    decoder = decoder_for(schema, READING_COLUMN)
    out = decoder.decode(events(schema, [{"sensor": "s"}, {"sensor": None}]))
    assert out.column(REJECT_REASON).to_pylist() == [None, "property_type_mismatch"]
    assert out.column(REJECT_DETAIL)[1].as_py() == "properties.x.sensor: required, but missing or null"


def test_a_record_that_does_not_match_its_schema_is_rejected_alone():
    schema = schema_with({"type": "map", "values": "string"})
    decoder = decoder_for(schema, {"type": "map", "key": "string", "value": "string"})
    good = wire(1, avro_bytes(schema, {"id": "a", "lon": 1.0, "lat": 2.0, "x": {"k": "v"}}))
    out = decoder.decode(kafka_batch([good, good[:-2], good + b"\x00"]))
    assert out.column(REJECT_REASON).to_pylist() == [None, "schema_mismatch", "schema_mismatch"]
    assert "bytes after the record's last field" in out.column(REJECT_DETAIL)[2].as_py()
    assert out.column("x").to_pylist()[0] == [("k", "v")]


def test_flat_schemas_keep_the_columnar_reader_and_a_struct_column_takes_the_general_one():
    flat = compile_avro(3, json.dumps(POINT_SCHEMA), (), {"id": pa.string(), "meta.source": pa.string()})
    assert not isinstance(flat, GeneralPlan)
    as_struct = compile_avro(3, json.dumps(POINT_SCHEMA), (), {"id": pa.string(), "meta": pa.struct([])})
    assert isinstance(as_struct, GeneralPlan)
    raw = contract(
        {"lon_field": "lon", "lat_field": "lat"},
        [
            {
                "id": 4,
                "name": "meta",
                "type": {"type": "struct", "fields": [{"name": "source", "type": "string"}]},
                "from": ["properties.meta"],
            }
        ],
    )
    decoder = Decoder(parse_contract(raw))
    (fmt,) = decoder._formats
    fmt._plans[3] = compile_avro(3, json.dumps(POINT_SCHEMA), (), fmt.property_types)
    records = [record(i) for i in range(6)]
    out = decoder.decode(kafka_batch([wire(3, avro_bytes(POINT_SCHEMA, r)) for r in records]))
    assert out.column(REJECT_REASON).null_count == 6
    assert out.column("meta").to_pylist() == [r["meta"] for r in records]
    assert out.column("speed").to_pylist() == [r["speed"] for r in records]


def test_schema_evolution_sees_the_fields_of_a_schema_the_general_reader_reads():
    from streaming.decode.properties import NESTED

    schema = schema_with({"type": "array", "items": "long"})
    schema["fields"] += [
        {"name": "note", "type": ["null", "string"]},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    ]
    decoder = decoder_for(schema, {"type": "list", "element": "long"})
    (fmt,) = decoder._formats
    values = pa.array(
        [wire(1, avro_bytes(schema, {"id": "a", "lon": 1.0, "lat": 2.0, "x": [1], "note": "n", "day": 3}))]
    )
    rows = np.arange(1)
    order = (np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    seen = fmt.unmapped_fields(values, rows, frozenset({"x", "id"}), order)
    # A new string field becomes a string column; a date is no type schema evolution makes.
    assert {name: s.type for name, s in seen.items()} == {"note": "string", "day": NESTED}


def test_schema_evolution_types_a_writer_schemas_new_records_arrays_and_maps_whole():
    """A new record field is a struct column of its fields (not one column per leaf), an array a
    list, a map a map, optional or not, logical types as what they stand for; a mapped struct
    column's field is scanned whole, so the members a new schema gives it are seen; a union of
    several types inside a field is no type a column holds."""
    from streaming.decode.properties import NESTED, spelling_of

    reading = {
        "type": "record",
        "name": "Reading",
        "fields": [
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "value", "type": ["null", "float"]},
        ],
    }
    schema = schema_with(
        {"type": "record", "name": "Meta", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}]}
    )
    schema["fields"] += [
        {
            "name": "driver",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Driver",
                    "fields": [
                        {"name": "id", "type": "int"},
                        {"name": "since", "type": {"type": "int", "logicalType": "date"}},
                        {
                            "name": "fare",
                            "type": {"type": "bytes", "logicalType": "decimal", "precision": 8, "scale": 2},
                        },
                    ],
                },
            ],
        },
        {"name": "readings", "type": {"type": "array", "items": reading}},
        {"name": "extras", "type": ["null", {"type": "map", "values": "double"}]},
        {"name": "either", "type": {"type": "array", "items": ["int", "string"]}},
        {"name": "note", "type": ["null", "string"]},
    ]
    decoder = decoder_for(schema, {"type": "struct", "fields": [{"name": "a", "type": "long"}]})
    (fmt,) = decoder._formats
    fmt.learn(RegisteredSchema(1, "AVRO", json.dumps(schema)))
    value = {
        "id": "a",
        "lon": 1.0,
        "lat": 2.0,
        "x": {"a": 1, "b": "m"},
        "driver": None,
        "readings": [],
        "extras": None,
        "either": [1],
        "note": None,
    }
    rows = np.arange(1)
    order = (np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    # The service leaves nested columns out of the mapped names: their members may be new.
    seen = fmt.unmapped_fields(pa.array([wire(1, avro_bytes(schema, value))]), rows, frozenset({"id"}), order)
    kinds = {name: spelling_of(s.type) for name, s in seen.items()}
    assert kinds == {
        "x": {"type": "struct", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}]},
        "driver": {
            "type": "struct",
            "fields": [
                {"name": "id", "type": "long"},
                {"name": "since", "type": "date"},
                {"name": "fare", "type": "decimal(8, 2)"},
            ],
        },
        "readings": {
            "type": "list",
            "element": {
                "type": "struct",
                "fields": [{"name": "at", "type": "timestamptz"}, {"name": "value", "type": "double"}],
            },
        },
        "extras": {"type": "map", "key": "string", "value": "double"},
        "either": NESTED,
        "note": "string",
    }


# -- the nested columnar reader against fastavro, on generated schemas ---------------------------
_NAMES = iter(range(10**9))
_PLAIN = ["boolean", "int", "long", "float", "double", "bytes", "string"]
_LOGICAL = [
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-micros"},
    {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
    {"type": "bytes", "logicalType": "decimal", "precision": 30, "scale": 4},
    {"type": "string", "logicalType": "uuid"},
]


def _named(kind: str, **more: Any) -> dict:
    return {"type": kind, "name": f"N{next(_NAMES)}", **more}


@st.composite
def avro_types(draw: st.DrawFn, depth: int = 0) -> Any:
    leaf = st.one_of(
        st.sampled_from(_PLAIN),
        st.sampled_from(_LOGICAL),
        st.builds(lambda: _named("enum", symbols=["A", "B", "C"])),
        st.integers(1, 17).map(lambda n: _named("fixed", size=n)),
        st.lists(
            st.sampled_from(["long", "double", "string", "boolean", "bytes"]), min_size=2, max_size=3, unique=True
        ),
    )
    if depth >= 3:
        return draw(leaf)
    inner = avro_types(depth + 1)
    choice = draw(st.integers(0, 5))
    if choice == 0:
        fields = draw(st.lists(inner, min_size=1, max_size=4))
        return _named("record", fields=[{"name": f"f{i}", "type": t} for i, t in enumerate(fields)])
    if choice == 1:
        return {"type": "array", "items": draw(inner)}
    if choice == 2:
        return {"type": "map", "values": draw(inner)}
    if choice == 3:
        other = draw(inner)
        return other if isinstance(other, list) else ["null", other]
    return draw(leaf)


def avro_values(kind: Any) -> st.SearchStrategy[Any]:
    if isinstance(kind, list):
        return st.one_of([avro_values(k) for k in kind])
    if isinstance(kind, str):
        return {
            "null": st.none(),
            "boolean": st.booleans(),
            "int": st.integers(-(2**31), 2**31 - 1),
            "long": st.integers(-(2**63), 2**63 - 1),
            "float": st.floats(width=32, allow_nan=False),
            "double": st.floats(allow_nan=False),
            "bytes": st.binary(max_size=12),
            "string": st.text(max_size=8),
        }[kind]
    logical = kind.get("logicalType")
    if logical == "date":
        return st.dates()
    if logical == "time-millis":
        return st.times().map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000))
    if logical == "time-micros":
        return st.times()
    if logical == "timestamp-millis":
        moments = st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1), timezones=st.just(UTC))
        return moments.map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000))
    if logical == "timestamp-micros":
        return st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1), timezones=st.just(UTC))
    if logical == "local-timestamp-micros":
        return st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1))
    if logical == "decimal":
        bound = decimal.Decimal(10) ** (kind["precision"] - kind["scale"]) - 1
        return st.decimals(-bound, bound, places=kind["scale"], allow_nan=False, allow_infinity=False)
    if logical == "uuid":
        return st.uuids()
    if kind["type"] == "enum":
        return st.sampled_from(kind["symbols"])
    if kind["type"] == "fixed":
        return st.binary(min_size=kind["size"], max_size=kind["size"])
    if kind["type"] == "record":
        return st.fixed_dictionaries({f["name"]: avro_values(f["type"]) for f in kind["fields"]})
    if kind["type"] == "array":
        return st.lists(avro_values(kind["items"]), max_size=4)
    return st.dictionaries(st.text(max_size=4), avro_values(kind["values"]), max_size=3)


def column_type(kind: Any) -> pa.DataType:
    """The column a user would give a field of this Avro type (a union of several: its first
    branch's, so values of the others test the rejects)."""
    if isinstance(kind, list):
        return column_type([k for k in kind if k != "null"][0])
    if isinstance(kind, str):
        return {
            "boolean": pa.bool_(),
            "int": pa.int32(),
            "long": pa.int64(),
            "float": pa.float32(),
            "double": pa.float64(),
            "bytes": pa.binary(),
            "string": pa.string(),
        }[kind]
    logical = kind.get("logicalType")
    if logical == "date":
        return pa.date32()
    if logical in ("time-millis", "time-micros"):
        return pa.time64("us")
    if logical in ("timestamp-millis", "timestamp-micros"):
        return pa.timestamp("us", tz="UTC")
    if logical == "local-timestamp-micros":
        return pa.timestamp("us")
    if logical == "decimal":
        return pa.decimal128(kind["precision"], kind["scale"])
    if logical == "uuid":
        return pa.uuid()
    if kind["type"] == "enum":
        return pa.string()
    if kind["type"] == "fixed":
        return pa.binary(kind["size"])
    if kind["type"] == "record":
        return pa.struct([(f["name"], column_type(f["type"])) for f in kind["fields"]])
    if kind["type"] == "array":
        return pa.list_(column_type(kind["items"]))
    return pa.map_(pa.string(), column_type(kind["values"]))


def both_readers(schema: dict, bodies: list[bytes]) -> tuple[NestedReader, GeneralReader]:
    plan = general_plan(1, json.dumps(schema))
    assert isinstance(plan, NestedPlan)
    offsets, data = offsets_and_bytes(pa.array(bodies, pa.binary()))
    start, end = offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64)
    nested = NestedReader(plan, data, start, end)
    general = GeneralReader(plan, data, start, end)
    nested.read()
    general.read()
    return nested, general


def generated_records(data: st.DataObject) -> tuple[list[Any], dict, list[bytes]]:
    """A record schema of 1 to 3 generated field types, and 1 to 6 records of it, some cut short."""
    kinds = data.draw(st.lists(avro_types(), min_size=1, max_size=3), label="field types")
    schema = _named("record", fields=[{"name": f"x{i}", "type": k} for i, k in enumerate(kinds)])
    records = data.draw(st.lists(avro_values(schema), min_size=1, max_size=6), label="records")
    bodies = [avro_bytes(schema, r) for r in records]
    cut = data.draw(st.lists(st.integers(0, len(bodies) - 1), max_size=2, unique=True), label="truncated")
    bodies = [b[: len(b) // 2] if i in cut and len(b) > 1 else b for i, b in enumerate(bodies)]
    return kinds, schema, bodies


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_the_columnar_reader_reads_every_generated_schema_as_fastavro_does(data):
    kinds, schema, bodies = generated_records(data)
    nested, general = both_readers(schema, bodies)
    assert list(nested.bad) == list(general.bad)
    for i, kind in enumerate(kinds):
        target = column_type(kind)
        ours, our_problems = nested.property(f"x{i}", target)
        theirs, their_problems = general.property(f"x{i}", target)
        assert ours.type == theirs.type
        assert [p for p, _ in our_problems] == [p for p, _ in their_problems]
        assert [m.split(":")[0] for _, m in our_problems] == [m.split(":")[0] for _, m in their_problems]
        assert ours.to_pylist() == theirs.to_pylist()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_the_flat_reader_reads_arrays_maps_and_wide_unions_whole_as_fastavro_does(data):
    """A Debezium envelope's reading: the flat reader, whose array, map and wide union fields are
    leaves read by the nested reader's steps."""
    kinds, schema, bodies = generated_records(data)
    _, general = both_readers(schema, bodies)
    plan = compile_schema(1, json.dumps(schema), nested=True)
    offsets, bytes_ = offsets_and_bytes(pa.array(bodies, pa.binary()))
    flat = RecordReader(plan, bytes_, offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64))
    flat.read()
    assert list(flat.bad) == list(general.bad)
    for i, kind in enumerate(kinds):
        leaf = plan.leaves.get(f"x{i}")
        if leaf is None or leaf.kind != "nested":
            continue
        target = column_type(kind)
        ours, our_problems = fit(flat.arrow(f"x{i}"), target, f"properties.x{i}")
        theirs, their_problems = general.property(f"x{i}", target)
        assert [p for p, _ in our_problems] == [p for p, _ in their_problems]
        assert ours.to_pylist() == theirs.to_pylist()


def test_arrays_of_many_items_and_blocks_with_their_byte_size_are_read_whole():
    schema = schema_with({"type": "array", "items": READING})
    items = [{"sensor": f"s{k}", "value": k / 4} for k in range(300)]
    plain = avro_bytes(schema, {"id": "a", "lon": 1.0, "lat": 2.0, "x": items})
    head = avro_bytes({**schema, "fields": schema["fields"][:3]}, {"id": "a", "lon": 1.0, "lat": 2.0})
    # The same items in two blocks, each written as Avro's block writers do: a negative count, then its size.
    blocks = b""
    for part in (items[:120], items[120:]):
        body = b"".join(avro_bytes(READING, r) for r in part)
        blocks += _zigzag(-len(part)) + _zigzag(len(body)) + body
    sized = head + blocks + b"\x00"
    nested, general = both_readers(schema, [plain, sized, plain[:-3]])
    assert list(nested.bad) == [False, False, True]
    assert list(general.bad) == [False, False, True]
    column = pa.list_(pa.struct([("sensor", pa.string()), ("value", pa.float64())]))
    assert nested.property("x", column)[0].to_pylist() == [items, items, None]


def _zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)
