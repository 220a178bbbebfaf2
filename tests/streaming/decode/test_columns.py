"""The contract's columns from Kafka keys and headers and GeoJSON properties: the first source set
wins, and a value that does not fit its column rejects its record, naming both."""

from __future__ import annotations

import shapely

from streaming.decode.decoder import REJECT_DETAIL, REJECT_REASON
from streaming.decode.rejects import Reason
from tests.streaming.decode.test_decoder import (
    assert_valid,
    decode,
    feature,
    point,
)


def test_headers_with_bad_utf8_are_a_type_mismatch_naming_column_and_source():
    wkb = shapely.to_wkb(shapely.Point(1, 2))
    rows = decode([wkb], headers=[[("kind", b"\xff\xfe")]])
    assert rows[0][REJECT_REASON] == Reason.PROPERTY_TYPE_MISMATCH
    assert "kind (from kafka.headers.kind)" in rows[0][REJECT_DETAIL]


def test_headers_map_to_columns_for_wkb_events():
    wkb = shapely.to_wkb(shapely.Point(1, 2))
    rows = decode(
        [wkb, wkb, wkb, feature(point(1, 2), kind="from-properties")],
        headers=[
            [("kind", b"site")],
            [("trace", b"t"), ("kind", b"first"), ("kind", b"last")],
            [],
            [("kind", b"from-header")],
        ],
    )
    for row in rows:
        assert_valid(row)
    assert [r["kind"] for r in rows] == ["site", "last", None, "from-properties"]
    assert rows[0]["_raw_headers"] is None, "raw headers are kept for rejects only"


def test_unused_fallback_source_does_not_reject_the_record():
    row = decode([feature(point(1, 2), fid="has-an-id")], keys=[b"\xff\xfe binary key"])[0]
    assert_valid(row)
    assert row["event_id"] == "has-an-id"
