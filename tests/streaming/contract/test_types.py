"""Contract column types: Iceberg's names and JSON spelling parsed into pyiceberg types, nested ids
assigned as pyiceberg assigns a new table's, every error naming its path."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from pyiceberg.types import (
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimeType,
    UUIDType,
)

from streaming.contract import ContractError, check_fresh_ids, parse_contract
from streaming.contract.types import parse_type, placeholders, primitive_type, type_spelling

DEMO = json.loads((Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json").read_text())
DRIVER = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "required": True},
        {"name": "tags", "type": {"type": "list", "element": "string"}},
        {"name": "readings", "type": {"type": "map", "key": "string", "value": "double"}},
    ],
}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("decimal(12, 2)", DecimalType(12, 2)),
        ("decimal(38,0)", DecimalType(38, 0)),
        ("fixed[16]", FixedType(16)),
        ("date", DateType()),
        ("time", TimeType()),
        ("timestamp", TimestampType()),
        ("uuid", UUIDType()),
        ("decimal(39, 2)", None),
        ("decimal(4, 5)", None),
        ("fixed[0]", None),
        ("varchar", None),
    ],
)
def test_primitive_names_are_icebergs(name: str, expected) -> None:
    assert primitive_type(name) == expected


def with_column(kind, **column) -> dict:
    """The demo contract with one more column (id 9) before the geometry (10) and bbox (11)."""
    raw = copy.deepcopy(DEMO)
    raw["columns"].append({"id": 9, "name": "driver", "type": kind, "from": ["properties.driver"], **column})
    raw["geometry"]["id"], raw["bbox"]["id"] = 10, 11
    return raw


def test_nested_ids_left_out_are_the_ones_iceberg_gives_a_new_table() -> None:
    contract = parse_contract(with_column(DRIVER))
    driver = contract.iceberg_schema.find_field("driver")
    # Top-level 1..11, then the driver's members (12..14), the list's element (15), the map's key and
    # value (16, 17), and only then the bbox's fields (18..21): pyiceberg's assign_fresh_schema_ids order.
    assert driver.field_type == StructType(
        NestedField(12, "id", LongType(), required=True),
        NestedField(13, "tags", ListType(15, StringType(), element_required=False), required=False),
        NestedField(14, "readings", MapType(16, StringType(), 17, DoubleType(), value_required=False), required=False),
    )
    assert contract.bbox_field_ids == {"xmin": 18, "ymin": 19, "xmax": 20, "ymax": 21}
    check_fresh_ids(contract)  # what create_table checks: pyiceberg would assign these same ids


def test_nested_ids_given_are_kept_and_checked_against_a_new_tables() -> None:
    spelled = type_spelling(parse_contract(with_column(DRIVER)).iceberg_schema.find_field("driver").field_type)
    assert parse_contract(with_column(spelled)).iceberg_schema == parse_contract(with_column(DRIVER)).iceberg_schema
    spelled["fields"][0]["id"] = 40
    contract = parse_contract(with_column(spelled))
    with pytest.raises(ContractError, match=r"columns\[8\]\.type \(driver\.id\): id 40 is not the id Iceberg gives"):
        check_fresh_ids(contract)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ({"type": "struct", "fields": []}, r"columns\[8\]\.type\.fields: a struct needs"),
        (
            {"type": "struct", "fields": [{"name": "a", "type": "int8"}]},
            r"columns\[8\]\.type\.fields\[0\]\.type: 'int8' is not a column type",
        ),
        (
            {"type": "struct", "fields": [{"name": "a.b", "type": "int"}]},
            r"columns\[8\]\.type\.fields\[0\]\.name: expected a name without dots",
        ),
        (
            {"type": "struct", "fields": [{"name": "a", "type": "int"}, {"name": "a", "type": "long"}]},
            r"fields\[1\]\.name: 'a' is the name of another",
        ),
        ({"type": "list", "element": {"type": "map", "key": "string"}}, r"columns\[8\]\.type\.element\.value: missing"),
        ({"type": "list", "element": "string", "element-required": "yes"}, r"element-required: expected true or false"),
        (
            {"type": "map", "key": "string", "value": "int", "value_id": 3},
            r"columns\[8\]\.type\.value_id: not a key of a map",
        ),
        ({"type": "array", "items": "int"}, r"columns\[8\]\.type\.type: 'array' is not one of"),
        (
            {"type": "struct", "fields": [{"id": 3, "name": "a", "type": "int"}]},
            r"driver\.a: id 3 is already the id of kind",
        ),
    ],
)
def test_every_type_error_names_its_path(kind, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        parse_contract(with_column(kind))


def test_parse_type_takes_icebergs_own_json_spelling() -> None:
    # As a table's metadata.json spells a schema's field types.
    spelled = {
        "type": "map",
        "key-id": 7,
        "key": "string",
        "value-id": 8,
        "value": {"type": "list", "element-id": 9, "element": "decimal(9, 3)", "element-required": True},
        "value-required": False,
    }
    kind = parse_type(spelled, "t", placeholders())
    assert kind == MapType(
        7, StringType(), 8, ListType(9, DecimalType(9, 3), element_required=True), value_required=False
    )
    assert type_spelling(kind) == spelled
