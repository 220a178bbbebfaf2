"""GeoJSON Feature events (format "geojson"): geometries, ids and properties as sent, odd but valid
spellings, and a bad document costing no more than its own diagnosis."""

from __future__ import annotations

import json

import pyarrow.json as pa_json
import pytest
import shapely

from streaming.decode.decoder import RAW_KEY, RAW_VALUE, REJECT_DETAIL, REJECT_REASON, Decoder
from streaming.decode.rejects import Reason
from tests.streaming.decode.test_decoder import (
    DEMO,
    GOOD,
    HOLE,
    SQUARE,
    assert_valid,
    decode,
    feature,
    geometry_of,
    kafka_batch,
    point,
)


@pytest.mark.parametrize(
    "geometry",
    [
        point(2.35, 48.86),
        {"type": "LineString", "coordinates": [[2.0, 48.0], [2.1, 48.05], [2.2, 48.2]]},
        {"type": "Polygon", "coordinates": [SQUARE, HOLE]},
        {"type": "MultiPolygon", "coordinates": [[SQUARE, HOLE], [[[10, 10], [11, 10], [11, 11], [10, 10]]]]},
    ],
    ids=lambda g: g["type"],
)
def test_valid_geojson_geometries_are_stored_as_sent(geometry):
    row = decode([feature(geometry, fid="e-1", kind="probe", name="n", speed=4, population=12)])[0]
    assert_valid(row)
    expected = shapely.from_geojson(json.dumps(geometry))
    stored = geometry_of(row)
    assert stored.geom_type == geometry["type"]
    assert shapely.equals_exact(stored, expected, tolerance=0)
    assert (row["event_id"], row["kind"], row["name"], row["speed"], row["population"]) == (
        "e-1",
        "probe",
        "n",
        4.0,
        12,
    )
    assert row[RAW_VALUE] is None and row[RAW_KEY] is None


def test_polygon_keeps_its_hole():
    stored = geometry_of(decode([feature({"type": "Polygon", "coordinates": [SQUARE, HOLE]})])[0])
    assert len(stored.interiors) == 1 and stored.area == 15.0


def test_3d_points_keep_z():
    rows = decode([feature(point(2.35, 48.86, 35.5), fid="z-1"), feature(point(-0.13, 51.51, -4.0), fid="z-2")])
    for row, z in zip(rows, (35.5, -4.0)):
        assert_valid(row)
        stored = geometry_of(row)
        assert stored.has_z and stored.z == z


@pytest.mark.parametrize(
    "ids",
    [[7, "x-1"], ["x-1", 7], [7, 8], [7, "x-1", 8, "x-2", 9.0]],
    ids=["num-str", "str-num", "all-numbers", "interleaved"],
)
def test_numeric_and_string_ids_both_land_as_strings(ids):
    rows = decode([feature(point(1, 2), fid=i, speed=float(n)) for n, i in enumerate(ids)])
    for row in rows:
        assert_valid(row)
    expected = [str(int(i)) if isinstance(i, int | float) else i for i in ids]
    assert [r["event_id"] for r in rows] == expected
    assert [r["speed"] for r in rows] == [float(n) for n in range(len(ids))], "properties stay with their row"


def test_pretty_printed_feature_decodes():
    pretty = json.dumps(
        json.loads(feature(point(2.35, 48.86), fid="pretty", kind="multi\u00a0line")), indent=2
    ).encode()
    assert b"\n" in pretty
    rows = decode([pretty, GOOD, pretty.replace(b"\n", b"\r\n")])
    for row in rows:
        assert_valid(row)
    assert rows[0]["event_id"] == "pretty" and rows[0]["kind"] == "multi\u00a0line"
    assert rows[2]["event_id"] == "pretty"
    assert geometry_of(rows[0]).equals(shapely.Point(2.35, 48.86))


@pytest.mark.parametrize("prefix", [b" ", b"\n", b"\t\r\n  "])
def test_leading_whitespace_before_json_is_accepted(prefix):
    rows = decode([prefix + GOOD, GOOD])
    assert_valid(rows[0])
    assert rows[0]["event_id"] == "good" and rows[0]["kind"] == "ping"


@pytest.fixture
def json_reads(monkeypatch) -> list[int]:
    """The size of every buffer handed to pyarrow's JSON reader while the test runs."""
    sizes: list[int] = []
    read_json = pa_json.read_json

    def counting_read_json(source, *args, **kwargs):
        sizes.append(source.size())
        return read_json(source, *args, **kwargs)

    monkeypatch.setattr(pa_json, "read_json", counting_read_json)
    return sizes


