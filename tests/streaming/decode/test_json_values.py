"""JSON values as column types: what the block reader reads for each type, the conversion after it
over whole arrays, and `coerce` for one parsed value; every value that does not fit names its path."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pytest

from streaming.decode.formats.geojson import _load_json
from streaming.decode.json_values import ValueProblem, coerce, convert, read_type

DRIVER = pa.struct(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("since", pa.date32()),
        pa.field("shift", pa.time64("us")),
        pa.field("badge", pa.uuid()),
        pa.field("fare", pa.decimal128(12, 2)),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("code", pa.binary(3)),
    ]
)
UUID_TEXT = "0f8fad5b-d9cb-469f-a165-70867728950e"
DOCS = [
    {
        "id": 7,
        "since": "2024-02-29",
        "shift": "22:30:00.25",
        "badge": UUID_TEXT,
        "fare": 12.5,
        "tags": ["ev", None],
        "code": "abc",
    },
    {"id": 8, "since": "2024-02-30", "shift": "25:00", "badge": "0f8fad5b", "fare": "1.255", "code": "ab"},
    {"since": "2024-01-01"},
    None,
]
WANTED = {
    "id": 7,
    "since": datetime.date(2024, 2, 29),
    "shift": datetime.time(22, 30, 0, 250000),
    "badge": uuid.UUID(UUID_TEXT),
    "fare": decimal.Decimal("12.50"),
    "tags": ["ev", None],
    "code": b"abc",
}


def read_block(docs: list, kind: pa.DataType = DRIVER) -> pa.Array:
    """The documents as pyarrow's JSON reader reads them for `kind`."""
    text = "\n".join(json.dumps({"d": d}) for d in docs).encode()
    schema = pa.schema([("d", read_type(kind))])
    return (
        pa_json.read_json(io.BytesIO(text), parse_options=pa_json.ParseOptions(explicit_schema=schema))
        .column(0)
        .combine_chunks()
    )


def test_the_block_reader_then_convert_gives_every_type_and_names_each_bad_value() -> None:
    out, problems = convert(read_block(DOCS[:1] + DOCS[2:]), DRIVER, "properties.driver", np.array([0, 2, 3]))
    assert out.type == DRIVER
    assert out.to_pylist()[0] == WANTED
    assert out.to_pylist()[2] is None
    assert problems == [(2, "properties.driver.id: required, but missing or null")]


def test_convert_names_the_path_and_document_of_every_value_that_does_not_fit() -> None:
    # "1.255" into decimal(12, 2) is refused by the reader itself; the general path says why.
    without_fare = pa.struct([f for f in DRIVER if f.name != "fare"])
    out, problems = convert(read_block(DOCS[1:2], without_fare), without_fare, "p", np.array([5]))
    assert sorted(problems) == [
        (5, "p.badge: expected uuid, got '0f8fad5b'"),
        (5, "p.code: expected fixed[3], got b'ab'"),
        (5, "p.shift: expected time (HH:MM:SS[.ffffff]), got '25:00'"),
        (5, "p.since: expected date (YYYY-MM-DD), got '2024-02-30'"),
    ]


def test_coerce_reads_one_parsed_value_as_the_reader_would() -> None:
    read = pa.array([coerce(DOCS[0], DRIVER, "p")], read_type(DRIVER))
    out, problems = convert(read, DRIVER, "p", np.array([0]))
    assert problems == [] and out.to_pylist() == [WANTED]
    with pytest.raises(ValueProblem, match=r"^p\.fare: expected decimal\(12, 2\), got '1\.255'$"):
        coerce(DOCS[1], DRIVER, "p")
    with pytest.raises(ValueProblem, match=r"^p\.tags\[1\]: expected string, got 3$"):
        coerce({"id": 1, "tags": ["a", 3]}, DRIVER, "p")


def test_a_map_is_read_from_an_object_of_any_members() -> None:
    kind = pa.map_(pa.string(), pa.struct([("v", pa.float64())]))
    read = pa.array([coerce({"a": {"v": 1.5}, "b": None}, kind, "p"), coerce({}, kind, "p"), None], read_type(kind))
    out, problems = convert(read, kind, "p", np.arange(3))
    assert problems == [] and out.type == kind
    assert out.to_pylist() == [[("a", {"v": 1.5}), ("b", None)], [], None]


def test_a_38_digit_decimal_keeps_every_digit_on_the_one_by_one_path() -> None:
    doc, _ = _load_json(b'{"fare": 12345678901234567890123456789.123456789}', exact_fractions=True)
    assert coerce(doc["fare"], pa.decimal128(38, 9), "p") == decimal.Decimal("12345678901234567890123456789.123456789")
