"""Contracts of plain JSON events (format "json") and WKT: the `json` section, `json.<path>`
columns, every contract in schemas/ loading, and errors that name the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from streaming.contract import ContractError, JsonFields, load_contract, parse_contract

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
VEHICLES = json.loads((SCHEMAS / "vehicle_positions.json").read_text())


def edited(edit) -> dict:
    raw = copy.deepcopy(VEHICLES)
    edit(raw)
    return raw


def error_of(edit) -> str:
    with pytest.raises(ContractError) as info:
        parse_contract(edited(edit))
    return str(info.value)


@pytest.mark.parametrize("path", sorted(p.name for p in SCHEMAS.glob("*.json")))
def test_every_contract_in_schemas_loads(path):
    raw = json.loads((SCHEMAS / path).read_text())
    if "$schema" in raw:
        pytest.skip("a JSON Schema of events, not a table contract")
    load_contract(SCHEMAS / path)


def test_the_vehicle_contract_reads_lon_lat_and_columns_from_json_paths():
    contract = load_contract(SCHEMAS / "vehicle_positions.json")
    assert contract.formats == ("json",)
    assert contract.json == JsonFields(lon="position.lon", lat="position.lat", epsg=4326)
    assert contract.columns[0].sources == ("json.vehicle", "kafka.key")
    assert contract.columns[3].sources == ("json.position.heading",)


def test_a_geometry_field_in_any_encoding():
    for encoding in ("wkt", "geojson", "wkb_hex", "wkb_base64"):

        def edit(raw, encoding=encoding):
            raw["json"] = {"geometry": {"path": "place.shape", "encoding": encoding}, "crs": "EPSG:3857"}

        contract = parse_contract(edited(edit))
        assert contract.json == JsonFields(geometry_path="place.shape", geometry_encoding=encoding, epsg=3857)


def test_wkt_and_ewkt_are_formats():
    raw = edited(lambda r: r.update(formats=["wkt", "ewkt"]))
    del raw["json"]
    for column in raw["columns"]:
        column["from"] = [s for s in column["from"] if not s.startswith("json.")] or ["kafka.key"]
    assert parse_contract(raw).formats == ("wkt", "ewkt")


@pytest.mark.parametrize(
    "edit, prefix, names",
    [
        (lambda r: r.pop("json"), "json:", ["missing", "lon"]),
        (lambda r: r["json"].pop("lat"), "json.lat:", ["missing"]),
        (lambda r: r["json"].update(lon="position..lon"), "json.lon:", ["JSON path"]),
        (lambda r: r["json"].update(lat="position.lon"), "json:", ["different"]),
        (lambda r: r["json"].update(crs="EPSG:3857"), "json.crs:", ["geographic"]),
        (lambda r: r["json"].update(crs="EPSG:999999"), "json.crs:", ["PROJ"]),
        (lambda r: r["json"].update(speed="x"), "json.speed:", ["not a contract key"]),
        (lambda r: r["json"].update(geometry={"path": "g", "encoding": "wkt"}), "json:", ["either"]),
        (lambda r: r.update(json={"geometry": {"path": "g", "encoding": "twkb"}}), "json.geometry.encoding:", ["wkt"]),
        (lambda r: r.update(json={"geometry": {"path": "g"}}), "json.geometry.encoding:", ["missing"]),
        (lambda r: r.update(json={"geometry": {"path": "g", "encoding": "wkt", "x": 1}}), "json.geometry.x:", []),
        (lambda r: r.update(formats=["json", "geojson"]), "formats:", ["one of them"]),
        (lambda r: r.update(formats=["wkb"]), "json:", ["not in formats"]),
        (lambda r: r["columns"][2].update({"from": ["json.position"]}), "columns[2].from[0]:", ["inside it"]),
        (lambda r: r["columns"][2].update({"from": ["json.position.lon"]}), "columns[2].from[0]:", ["geometry"]),
        (lambda r: r["columns"][2].update({"from": ["json."]}), "columns[2].from[0]:", ["json.<path>"]),
    ],
    ids=[
        "no-section",
        "no-lat",
        "bad-path",
        "same-path",
        "projected-crs",
        "unknown-crs",
        "unknown-key",
        "both-readings",
        "bad-encoding",
        "no-encoding",
        "unknown-geometry-key",
        "geojson-and-json",
        "section-without-format",
        "value-and-object",
        "column-reads-coordinate",
        "empty-path",
    ],
)
def test_every_json_error_names_its_field(edit, prefix, names):
    message = error_of(edit)
    assert message.startswith(prefix), message
    for name in names:
        assert name in message, message


def test_json_columns_need_the_json_format():
    def edit(raw):
        raw["formats"] = ["geojson"]
        del raw["json"]

    assert error_of(edit).startswith("columns[0].from[0]: 'json.vehicle' reads a field of JSON events")
