"""Python values (what the general readers of Avro and Protobuf records give) as Arrow arrays of
column types: built in one call where every value fits, value by value otherwise, alike either way,
each value that does not fit null and named by its path."""

from __future__ import annotations

import datetime
import decimal
import uuid

import pyarrow as pa

from streaming.decode.python_values import NamedNumber, to_arrow

UTC = datetime.UTC
READING = pa.struct(
    [pa.field("sensor", pa.string(), nullable=False), ("value", pa.int32()), ("at", pa.timestamp("us", tz="UTC"))]
)
AT = datetime.datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC)


def test_a_batch_that_fits_and_the_same_batch_with_one_bad_value_convert_alike():
    kind = pa.list_(READING)
    good = [[{"sensor": "a", "value": 1, "at": AT}], None, [], [{"sensor": "b", "value": 2.0, "at": AT}]]
    whole, problems = to_arrow(good, kind, "properties.r")
    assert problems == []
    assert whole.to_pylist() == [
        [{"sensor": "a", "value": 1, "at": AT}],
        None,
        [],
        [{"sensor": "b", "value": 2, "at": AT}],
    ]
    mixed, problems = to_arrow([*good, [{"sensor": "c", "value": 2.5, "at": AT}]], kind, "properties.r")
    assert problems == [(4, "properties.r[0].value: expected int, got 2.5")]
    assert mixed.to_pylist() == [*whole.to_pylist(), None]


def test_ranges_required_members_and_map_values_are_named_by_path():
    values, problems = to_arrow(
        [{"sensor": None, "value": 1}, {"sensor": "s", "value": 2**31}], READING, "properties.x"
    )
    assert problems == [
        (0, "properties.x.sensor: required, but missing or null"),
        (1, "properties.x.value: expected int, got 2147483648"),
    ]
    assert values.to_pylist() == [None, None]
    kind = pa.map_(pa.string(), pa.decimal128(5, 2))
    values, problems = to_arrow([{"a": decimal.Decimal("1.25")}, {"b": decimal.Decimal("1.255")}], kind, "properties.m")
    assert problems == [(1, "properties.m.b: expected decimal(5, 2), got Decimal('1.255')")]
    assert values.to_pylist() == [[("a", decimal.Decimal("1.25"))], None]


def test_enum_values_fill_string_and_integer_columns_and_uuids_every_spelling():
    state = [NamedNumber("MOVING", 2), NamedNumber("IDLE", 1)]
    assert to_arrow(state, pa.string(), "p")[0].to_pylist() == ["MOVING", "IDLE"]
    assert to_arrow(state, pa.int64(), "p")[0].to_pylist() == [2, 1]
    an_id = uuid.UUID("6f1c2b8e-6d2a-4b8e-9c3e-2a1d0b7f5e11")
    ids, problems = to_arrow([an_id, str(an_id), an_id.bytes, None], pa.uuid(), "p")
    assert problems == [] and ids.type == pa.uuid()
    assert ids.storage.to_pylist() == [an_id.bytes] * 3 + [None]
    nested, problems = to_arrow([{"id": an_id}], pa.struct([("id", pa.uuid())]), "p")
    assert problems == [] and nested.field(0).storage.to_pylist() == [an_id.bytes]


def test_timestamps_with_and_without_a_time_zone():
    paris = datetime.timezone(datetime.timedelta(hours=1))
    local = datetime.datetime(2025, 1, 1, 12, 0)
    aware = datetime.datetime(2025, 1, 1, 12, 0, tzinfo=paris)
    zoned, _ = to_arrow([local, aware], pa.timestamp("us", tz="UTC"), "p")
    assert zoned.to_pylist() == [local.replace(tzinfo=UTC), aware.astimezone(UTC)]
    naive, _ = to_arrow([local, aware], pa.timestamp("us"), "p")
    assert naive.to_pylist() == [local, datetime.datetime(2025, 1, 1, 11, 0)]
    # The same, value by value (a batch holding a value that does not fit).
    slow, problems = to_arrow([local, aware, "noon"], pa.timestamp("us"), "p")
    assert slow.to_pylist() == [*naive.to_pylist(), None]
    assert problems == [(2, "p: expected timestamp, got 'noon'")]
    slow_zoned, _ = to_arrow([local, aware, "noon"], pa.timestamp("us", tz="UTC"), "p")
    assert slow_zoned.to_pylist() == [*zoned.to_pylist(), None]
