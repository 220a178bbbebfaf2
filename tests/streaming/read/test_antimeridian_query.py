"""Window queries near, away from and across the anti-meridian against the brute force, on a
table the project's pieces build (decoder, writer, fast append; SQL catalog, no Spark)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from streaming.contract import Contract, load_contract
from streaming.decode.decoder import REJECT_REASON, Decoder
from streaming.read.predicate import Predicate, parse_bbox
from streaming.read.query import query, query_bbox
from tests.antimeridian_data import events, expected_ids, feature_json, windows
from tests.streaming.read.test_query import CONTRACT_PATH, _append, _catalog, _create_table, _kafka_batch

DATA = events(np.random.default_rng(35), crossing=200, plain=200, points=400)


def _table(root, contract: Contract):
    catalog = _catalog(root)
    table = _create_table(catalog, contract)
    decoded = Decoder(contract).decode(
        _kafka_batch([e.encode() for e, _, _ in DATA], [feature_json(e, g) for e, g, _ in DATA])
    )
    rows = pa.Table.from_batches([decoded])
    assert rows.column(REJECT_REASON).null_count == len(DATA)
    _append(table, contract, rows.drop_columns([c for c in rows.column_names if c.startswith("_") and c != "_hilbert"]))
    return catalog.load_table(contract.table)


@pytest.fixture(scope="module")
def short_table(tmp_path_factory):
    return _table(tmp_path_factory.mktemp("short"), load_contract(CONTRACT_PATH))


def test_windows_on_both_sides_and_across_match_the_brute_force(short_table):
    for window in windows(np.random.default_rng(7), 30):
        result = query_bbox(short_table, window)
        ids = result.table.column("event_id").to_pylist()
        assert len(ids) == len(set(ids))
        assert set(ids) == expected_ids(DATA, window), window


def test_the_gulf_of_guinea_holds_no_pacific_line_and_wrapped_boxes_are_stored(short_table):
    guinea = query_bbox(short_table, (0.0, -5.0, 10.0, 5.0))
    assert set(guinea.table.column("event_id").to_pylist()) == expected_ids(DATA, (0, -5, 10, 5))
    assert not any(e.startswith(("x", "l")) for e in guinea.table.column("event_id").to_pylist())
    assert guinea.stats.files_scanned == 1  # the file of wrapped rows is not read
    rows = query_bbox(short_table, (-180.0, -90.0, 180.0, 90.0)).table
    bbox = rows.column("bbox").combine_chunks()
    wrapped = pc.greater(bbox.field("xmin"), bbox.field("xmax"))
    crossing = {e for e, _, c in DATA if c}
    assert set(rows.filter(wrapped).column("event_id").to_pylist()) == crossing


def test_a_window_across_needs_a_short_way_table(tmp_path):
    assert parse_bbox("179,-5,-179,5") == (179.0, -5.0, -179.0, 5.0)
    with pytest.raises(ValueError, match="within \\[-180, 180\\]"):
        parse_bbox("179,-5,-190,5")
    contract = load_contract(CONTRACT_PATH)
    planar = dataclasses.replace(contract, geometry=dataclasses.replace(contract.geometry, antimeridian="planar"))
    table = _create_table(_catalog(tmp_path), planar)
    with table.transaction() as tx:  # the property holds the contract's source: say planar there too
        source = dict(planar.source, geometry={**planar.source["geometry"], "antimeridian": "planar"})
        tx.set_properties({"geoingest.contract": json.dumps(source)})
    with pytest.raises(ValueError, match="short way"):
        query_bbox(table, (179.0, -5.0, -179.0, 5.0))
    assert Predicate.from_bbox((179.0, -5.0, -179.0, 5.0)).x_intervals() == [(179.0, 180.0), (-180.0, -179.0)]


def test_contains_and_within_read_wrapped_rows_the_short_way(short_table):
    import shapely

    from tests.antimeridian_data import _pieces

    boxes = [(e, g) for e, g, crosses in DATA if crosses and g["type"] == "Polygon"]
    for event_id, geometry in boxes[:5]:
        (x0, y), (x1, _) = geometry["coordinates"][0][0], geometry["coordinates"][0][1]
        for qx in ((x0 + 180.0) / 2, (x1 - 180.0) / 2):  # inside, east then west of ±180
            q = shapely.box(qx - 1e-4, y + 0.1, qx + 1e-4, y + 0.2)
            found = set(query(short_table, Predicate("contains", q)).table.column("event_id").to_pylist())
            expected = {
                e for e, g, c in DATA if g["type"] == "Polygon" and shapely.union_all(_pieces(g, c)).contains(q)
            }
            assert event_id in found and found == expected
    whole = shapely.box(-180, -90, 180, 90)
    within = set(query(short_table, Predicate("within", whole)).table.column("event_id").to_pylist())
    assert within == {e for e, _, _ in DATA}


def test_inspect_draws_a_file_of_wrapped_rows_on_both_sides(short_table, tmp_path):
    from streaming.read.inspect import file_extents, plot_file_extents

    layout = file_extents(short_table)
    wrapped = [f.bbox for f in layout.files if f.bbox is not None and f.bbox[0] > f.bbox[2]]
    assert len(wrapped) == 1
    assert layout.data_extent is not None and layout.data_extent[0] == -180.0 and layout.data_extent[2] == 180.0
    assert plot_file_extents(layout, tmp_path / "files.png").stat().st_size > 0


def test_a_result_across_the_antimeridian_is_written_with_a_wrapped_geo_bbox(short_table, tmp_path):
    from streaming.read.output import write_geoparquet
    from streaming.read.query import table_contract

    result = query_bbox(short_table, (179.0, -5.0, -179.0, 5.0))
    metadata = write_geoparquet(result, table_contract(short_table), tmp_path / "across.parquet")
    xmin, _, xmax, _ = metadata["columns"]["geometry"]["bbox"]
    assert xmin > 170 > -170 > xmax  # wrapped: the rows lie within a few degrees of ±180
