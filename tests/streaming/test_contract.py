"""Table contracts: loading, the schemas and properties they give, and errors naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.types import BinaryType, DoubleType, StructType

from streaming.contract import ContractError, check_fresh_ids, load_contract, parse_contract

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
CONTRACT_PATH = SCHEMAS / "demo_events.json"
RAW = json.loads(CONTRACT_PATH.read_text())


def edited(edit) -> dict:
    raw = copy.deepcopy(RAW)
    edit(raw)
    return raw


def error_of(edit) -> str:
    with pytest.raises(ContractError) as info:
        parse_contract(edited(edit))
    return str(info.value)


def test_demo_contract_loads():
    contract = load_contract(CONTRACT_PATH)
    assert contract.table == "demo.events" and contract.namespace == "demo"
    assert contract.formats == ("geojson", "wkb", "ewkb")
    assert [c.name for c in contract.columns] == [
        "event_id",
        "event_time",
        "kind",
        "name",
        "speed",
        "population",
        "source_partition",
        "source_offset",
    ]
    assert contract.columns[0].sources == ("id", "kafka.key") and contract.columns[0].required
    assert contract.geometry.epsg == 4326 and contract.geometry.crs == "EPSG:4326"
    assert contract.geometry.invalid_polygons == "repair"
    assert contract.clustering.hilbert_bits == 16
    assert contract.clustering.extent == (-180.0, -90.0, 180.0, 90.0)
    assert contract.source == RAW


def test_iceberg_schema_has_ids_1_to_10_and_bbox_children_11_to_14():
    schema = load_contract(CONTRACT_PATH).iceberg_schema
    top = {f.field_id: f.name for f in schema.fields}
    assert top == {
        1: "event_id",
        2: "event_time",
        3: "kind",
        4: "name",
        5: "speed",
        6: "population",
        7: "source_partition",
        8: "source_offset",
        9: "geometry",
        10: "bbox",
    }
    assert schema.find_field("geometry").field_type == BinaryType()
    bbox = schema.find_field("bbox").field_type
    assert isinstance(bbox, StructType)
    assert {f.field_id: f.name for f in bbox.fields} == {11: "xmin", 12: "ymin", 13: "xmax", 14: "ymax"}
    assert all(f.field_type == DoubleType() and f.required for f in bbox.fields)
    assert [f.name for f in schema.fields if f.required] == [
        "event_id",
        "event_time",
        "source_partition",
        "source_offset",
        "geometry",
        "bbox",
    ]


def test_arrow_schema_carries_the_iceberg_field_ids_and_regular_types():
    schema = load_contract(CONTRACT_PATH).arrow_schema
    ids = {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in schema}
    assert ids == {
        "event_id": 1,
        "event_time": 2,
        "kind": 3,
        "name": 4,
        "speed": 5,
        "population": 6,
        "source_partition": 7,
        "source_offset": 8,
        "geometry": 9,
        "bbox": 10,
    }
    assert [int(f.metadata[b"PARQUET:field_id"]) for f in schema.field("bbox").type] == [11, 12, 13, 14]
    assert schema.field("event_id").type == pa.string() and schema.field("geometry").type == pa.binary()


@pytest.mark.parametrize(
    "edit, names",
    [
        (lambda r: r.pop("table"), ["table", "missing"]),
        (lambda r: r.update(table="events"), ["table", "'events'"]),
        (lambda r: r.update(formats=["geojson", "csv"]), ["formats[1]", "'csv'"]),
        (lambda r: r.update(formats=[]), ["formats"]),
        (lambda r: r["columns"][1].update(type="datetime"), ["columns[1].type", "'datetime'"]),
        (lambda r: r["columns"][0]["from"].__setitem__(0, "payload.id"), ["columns[0].from[0]", "'payload.id'"]),
        (lambda r: r["columns"][4].update({"from": []}), ["columns[4].from"]),
        (lambda r: r["columns"][0].update(required="yes"), ["columns[0].required", "'yes'"]),
        (lambda r: r["columns"][0].update(id="1"), ["columns[0].id", "'1'"]),
        (lambda r: r["columns"][2].update(id=1), ["columns[2].id", "already the id of columns[0].id"]),
        (lambda r: r["bbox"].update(id=0), ["bbox.id", "positive"]),
        (lambda r: r["columns"][3].update(name="kind"), ["'kind'", "twice"]),
        (lambda r: r["columns"][3].update(name="bbox"), ["'bbox'", "twice"]),
        (lambda r: r["geometry"]["types"].append("Circle"), ["geometry.types[6]", "'Circle'"]),
        (lambda r: r["geometry"].update(dimensions=["XY", "XYW"]), ["geometry.dimensions[1]", "'XYW'"]),
        (lambda r: r["geometry"].update(crs="OGC:CRS84"), ["geometry.crs", "'OGC:CRS84'", "EPSG:<code>"]),
        (lambda r: r["geometry"].update(crs="EPSG:999999"), ["geometry.crs", "'EPSG:999999'", "not a CRS known"]),
        (lambda r: r["geometry"].update(encoding="WKT"), ["geometry.encoding", "'WKT'"]),
        (lambda r: r["geometry"].update(invalid_polygons="fix"), ["geometry.invalid_polygons", "'fix'"]),
        (lambda r: r["geometry"].pop("name"), ["geometry.name", "missing"]),
        (lambda r: r["bbox"].pop("name"), ["bbox.name", "missing"]),
        (lambda r: r["clustering"].update(extent=[10, 0, -10, 5]), ["clustering.extent", "[10, 0, -10, 5]"]),
        (lambda r: r["clustering"].update(extent=[0, 0, 1]), ["clustering.extent"]),
        (lambda r: r["clustering"].update(extent=[0, 0, float("nan"), 1]), ["clustering.extent"]),
        (lambda r: r["clustering"].update(hilbert_bits=0), ["clustering.hilbert_bits", "0"]),
        (lambda r: r["clustering"].update(row_group_rows=0), ["clustering.row_group_rows", "0"]),
        (lambda r: r["clustering"].update(row_group_rows=-5), ["clustering.row_group_rows", "-5"]),
        (lambda r: r["clustering"].update(target_file_bytes=True), ["clustering.target_file_bytes", "True"]),
    ],
    ids=[
        "missing-table",
        "table-without-namespace",
        "unknown-format",
        "no-formats",
        "bad-type",
        "unknown-source",
        "no-sources",
        "bad-required",
        "id-not-int",
        "id-used-twice",
        "id-not-positive",
        "duplicate-name",
        "name-clashes-with-bbox",
        "unknown-geometry-type",
        "bad-dimension",
        "crs-not-epsg",
        "unknown-epsg",
        "bad-encoding",
        "bad-invalid-polygons",
        "missing-geometry-name",
        "missing-bbox-name",
        "extent-inverted",
        "extent-short",
        "extent-nan",
        "hilbert-bits-zero",
        "row-group-rows-zero",
        "row-group-rows-negative",
        "target-file-bytes-bool",
    ],
)
def test_every_validation_error_names_its_field(edit, names):
    message = error_of(edit)
    for name in names:
        assert name in message


@pytest.mark.parametrize(
    "edit, prefix",
    [
        (lambda r: r.pop("table"), "table:"),
        (lambda r: r["columns"][1].update(type="datetime"), "columns[1].type:"),
        (lambda r: r["columns"][0]["from"].__setitem__(0, "payload.id"), "columns[0].from[0]:"),
        (lambda r: r["geometry"].update(crs="EPSG:999999"), "geometry.crs:"),
        (lambda r: r["clustering"].update(row_group_rows=0), "clustering.row_group_rows:"),
    ],
)
def test_the_message_starts_with_the_field(edit, prefix):
    assert error_of(edit).startswith(prefix)


def test_not_an_object_is_refused():
    with pytest.raises(ContractError, match="JSON object"):
        parse_contract([RAW])


def test_load_contract_names_the_path_of_a_missing_file(tmp_path):
    path = tmp_path / "nowhere.json"
    with pytest.raises(ContractError, match="no such contract file") as info:
        load_contract(path)
    assert str(path) in str(info.value)


def test_load_contract_names_the_path_of_invalid_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"table": "demo.events",')
    with pytest.raises(ContractError, match="not valid JSON") as info:
        load_contract(path)
    assert str(path) in str(info.value)


def test_load_contract_names_path_and_field_of_an_invalid_contract(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(edited(lambda r: r["columns"][1].update(type="datetime"))))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert str(info.value).startswith(f"{path}: columns[1].type:")


def test_extent_defaults_to_the_wgs84_area_of_use():
    contract = parse_contract(edited(lambda r: r["clustering"].pop("extent")))
    assert contract.clustering.extent == pytest.approx((-180.0, -90.0, 180.0, 90.0), abs=1e-6)


def test_extent_defaults_to_the_web_mercator_area_of_use_in_metres():
    def web_mercator(raw):
        raw["geometry"]["crs"] = "EPSG:3857"
        raw.pop("clustering")

    contract = parse_contract(edited(web_mercator))
    xmin, ymin, xmax, ymax = contract.clustering.extent
    assert xmin == pytest.approx(-20_037_508.34, abs=1.0) and xmax == pytest.approx(20_037_508.34, abs=1.0)
    # EPSG:3857's area of use stops at about 85 degrees of latitude, about as far north as east.
    assert ymin == pytest.approx(-20_037_508.34, rel=0.01) and ymax == pytest.approx(20_037_508.34, rel=0.01)
    assert contract.clustering.hilbert_bits == 16
    assert contract.clustering.target_file_bytes > 0 and contract.clustering.row_group_rows > 0


def test_table_properties_record_how_the_geometry_is_stored():
    contract = load_contract(CONTRACT_PATH)
    props = contract.table_properties()
    assert props["format-version"] == "2"
    assert props["geo.primary-column"] == "geometry"
    assert props["geo.column.geometry.encoding"] == "wkb"
    assert props["geo.column.geometry.types"] == "Point,LineString,Polygon,MultiPoint,MultiLineString,MultiPolygon"
    assert props["geo.column.geometry.dimensions"] == "XY,XYZ"
    assert props["geo.column.geometry.crs"] == "EPSG:4326"
    assert props["geo.column.geometry.covering"] == "bbox"
    assert props["geo.hilbert.bits"] == "16"
    assert [float(v) for v in props["geo.hilbert.extent"].split(",")] == [-180.0, -90.0, 180.0, 90.0]
    assert json.loads(props["geoingest.contract"]) == RAW
    assert all(isinstance(v, str) for v in props.values())


def test_table_properties_follow_the_contract():
    def variant(raw):
        raw["geometry"].update(name="geom", types=["Polygon"], dimensions=["XYZ"], crs="EPSG:3857")
        raw["bbox"]["name"] = "extent_box"
        raw["clustering"] = {"hilbert_bits": 10}

    props = parse_contract(edited(variant)).table_properties()
    assert props["geo.primary-column"] == "geom"
    assert props["geo.column.geom.types"] == "Polygon"
    assert props["geo.column.geom.dimensions"] == "XYZ"
    assert props["geo.column.geom.crs"] == "EPSG:3857"
    assert props["geo.column.geom.covering"] == "extent_box"
    assert props["geo.hilbert.bits"] == "10"
    assert not any(k.startswith("geo.column.geometry.") for k in props)


def _json_schemas_in_schemas_dir() -> list[Path]:
    found = []
    for path in sorted(SCHEMAS.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and "$schema" in doc:
            found.append(path)
    return found


def test_schemas_dir_holds_a_json_schema_for_geojson_events():
    """Another change may add a JSON Schema for the GeoJSON events; check it when it is there."""
    schemas = _json_schemas_in_schemas_dir()
    if not schemas:
        pytest.skip("no JSON Schema (a file with '$schema') in schemas/ yet")
    import jsonschema

    event = {
        "type": "Feature",
        "id": "e-1",
        "geometry": {"type": "Point", "coordinates": [2.35, 48.86]},
        "properties": {"kind": "ping", "speed": 3.5},
    }
    accepting = []
    for path in schemas:
        schema = json.loads(path.read_text())
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
        validator = validator_class(schema)
        if validator.is_valid(event):
            accepting.append(path.name)
            assert not validator.is_valid({"type": "FeatureCollection", "features": [event]}), path.name
            assert not validator.is_valid([event]), path.name
    assert accepting, f"none of {[p.name for p in schemas]} accepts a GeoJSON Point Feature"


def test_geojson_event_schema_agrees_with_the_decoder_on_the_shape_of_a_feature():
    """What the decoder refuses for its shape (not a Feature, no geometry, unreadable geometry,
    positions of 4 values) the schema refuses too; what it takes, the schema takes."""
    schemas = [p for p in _json_schemas_in_schemas_dir() if "geojson" in p.name.lower()]
    if not schemas:
        pytest.skip("no GeoJSON event JSON Schema in schemas/ yet")
    import jsonschema

    from streaming.decode.rejects import Reason
    from tests.streaming.decode.test_decoder import HOLE, SQUARE, decode, feature, point

    accepted = [
        feature(point(2.35, 48.86), fid=7, speed=1.5),
        feature(point(2.35, 48.86, 35.0)),
        feature({"type": "LineString", "coordinates": [[0, 0], [1, 1]]}),
        feature({"type": "Polygon", "coordinates": [SQUARE, HOLE]}),
        feature({"type": "MultiPolygon", "coordinates": [[SQUARE]]}),
    ]
    refused = {
        Reason.NOT_A_FEATURE: b'{"type": "FeatureCollection", "features": []}',
        Reason.MISSING_GEOMETRY: feature(None),
        Reason.INVALID_GEOJSON_GEOMETRY: feature({"type": "Point", "coordinates": "abc"}),
        Reason.DIMENSION_NOT_ALLOWED: feature(point(1, 2, 3, 4)),
    }
    for row in decode(accepted):
        assert row["_reject_reason"] is None
    rows = decode(list(refused.values()))
    assert [r["_reject_reason"] for r in rows] == [reason.value for reason in refused]
    for path in schemas:
        schema = json.loads(path.read_text())
        validator = jsonschema.validators.validator_for(schema)(schema)
        for doc in accepted:
            assert validator.is_valid(json.loads(doc)), (path.name, doc)
        for reason, doc in refused.items():
            assert not validator.is_valid(json.loads(doc)), (path.name, reason, doc)


# -- keys, primary key, write mode, schema evolution -------------------------------------------------
@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r.update({"primary_keys": ["event_id"]}), "primary_keys: not a contract key"),
        (lambda r: r["columns"][0].update({"requird": True}), "columns[0].requird: not a contract key"),
        (lambda r: r["geometry"].update({"srid": 4326}), "geometry.srid: not a contract key"),
        (lambda r: r["bbox"].update({"flat": True}), "bbox.flat: not a contract key"),
        (lambda r: r["clustering"].update({"bits": 12}), "clustering.bits: not a contract key"),
        (lambda r: r.update({"schema_evolution": {"mode": "off", "limit": 3}}), "schema_evolution.limit: not a"),
    ],
)
def test_a_key_the_contract_does_not_know_is_an_error_naming_it(edit, message):
    assert error_of(edit).startswith(message)


def test_append_is_the_default_mode_with_no_primary_key():
    contract = load_contract(CONTRACT_PATH)
    assert (contract.mode, contract.primary_key, contract.schema_evolution.mode) == ("append", (), "off")


def test_upsert_takes_the_column_the_kafka_key_feeds_as_its_primary_key_by_default():
    contract = parse_contract(edited(lambda r: r.update({"mode": "upsert"})))
    assert contract.primary_key == ("event_id",)
    named = parse_contract(
        edited(lambda r: r.update({"mode": "upsert", "primary_key": ["event_id", "source_partition"]}))
    )
    assert named.primary_key == ("event_id", "source_partition")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r.update({"mode": "merge"}), "mode: 'merge' is not one of ['append', 'upsert']"),
        (lambda r: r.update({"primary_key": ["nope"]}), "primary_key[0]: 'nope' is not one of the columns"),
        (lambda r: r.update({"primary_key": ["kind"]}), "primary_key[0]: column 'kind' must be required"),
        (lambda r: r.update({"primary_key": []}), "primary_key: expected a column name or a list"),
        (
            lambda r: (r.update({"mode": "upsert"}), r["columns"][0].update({"from": ["id"]})),
            "primary_key: missing, and no column comes from kafka.key",
        ),
        (lambda r: r.update({"schema_evolution": "sometimes"}), "schema_evolution.mode: 'sometimes' is not one of"),
        (
            lambda r: r.update({"schema_evolution": {"mode": "off", "max_columns": 0}}),
            "schema_evolution.max_columns: 0 must be a positive whole number",
        ),
        (
            lambda r: r.update({"schema_evolution": {"mode": "off", "name_pattern": "("}}),
            "schema_evolution.name_pattern: '(' is not a regular expression",
        ),
    ],
)
def test_key_mode_and_evolution_errors_name_the_field(edit, message):
    assert error_of(edit).startswith(message)


def test_schema_evolution_modes():
    assert parse_contract(edited(lambda r: r.update({"schema_evolution": "off"}))).schema_evolution.mode == "off"
    evolving = parse_contract(
        edited(lambda r: r.update({"schema_evolution": {"mode": "add-columns", "max_columns": 40}}))
    )
    assert (evolving.schema_evolution.mode, evolving.schema_evolution.max_columns) == ("add-columns", 40)


@pytest.mark.parametrize(
    "edit, names",
    [
        (lambda r: r["columns"][2].update(id=50), ["columns[2].id", "expected 3"]),
        (lambda r: r["bbox"].update(id=11), ["bbox.id", "expected 10"]),
        (lambda r: r["geometry"].update(id=30), ["geometry.id", "expected 9"]),
    ],
    ids=["column", "bbox", "geometry"],
)
def test_a_new_table_needs_its_ids_in_declaration_order(edit, names):
    # An existing table's contract keeps the ids it has, gaps included (columns dropped, renamed, added).
    contract = parse_contract(edited(edit))
    with pytest.raises(ContractError) as raised:
        check_fresh_ids(contract)
    for name in names:
        assert name in str(raised.value)


def test_retention_is_days_or_hours_on_a_time_partition():
    def with_retention(retention, partition=("day(event_time)", "kind")):
        return lambda c: c.update(retention=retention, partition=list(partition))

    assert parse_contract(edited(with_retention("30 days"))).retention_s == 30 * 86400
    assert parse_contract(edited(with_retention("12 hours", ["hour(event_time)"]))).retention_s == 12 * 3600
    assert parse_contract(edited(lambda c: None)).retention_s is None
    assert error_of(with_retention("a month")).startswith("retention: 'a month' is not a retention")
    assert error_of(with_retention("0 days")).startswith("retention: '0 days' is not a retention")
    assert error_of(with_retention("30 days", ["kind"])) == (
        "retention: '30 days' needs a time partition to drop, and partition (['kind']) has none; "
        "add e.g. 'day(<timestamptz column>)'"
    )
    # The partition spec itself refuses a time transform of a string column, naming the field.
    assert "partition[0]: day(kind): column 'kind' is a string" in error_of(with_retention("30 days", ["day(kind)"]))


def _without_covering(raw: dict) -> None:
    raw["geometry"]["native"] = True
    raw["bbox"] = {"stored": False}


def test_a_native_table_without_its_covering_numbers_the_cells_after_the_geometry_yet_its_rows_carry_it():
    raw = edited(_without_covering)
    raw["partition"] = ["day(event_time)", "geohash(geometry, 3)"]
    contract = parse_contract(raw)
    check_fresh_ids(contract)  # the ids Iceberg gives a new table
    top = {f.field_id: f.name for f in contract.iceberg_schema.fields}
    assert top[9] == "geometry" and top[10] == "geometry_geohash3" and "bbox" not in top.values()
    assert "bbox" not in contract.data_file_schema.names
    names = contract.arrow_schema.names
    assert names[names.index("geometry") + 1] == "bbox", "the decoder still hands the writer the covering"
    properties = contract.table_properties()
    assert "geo.column.geometry.covering" not in properties and properties["format-version"] == "3"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(bbox={"stored": False}), "bbox.stored: false needs geometry.native: true"),
        (lambda r: (_without_covering(r), r["bbox"].update(id=10)), "bbox.id: 10, but a covering that is not stored"),
        (lambda r: (_without_covering(r), r["bbox"].update(flat_columns=True)), "bbox.flat_columns: copies"),
        (lambda r: (_without_covering(r), r["bbox"].update(stored="no")), "bbox.stored: expected true or false"),
    ],
)
def test_dropping_the_covering_is_refused_where_it_cannot_hold(edit, message):
    assert error_of(edit).startswith(message)
