"""The partition spec of a contract: the default, the transforms it takes, and one line naming the
field for each it cannot take."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from streaming.contract import ContractError, parse_contract

RAW = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "demo_events.json").read_text())


def with_partition(partition, **more) -> dict:
    raw = copy.deepcopy(RAW)
    raw["partition"] = partition
    raw.update(more)
    return raw


def error_of(raw) -> str:
    with pytest.raises(ContractError) as info:
        parse_contract(raw)
    return str(info.value)


def test_a_new_table_is_partitioned_by_day_of_its_event_time_unless_it_says_otherwise():
    contract = parse_contract(copy.deepcopy(RAW))
    assert contract.event_time == "event_time"
    assert [(f.transform, f.source, f.name) for f in contract.partition] == [("day", "event_time", "event_time_day")]
    assert parse_contract(with_partition([])).partition == ()


def test_a_cell_is_a_string_column_after_the_flat_columns_and_recorded_in_the_properties():
    contract = parse_contract(with_partition(["day(event_time)", "geohash(geometry, 3)"]))
    assert [f.name for f in contract.partition] == ["event_time_day", "geometry_geohash3"]
    assert contract.cell_field_ids == {"geometry_geohash3": 11}
    assert contract.bbox_field_ids == {"xmin": 12, "ymin": 13, "xmax": 14, "ymax": 15}
    assert str(contract.iceberg_schema.find_field(11).field_type) == "string"
    assert "geometry_geohash3" not in contract.arrow_schema.names
    assert "geometry_geohash3" in contract.data_file_schema.names
    props = contract.table_properties()
    assert props["geoingest.partition.cell.geometry_geohash3"] == "geohash:3:geometry"
    assert props["geoingest.event-time"] == "event_time"


def test_iceberg_transforms_in_spark_sql_words():
    contract = parse_contract(
        with_partition(["hour(event_time)", "bucket(16, event_id)", "truncate(4, kind)", "source_partition"])
    )
    assert [(f.transform, f.param, f.name) for f in contract.partition] == [
        ("hour", None, "event_time_hour"),
        ("bucket", 16, "event_id_bucket_16"),
        ("truncate", 4, "kind_trunc_4"),
        ("identity", None, "source_partition"),
    ]


def test_an_explicit_event_time_column():
    raw = with_partition(["month(event_time)"], event_time="event_time")
    assert parse_contract(raw).event_time == "event_time"
    assert error_of(with_partition([], event_time="name")) == "event_time: column 'name' is a string, not a timestamptz"


@pytest.mark.parametrize(
    ("partition", "message"),
    [
        ("day(event_time)", "partition: expected a list of transforms"),
        (["day(name)"], "partition[0]: day(name): column 'name' is a string; day takes timestamptz"),
        (["day(when)"], "partition[0]: day(when): 'when' is not one of the columns"),
        (
            ["geohash(name, 3)"],
            "partition[0]: geohash(name, 3): geohash takes the geometry column 'geometry'; 'name' is a string column",
        ),
        (["geohash(geometry, 13)"], "partition[0]: geohash(geometry, 13): precision '13' must be a whole number 1..12"),
        (["geohash(geometry, 0)"], "partition[0]: geohash(geometry, 0): precision '0' must be a whole number 1..12"),
        (["geohash(geometry)"], "partition[0]: geohash(geometry): expected geohash(geometry, precision)"),
        (["h3(geometry, 5)"], "partition[0]: h3(geometry, 5): h3 cells are not offered"),
        (["bucket(0, event_id)"], "partition[0]: bucket(0, event_id): N '0' must be a whole number"),
        (["truncate(3, speed)"], "partition[0]: truncate(3, speed): column 'speed' is a double; truncate takes"),
        (["day(geometry)"], "partition[0]: day(geometry): day cannot take the geometry"),
        (["week(event_time)"], "partition[0]: week(event_time): unknown transform 'week'"),
        (["day(event_time)", "day(event_time)"], "partition[1]: day(event_time) is already in the spec"),
        (
            ["hour(event_time)", "day(event_time)"],
            "partition[1]: day(event_time): event_time is already partitioned by hour",
        ),
        (
            ["geohash(geometry, 5)"],
            "partition[0]: geohash(geometry, 5) would let one batch write up to 33,554,432 partitions",
        ),
        (
            ["day(event_time)", "bucket(1000, event_id)", "geohash(geometry, 2)"],
            "partition[2]: geohash(geometry, 2) would let one batch write up to 2,048,000 partitions",
        ),
    ],
)
def test_a_spec_it_cannot_take_is_one_line_naming_the_field(partition, message):
    error = error_of(with_partition(partition))
    assert error.startswith(message), error
    assert "\n" not in error


def test_a_regional_extent_allows_finer_cells():
    raw = with_partition(["geohash(geometry, 4)"])
    raw["clustering"]["extent"] = [-10.0, 35.0, 30.0, 60.0]
    assert parse_contract(raw).partition[0].param == 4


def test_a_projected_crs_takes_no_geohash():
    raw = with_partition(["geohash(geometry, 3)"])
    raw["geometry"]["crs"] = "EPSG:3857"
    raw["clustering"].pop("extent")
    assert "the table CRS EPSG:3857 is projected" in error_of(raw)


def test_a_binary_column_is_no_partition_value():
    raw = with_partition(["event_id"])
    raw["columns"][0]["type"] = "binary"
    assert error_of(raw).startswith("partition[0]: event_id: column 'event_id' is a binary; identity takes")
