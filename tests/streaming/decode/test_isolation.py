"""A record that crashes native code is found and rejected, not left to stop the stream.

The crash is real: with the nesting guard turned off (max_nesting beyond the input's depth), a
WKB collection nested 50,000 deep makes GEOS recurse until its stack overflows, as it would for
any input that meets a native defect no check foresees."""

from __future__ import annotations

import shapely

from streaming.decode.decoder import REJECT_REASON, DecodeOptions
from streaming.decode.isolation import IsolatedDecoder
from streaming.decode.rejects import Reason
from tests.streaming.decode.test_decoder import DEMO, GOOD, kafka_batch

DEEP = b"\x01\x07\x00\x00\x00\x01\x00\x00\x00" * 50_000 + shapely.to_wkb(shapely.Point(1, 2))
UNGUARDED = DecodeOptions(max_nesting=10**6)


def test_the_crashing_record_is_rejected_and_the_others_decode():
    values = [GOOD, shapely.to_wkb(shapely.Point(2, 3)), DEEP, GOOD, GOOD]
    decoder = IsolatedDecoder(DEMO, UNGUARDED)
    try:
        rows = decoder.decode(kafka_batch(values)).to_pylist()
    finally:
        decoder.close()
    assert [r[REJECT_REASON] for r in rows] == [None, None, Reason.DECODE_FAILED.value, None, None]
    assert "crashed" in rows[2]["_reject_detail"]
    assert rows[2]["_raw_value"] == DEEP  # the dead letter keeps the original bytes


def test_without_a_crash_it_decodes_as_the_decoder_does():
    decoder = IsolatedDecoder(DEMO)
    try:
        rows = decoder.decode(kafka_batch([GOOD, b"junk", GOOD])).to_pylist()
    finally:
        decoder.close()
    assert [r[REJECT_REASON] for r in rows] == [None, Reason.UNKNOWN_FORMAT.value, None]