@pytest.mark.parametrize(
    "ids, bad",
    [
        pytest.param("string", b'{"type": "Feature", "id": "cut", "geometry": {"type": "Po', id="string-ids-malformed"),
        pytest.param(
            "numeric", b'{"type": "Feature", "id": "cut", "geometry": {"type": "Po', id="numeric-ids-malformed"
        ),
        pytest.param(
            "string", b'{"type": "Feature", "id": "a"}{"type": "Feature", "id": "b"}', id="string-ids-two-docs"
        ),
    ],
)
def test_isolating_one_bad_record_reads_each_document_a_bounded_number_of_times(json_reads, ids, bad):
    """Finding the bad record must not re-read the rest of the batch once per record: the bytes
    handed to pyarrow's JSON reader stay within a small multiple of the batch."""
    n = 1000
    good = [feature(point(i % 170, i % 80), fid=i if ids == "numeric" else f"g-{i}") for i in range(n)]
    values = good[: n // 2] + [bad] + good[n // 2 :]
    rows = decode(values)
    assert [r[REJECT_REASON] is None for r in rows].count(True) == n
    batch_bytes = sum(len(v) + 1 for v in values)
    assert json_reads, "the block reader was used"
    assert sum(json_reads) <= 10 * batch_bytes, (
        f"{len(json_reads)} reads, {sum(json_reads) / batch_bytes:.0f} x the batch"
    )


LINE = {"type": "LineString", "coordinates": [[2.0, 48.0], [2.1, 48.05]]}
HEXAGON = {"type": "Polygon", "coordinates": [SQUARE, HOLE]}


@pytest.mark.parametrize(
    "geometries",
    [
        pytest.param([point(i / 2, i / 4) for i in range(300)], id="points"),
        pytest.param([point(i / 2, i / 4) for i in range(150)] + [LINE, HEXAGON] * 75, id="points-then-others"),
        pytest.param([HEXAGON] + [point(i / 2, i / 4) for i in range(299)], id="another-type-first"),
        pytest.param([point(i / 2, i / 4, 7.5) if i % 3 else point(i / 2, i / 4) for i in range(300)], id="2d-and-3d"),
        pytest.param(
            [point(i / 2, i / 4) for i in range(100)] + [{"type": "Point", "coordinates": [[1, 2]]}] + [LINE] * 199,
            id="an-odd-point-then-lines",
        ),
    ],
)
def test_a_batch_is_read_as_geos_reads_it_whatever_its_mix_of_types(geometries):
    """The first document's geometry type is read with the Feature members, in one pass; the
    others, and any block that refuses that reading, by type after it: every geometry still
    comes out as GEOS reads it, or as its reject."""
    values = [feature(g, fid=f"f-{i}") for i, g in enumerate(geometries)]
    rows = decode(values)
    for value, geometry, row in zip(values, geometries, rows):
        if geometry["coordinates"] == [[1, 2]]:
            assert row[REJECT_REASON] == Reason.INVALID_GEOJSON_GEOMETRY, row
            continue
        assert_valid(row)
        expected = shapely.from_geojson(json.dumps(geometry))
        assert shapely.equals_exact(geometry_of(row), expected, tolerance=0), value
        assert shapely.has_z(geometry_of(row)) == shapely.has_z(expected)
    assert [r["event_id"] for r in rows] == [f"f-{i}" for i in range(len(values))]


def test_a_batch_of_one_geometry_type_is_parsed_once(json_reads):
    """Its coordinates are read with the Feature members: the JSON reader sees its bytes once,
    and a sample of them again for the property names no column maps (properties.py)."""
    values = [feature(point(i % 170, i % 80), fid=f"g-{i}") for i in range(1000)]
    rows = decode(values)
    assert all(r[REJECT_REASON] is None for r in rows)
    batch_bytes = sum(len(v) + 1 for v in values)
    assert json_reads[0] == batch_bytes
    assert sum(json_reads) < 1.5 * batch_bytes, (
        f"{sum(json_reads) / batch_bytes:.2f} x the batch in {len(json_reads)} reads"
    )


def test_integer_property_out_of_int64_range_is_a_type_mismatch_not_a_crash():
    rows = decode([GOOD, feature(point(1, 2), population=2**64)])
    assert_valid(rows[0])
    assert rows[1][REJECT_REASON] == Reason.PROPERTY_TYPE_MISMATCH
    assert "properties.population" in rows[1][REJECT_DETAIL]


def test_huge_numeric_id_does_not_crash_the_batch():
    rows = decode([GOOD, feature(point(1, 2), fid=10**400)])
    assert_valid(rows[0])
    assert rows[1][REJECT_REASON] in (None, Reason.PROPERTY_TYPE_MISMATCH)


def test_invalid_utf8_in_one_document_rejects_only_that_document():
    latin1 = (
        b'{"type":"Feature","id":"u","geometry":{"type":"Point","coordinates":[1,2]},"properties":{"name":"caf\xe9"}}'
    )
    rows = decode([GOOD, latin1, GOOD])
    assert rows[1][REJECT_REASON] == Reason.MALFORMED_JSON
    assert_valid(rows[0])
    assert_valid(rows[2])


def test_lone_surrogate_escape_in_a_property_rejects_only_that_document():
    surrogate = (
        b'{"type":"Feature","id":"s","geometry":{"type":"Point","coordinates":[1,2]},"properties":{"kind":"\\ud800"}}'
    )
    rows = decode([GOOD, surrogate])
    assert_valid(rows[0])
    assert rows[1][REJECT_REASON] in (Reason.MALFORMED_JSON, Reason.PROPERTY_TYPE_MISMATCH)


def test_a_batch_of_mostly_bad_documents_costs_few_block_reads(monkeypatch):
    # Each refusal of the block reader used to cost block reads of its own: a batch of bad
    # records decoded a hundred times slower than a good one, and a flood of them stalled the
    # stream. The refused documents are read one by one, and the block reads stay few (their count
    # is what a timing would measure, without the machine's load in it).
    n = 10_000
    mostly_bad = kafka_batch([GOOD if i % 3 == 0 else feature(point(1, 2), speed="fast") for i in range(n)])
    reads = []
    read_json = pa_json.read_json
    monkeypatch.setattr(pa_json, "read_json", lambda *a, **k: reads.append(1) or read_json(*a, **k))

    assert Decoder(DEMO).decode(mostly_bad).column(REJECT_REASON).null_count == (n + 2) // 3
    assert len(reads) <= n // 100, f"{len(reads)} block reads for {n} documents, two thirds of them refused"
