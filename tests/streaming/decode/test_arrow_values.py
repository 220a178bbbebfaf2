"""Arrays in a reader's own types as column types: by Arrow's casts where every value fits, value by
value (naming the path of each that does not) where one does not."""

from __future__ import annotations

import datetime
import decimal
import uuid

import numpy as np
import pyarrow as pa

from streaming.decode.arrow_values import fit, is_union, union_of

READING = pa.struct([("sensor", pa.string()), ("value", pa.float64())])


def test_values_that_fit_are_cast_at_once_nested_or_not():
    ints = pa.array([1, None, -(2**31)], pa.int32())
    assert fit(ints, pa.int64(), "p") == (ints.cast(pa.int64()), [])
    assert fit(ints, pa.string(), "p")[0].to_pylist() == ["1", None, "-2147483648"]
    readings = pa.array([[{"sensor": "a", "value": 1.5}], None, []], pa.list_(READING))
    wider = pa.list_(pa.struct([("sensor", pa.string()), ("value", pa.float64()), ("unit", pa.string())]))
    out, problems = fit(readings, wider, "p")
    assert problems == []
    assert out.to_pylist() == [[{"sensor": "a", "value": 1.5, "unit": None}], None, []]
    stamps = pa.array([0, 1_700_000_000_123], pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
    assert fit(stamps, pa.timestamp("us", tz="UTC"), "p")[0].to_pylist()[1] == datetime.datetime(
        2023, 11, 14, 22, 13, 20, 123000, tzinfo=datetime.UTC
    )


def test_a_value_that_does_not_fit_is_null_and_named_by_its_path():
    readings = pa.array([[{"sensor": "a", "value": 1.0}, {"sensor": "b", "value": 2.5}]], pa.list_(READING))
    strict = pa.list_(pa.struct([("sensor", pa.string()), ("value", pa.int32())]))
    out, problems = fit(readings, strict, "properties.x")
    assert out.to_pylist() == [None]
    assert problems == [(0, "properties.x[1].value: expected int, got 2.5")]
    required = pa.struct([pa.field("sensor", pa.string(), nullable=False), ("value", pa.float64())])
    out, problems = fit(pa.array([{"sensor": None, "value": 1.0}], READING), required, "properties.r")
    assert problems == [(0, "properties.r.sensor: required, but missing or null")]
    out, problems = fit(pa.array([True, False]), pa.int64(), "properties.b")
    assert [i for i, _ in problems] == [0, 1]  # a boolean is no integer, as the general readers hold


def test_a_union_holds_the_value_of_its_branch():
    longs = pa.array([7, None, None], pa.int64())
    texts = pa.array([None, "seven", None])
    union = union_of([longs, texts], mask=np.array([False, False, True]))
    assert is_union(union.type)
    assert fit(union, pa.string(), "u") == (pa.array(["7", "seven", None]), [])
    out, problems = fit(union, pa.int64(), "u")
    assert out.to_pylist() == [7, None, None]
    assert problems == [(1, "u: expected long, got 'seven'")]


def test_uuids_decimals_and_fixed_bytes():
    an_id = uuid.UUID("6f1c2b8e-6d2a-4b8e-9c3e-2a1d0b7f5e11")
    out, problems = fit(pa.array([str(an_id), None, "not-a-uuid"]), pa.uuid(), "u")
    assert out.to_pylist() == [an_id, None, None]
    assert problems == [(2, "u: expected uuid, got 'not-a-uuid'")]
    money = pa.array([decimal.Decimal("12.34"), decimal.Decimal("-0.05")], pa.decimal128(6, 2))
    assert fit(money, pa.decimal128(12, 3), "d")[0].to_pylist() == [
        decimal.Decimal("12.340"),
        decimal.Decimal("-0.050"),
    ]
    assert [i for i, _ in fit(money, pa.decimal128(3, 2), "d")[1]] == [0]
    tags = pa.array([b"abcd"], pa.binary(4))
    assert fit(tags, pa.binary(), "f")[0].to_pylist() == [b"abcd"]
    assert [i for i, _ in fit(tags, pa.binary(3), "f")[1]] == [0]


def test_lists_of_structs_of_uuids_that_are_all_null_or_empty_fit():
    """pyarrow cannot flatten such lists (no builder for the UUID extension type); a record whose
    optional array of records holding a UUID was null or empty crashed the decoder."""
    member = pa.struct([pa.field("id", pa.uuid())])
    no_structs = pa.StructArray.from_arrays(
        [pa.ExtensionArray.from_storage(pa.uuid(), pa.array([], pa.binary(16)))], fields=list(member)
    )
    for mask in ([True, True], [False, True]):  # all null; an empty list and a null
        read = pa.ListArray.from_arrays(pa.array([0, 0, 0], pa.int32()), no_structs, mask=pa.array(mask))
        out, problems = fit(read, pa.list_(member), "properties.stops")
        assert problems == [] and out.to_pylist() == [None if m else [] for m in mask]
