"""The table's geometry rules that every format meets (the rest are in test_decode.py's reason
cases): the invalid polygon policy."""

from __future__ import annotations

import pytest

from streaming.decode.decoder import REJECT_DETAIL, REJECT_REASON
from streaming.decode.rejects import Reason
from tests.streaming.decode.test_decoder import (
    BOW_TIE,
    DEMO,
    assert_valid,
    decode,
    feature,
    geometry_of,
    with_geometry,
)


def test_bow_tie_is_repaired_into_a_multipolygon_under_repair():
    row = decode([feature(BOW_TIE)])[0]
    assert DEMO.geometry.invalid_polygons == "repair"
    assert_valid(row)
    stored = geometry_of(row)
    assert stored.geom_type == "MultiPolygon" and stored.is_valid
    assert stored.area == pytest.approx(2.0)


def test_bow_tie_is_rejected_under_reject():
    row = decode([feature(BOW_TIE)], with_geometry(invalid_polygons="reject"))[0]
    assert row[REJECT_REASON] == Reason.INVALID_POLYGON
    assert "Self-intersection" in row[REJECT_DETAIL]
