"""The shipped schemas: contracts load, and the GeoJSON event schema agrees with the decoder."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pyarrow as pa
import pytest

from streaming.contract import load_contract
from streaming.decode.decoder import Decoder

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
EVENT_SCHEMA = json.loads((SCHEMAS / "geojson-event.schema.json").read_text())
GOOD = [
    {
        "type": "Feature",
        "id": "a",
        "geometry": {"type": "Point", "coordinates": [2.35, 48.85]},
        "properties": {"kind": "ping"},
    },
    {"type": "Feature", "id": 7, "geometry": {"type": "Point", "coordinates": [2.35, 48.85, 35.0]}, "properties": None},
    {
        "type": "Feature",
        "geometry": {
            "type": "Polygon",
            "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]], [[0.5, 0.1], [0.9, 0.1], [0.9, 0.4], [0.5, 0.1]]],
        },
    },
]
BAD = [
    {"type": "FeatureCollection", "features": []},
    {"type": "Feature", "geometry": {"type": "Point", "coordinates": [1]}},
    {"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 2, 3, 4]}},
    {"type": "Feature", "geometry": {"type": "Point", "coordinates": ["1", "2"]}},
    {"type": "Feature", "geometry": {"type": "Circle", "coordinates": [1, 2]}},
    {"type": "Feature", "geometry": None},
]


def test_event_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(EVENT_SCHEMA)


def test_every_contract_in_schemas_loads():
    contracts = [p for p in SCHEMAS.glob("*.json") if p.name != "geojson-event.schema.json"]
    assert contracts
    for path in contracts:
        load_contract(path)


@pytest.mark.parametrize("event", GOOD)
def test_valid_events_pass_the_schema_and_decode(event):
    jsonschema.validate(event, EVENT_SCHEMA)
    assert _decode(event) is None


@pytest.mark.parametrize("event", BAD)
def test_invalid_events_fail_the_schema_and_are_rejected(event):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(event, EVENT_SCHEMA)
    assert _decode(event) is not None


def _decode(event: dict) -> str | None:
    """The decoder's reject reason for this event under the demo contract (None: accepted)."""
    batch = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([b"k"]),
            "value": pa.array([json.dumps(event).encode()]),
            "topic": pa.array(["t"]),
            "partition": pa.array([0], pa.int32()),
            "offset": pa.array([0], pa.int64()),
            "timestamp": pa.array([0], pa.timestamp("us")),
        }
    )
    return Decoder(load_contract(SCHEMAS / "demo_events.json")).decode(batch).column("_reject_reason")[0].as_py()
