"""The covering computed again from stored geometries (streaming/decode/covering.py) is the one the
decoder gave the rows: checked on hard-coded boxes, across the anti-meridian too."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import shapely

from streaming.contract import parse_contract
from streaming.decode.covering import with_covering
from streaming.decode.decoder import REJECT_REASON, Decoder
from tests.streaming.decode.test_decoder import feature, kafka_batch

RAW = json.loads((Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json").read_text())


def contract(antimeridian: str):
    geometry = {**RAW["geometry"], "native": True, "antimeridian": antimeridian}
    return parse_contract({**RAW, "geometry": geometry, "bbox": {"stored": False}})


def wkb(geometry) -> bytes:
    return shapely.to_wkb(geometry)


def test_the_covering_of_stored_geometries_is_their_box_wrapped_the_short_way():
    rows = pa.table(
        {
            "geometry": pa.array(
                [
                    wkb(shapely.Point(2.5, 48.0)),
                    wkb(shapely.LineString([(179.0, 10.0), (-179.0, 11.0)])),
                    wkb(shapely.Polygon([(0, 0), (4, 0), (4, 3), (0, 0)])),
                    None,
                ],
                pa.binary(),
            )
        }
    )
    short = with_covering(rows, contract("short")).column("bbox").to_pylist()
    assert short == [
        {"xmin": 2.5, "ymin": 48.0, "xmax": 2.5, "ymax": 48.0},
        {"xmin": 179.0, "ymin": 10.0, "xmax": -179.0, "ymax": 11.0},
        {"xmin": 0.0, "ymin": 0.0, "xmax": 4.0, "ymax": 3.0},
        None,
    ]
    planar = with_covering(rows, contract("planar")).column("bbox").to_pylist()
    assert planar[1] == {"xmin": -179.0, "ymin": 10.0, "xmax": 179.0, "ymax": 11.0}


def test_the_covering_made_again_equals_the_decoders():
    c = contract("short")
    lines = [
        {"type": "LineString", "coordinates": [[179.5, -5.0], [-179.5, 5.0]]},
        {"type": "Point", "coordinates": [-73.9, 40.7]},
        {"type": "Polygon", "coordinates": [[[10, 10], [12, 10], [12, 13], [10, 10]]]},
    ]
    decoded = pa.Table.from_batches(
        [Decoder(c).decode(kafka_batch([feature(g, f"e{i}") for i, g in enumerate(lines)]))]
    )
    assert decoded.filter(pc.is_valid(decoded.column(REJECT_REASON))).num_rows == 0
    stored = decoded.select(["geometry"])
    assert with_covering(stored, c).column("bbox").to_pylist() == decoded.column("bbox").to_pylist()
    assert with_covering(decoded, c) is decoded, "rows that carry it keep theirs"
