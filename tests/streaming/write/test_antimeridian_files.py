"""Rows crossing the anti-meridian in data files: files of their own, a wrapped file bbox in the
`geo` metadata and manifest bounds that stay true bounds of every row."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.types import DoubleType

from streaming.contract import load_contract
from streaming.decode.decoder import HILBERT, REJECT_REASON, Decoder
from streaming.table.catalog import create_table
from streaming.write.data_files import WRAPPED_ROWS_KEY, GeoParquetWriter
from tests.streaming.write.test_data_files import CONTRACT_PATH


def decoded(contract, geometries: list[dict]) -> pa.Table:
    n = len(geometries)
    values = [json.dumps({"type": "Feature", "id": f"e{i}", "geometry": g}).encode() for i, g in enumerate(geometries)]
    batch = Decoder(contract).decode(
        pa.record_batch(
            {
                "key": pa.nulls(n, pa.binary()),
                "value": pa.array(values, pa.binary()),
                "topic": pa.array(["t"] * n),
                "partition": pa.array([0] * n, pa.int32()),
                "offset": pa.array(range(n), pa.int64()),
                "timestamp": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us")),
            }
        )
    )
    table = pa.Table.from_batches([batch])
    assert table.column(REJECT_REASON).null_count == n
    return table.sort_by(HILBERT)


def line(x0: float, x1: float, y: float) -> dict:
    return {"type": "LineString", "coordinates": [[x0, y], [x1, y + 0.5]]}


def point(x: float, y: float) -> dict:
    return {"type": "Point", "coordinates": [x, y]}


def test_wrapped_rows_are_written_apart_with_wrapped_file_bounds(catalog):
    contract = load_contract(CONTRACT_PATH)
    table = create_table(catalog, contract)[0]
    rows = decoded(
        contract,
        [line(179.5, -179.5, 1), line(179.0, -178.0, -3), point(179.9, 0), point(-179.9, 0), point(10, 10)],
    )
    writer = GeoParquetWriter(contract, table.properties, table.io.properties, table.location() + "/data", "t")
    records = list(writer.write(rows.to_batches()))
    assert sorted(r.record_count for r in records) == [2, 3]
    ids = contract.bbox_field_ids
    for record in records:
        parquet = pq.ParquetFile(record.path.removeprefix("file://"))
        meta = parquet.metadata.metadata
        geo_bbox = json.loads(meta[b"geo"])["columns"]["geometry"]["bbox"]
        stats = record.statistics()
        lower = {k: from_bytes(DoubleType(), stats["lower_bounds"][k]) for k in ids.values()}
        upper = {k: from_bytes(DoubleType(), stats["upper_bounds"][k]) for k in ids.values()}
        bbox = parquet.read().column("bbox").combine_chunks()
        # true bounds: every row's value lies between them
        for name in ("xmin", "ymin", "xmax", "ymax"):
            values = bbox.field(name)
            assert lower[ids[name]] <= pc.min(values).as_py() and upper[ids[name]] >= pc.max(values).as_py()
        if record.record_count == 2:  # the two lines across ±180
            assert meta[WRAPPED_ROWS_KEY.encode()] == b"2"
            assert geo_bbox == [179.0, -3.0, -178.0, 1.5]
            assert record.bbox == (179.0, -3.0, -178.0, 1.5)
            assert (lower[ids["xmin"]], upper[ids["xmax"]]) == (179.0, -178.0)
        else:
            assert meta[WRAPPED_ROWS_KEY.encode()] == b"0"
            assert geo_bbox == [-179.9, 0.0, 179.9, 10.0]


def test_wrapped_rows_whose_xmin_do_not_all_exceed_their_xmax_widen_to_the_world(catalog):
    contract = load_contract(CONTRACT_PATH)
    table = create_table(catalog, contract)[0]
    # two lines of 350 degrees the short way round: boxes (170, 160) and (-10, -20)
    long_ways = [[[170, 0], [-170, 0], [-10, 0], [160, 0]], [[-10, 1], [10, 1], [170, 1], [-170, 1], [-20, 1]]]
    rows = decoded(contract, [{"type": "LineString", "coordinates": c} for c in long_ways])
    bbox = rows.column("bbox").combine_chunks()
    assert sorted(zip(bbox.field("xmin").to_pylist(), bbox.field("xmax").to_pylist())) == [(-10, -20), (170, 160)]
    writer = GeoParquetWriter(contract, table.properties, table.io.properties, table.location() + "/data", "t")
    (record,) = list(writer.write(rows.to_batches()))
    stats = record.statistics()
    ids = contract.bbox_field_ids
    assert from_bytes(DoubleType(), stats["lower_bounds"][ids["xmin"]]) == -180.0
    assert from_bytes(DoubleType(), stats["upper_bounds"][ids["xmax"]]) == 180.0
    assert record.bbox[0] == -180.0 and record.bbox[2] == 180.0
