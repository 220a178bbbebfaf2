"""The contract's anti-meridian reading and the bbox and Hilbert key the decoder gives a row."""

from __future__ import annotations

import pytest

from streaming.contract import ContractError
from streaming.decode.decoder import HILBERT
from streaming.kernels.hilbert import hilbert_keys_of_bounds
from tests.streaming.decode.test_decoder import DEMO, assert_valid, contract_from, decode, feature, point


def line(*coordinates: tuple[float, float]) -> dict:
    return {"type": "LineString", "coordinates": [list(c) for c in coordinates]}


def test_geographic_contracts_read_the_short_way_by_default_projected_ones_cannot():
    assert DEMO.geometry.antimeridian == "short"
    planar = contract_from(lambda raw: raw["geometry"].update(antimeridian="planar"))
    assert planar.geometry.antimeridian == "planar"
    with pytest.raises(ContractError, match="geometry.antimeridian: 'long'"):
        contract_from(lambda raw: raw["geometry"].update(antimeridian="long"))

    def mercator(raw: dict) -> None:
        raw["geometry"].update(crs="EPSG:3857", antimeridian="short")
        raw.pop("clustering")

    with pytest.raises(ContractError, match="'short' needs a geographic CRS"):
        contract_from(mercator)


def test_a_line_across_the_antimeridian_gets_a_wrapped_bbox_and_a_key_near_180():
    values = [
        feature(line((179.5, 10), (-179.5, 11))),
        feature(line((-100, 0), (-10, 0), (100, 0))),  # wide but every edge short: plain
        feature(point(5, 5)),
    ]
    rows = decode(values)
    for row in rows:
        assert_valid(row)
    assert rows[0]["bbox"] == {"xmin": 179.5, "ymin": 10.0, "xmax": -179.5, "ymax": 11.0}
    assert rows[1]["bbox"] == {"xmin": -100.0, "ymin": 0.0, "xmax": 100.0, "ymax": 0.0}
    extent, bits = DEMO.clustering.extent, DEMO.clustering.hilbert_bits
    near_180 = hilbert_keys_of_bounds([180.0], [10.5], [180.0], [10.5], extent, bits)[0]
    assert rows[0][HILBERT] == near_180

    planar = contract_from(lambda raw: raw["geometry"].update(antimeridian="planar"))
    assert decode(values[:1], planar)[0]["bbox"] == {"xmin": -179.5, "ymin": 10.0, "xmax": 179.5, "ymax": 11.0}
