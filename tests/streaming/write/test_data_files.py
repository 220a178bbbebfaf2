"""GeoParquetWriter against a real Iceberg table (pyiceberg SQL catalog on SQLite, no Spark):
the data files are written the way the table's write.parquet.* properties ask."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import Table

from streaming.contract import Contract, load_contract
from streaming.decode.decoder import HILBERT, REJECT_REASON, Decoder
from streaming.table.catalog import create_table
from streaming.write.data_files import GeoParquetWriter, data_file_name, parquet_write_options, written_ms

CONTRACT_PATH = Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json"


@pytest.fixture
def contract() -> Contract:
    return load_contract(CONTRACT_PATH)


@pytest.fixture
def table(catalog, contract) -> Table:
    return create_table(catalog, contract)[0]


def sorted_points(contract: Contract, n: int = 50) -> pa.Table:
    values = [
        json.dumps(
            {
                "type": "Feature",
                "id": f"e{i}",
                "geometry": {"type": "Point", "coordinates": [2.0 + i * 0.01, 48.0 + i * 0.01]},
                "properties": {"kind": "probe", "speed": float(i)},
            }
        ).encode()
        for i in range(n)
    ]
    decoded = pa.Table.from_batches(
        [
            Decoder(contract).decode(
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
        ]
    )
    return decoded.filter(pc.is_null(decoded.column(REJECT_REASON))).sort_by(HILBERT)


def set_properties(table: Table, **properties: str) -> None:
    with table.transaction() as tx:
        tx.set_properties(properties)


def written_codecs(table: Table, contract: Contract) -> set[str]:
    writer = GeoParquetWriter(contract, table.properties, table.io.properties, table.location() + "/data", "t")
    records = list(writer.write(sorted_points(contract).to_batches()))
    assert records
    codecs = set()
    for record in records:
        metadata = pq.ParquetFile(record.path.removeprefix("file://")).metadata
        codecs |= {
            metadata.row_group(g).column(c).compression
            for g in range(metadata.num_row_groups)
            for c in range(metadata.num_columns)
        }
    return codecs


def test_a_new_table_is_written_with_zstd(table, contract):
    assert table.properties["write.parquet.compression-codec"] == "zstd"
    assert written_codecs(table, contract) == {"ZSTD"}


@pytest.mark.parametrize(
    ("codec", "level", "expected"),
    [
        ("snappy", None, "SNAPPY"),
        ("gzip", "9", "GZIP"),
        ("uncompressed", None, "UNCOMPRESSED"),
        ("zstd", "9", "ZSTD"),
    ],
)
def test_files_follow_the_codec_the_table_asks_for(table, contract, codec, level, expected):
    set_properties(
        table,
        **{"write.parquet.compression-codec": codec, **({"write.parquet.compression-level": level} if level else {})},
    )
    assert written_codecs(table, contract) == {expected}


def test_a_higher_zstd_level_writes_smaller_files(table, contract):
    def size_at(level: str) -> int:
        set_properties(table, **{"write.parquet.compression-level": level})
        writer = GeoParquetWriter(contract, table.properties, table.io.properties, table.location() + "/data", level)
        return sum(r.file_size_in_bytes for r in writer.write(sorted_points(contract, 2000).to_batches()))

    assert size_at("19") < size_at("1")


@pytest.mark.parametrize(
    ("properties", "named"),
    [
        ({"write.parquet.compression-codec": "nonsense"}, "write.parquet.compression-codec='nonsense'"),
        (
            {"write.parquet.compression-codec": "snappy", "write.parquet.compression-level": "3"},
            "write.parquet.compression-level=3",
        ),
        ({"write.parquet.compression-level": "high"}, "write.parquet.compression-level"),
    ],
)
def test_a_codec_the_writer_cannot_use_is_an_error_naming_the_property(properties, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        parquet_write_options(properties)


def test_a_data_file_name_carries_its_write_time():
    name = data_file_name("writer-a-b7", now_ms=1_795_600_000_123)
    assert name.startswith("writer-a-b7-t1795600000123-") and name.endswith(".parquet")
    assert written_ms(f"s3://bucket/wh/demo/events/data/event_time_day=2026-11-26/{name}") == 1_795_600_000_123
    assert data_file_name("p", now_ms=1) != data_file_name("p", now_ms=1), "unique for one writer and moment"
    # Names without a write time: files written before, or by another writer.
    assert written_ms("s3://bucket/data/writer-a-b7-0f1e2d3c4b5a69788796a5b4c3d2e1f0.parquet") is None
    assert written_ms("s3://bucket/data/00000-0-3f2a.parquet") is None
