"""Equality deletes as `geoingest query` and compaction apply them (streaming/table/deletes.py), on
hard-coded keys: real delete files written by the ingest's writer into a table of a real SQLite
catalog, read back by their manifest fields (path, equality field ids, sequence number)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from streaming.contract import Contract, parse_contract
from streaming.storage import data_location
from streaming.table.catalog import create_table, unpartitioned_spec_id
from streaming.table.commit import to_data_file
from streaming.table.deletes import EqualityDeletes, PlannedFile
from streaming.write.upsert import equality_field_ids, write_equality_deletes

DEMO = json.loads((Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json").read_text())


def upsert_contract(**columns: str) -> Contract:
    """The demo contract in upsert mode, keyed on `columns` (name -> type; the first from the Kafka
    key, the others from properties of their names), which replace event_id."""
    keys = [
        {"name": name, "type": kind, "required": True, "from": ["kafka.key" if i == 0 else f"properties.{name}"]}
        for i, (name, kind) in enumerate(columns.items())
    ]
    others = [c for c in DEMO["columns"] if c["name"] != "event_id"]
    # A new table's ids run 1..n in declaration order, then the geometry's and the bbox's.
    listed = [{**c, "id": i} for i, c in enumerate(keys + others, start=1)]
    n = len(listed)
    return parse_contract(
        {
            **DEMO,
            "mode": "upsert",
            "primary_key": list(columns),
            "columns": listed,
            "geometry": {**DEMO["geometry"], "id": n + 1},
            "bbox": {**DEMO["bbox"], "id": n + 2},
        }
    )


def deletes_of(catalog, contract: Contract, listed: pa.Table, sequence_number: int) -> EqualityDeletes:
    """The keys of `listed` as one equality delete file of `sequence_number`, as a batch writes it."""
    table, _ = create_table(catalog, contract)
    record = write_equality_deletes(listed, contract, table.io, dict(table.properties), data_location(table), "t")
    spec_id = unpartitioned_spec_id(table)
    assert spec_id is not None
    data_file = to_data_file(record, spec_id, equality_field_ids(contract))
    return EqualityDeletes(table, [PlannedFile(data_file, sequence_number)])


def test_binary_keys_that_are_not_text_are_deleted_by_value(catalog):
    contract = upsert_contract(device="binary")
    listed = pa.table({"device": pa.array([b"\xff\x00", b"\x80a", b"\xc3"], pa.binary())})
    deletes = deletes_of(catalog, contract, listed, sequence_number=2)
    rows = pa.table(
        {
            "device": pa.array([b"\xff\x00", b"\xff\x01", b"\x80a", b"ok", b"\xc3\xa9", b"\xc3"], pa.binary()),
            "speed": pa.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        }
    )

    live = deletes.live(rows, sequence_number=1)

    assert live.column("device").to_pylist() == [b"\xff\x01", b"ok", b"\xc3\xa9"]
    assert live.column("speed").to_pylist() == [2.0, 4.0, 5.0], "the survivors keep their order"
    assert deletes.live(rows, sequence_number=2).num_rows == 6, "a delete never reaches its own batch's rows"


def test_keys_of_two_columns_whose_joined_text_is_equal_stay_apart(catalog):
    contract = upsert_contract(zone="string", label="string")
    # ("x\x1fy", "z") and ("x", "y\x1fz") are different keys that joined with "\x1f" read the same.
    listed = pa.table({"zone": ["x\x1fy", "b"], "label": ["z", "a"]})
    deletes = deletes_of(catalog, contract, listed, sequence_number=5)
    rows = pa.table(
        {
            "zone": ["x", "x\x1fy", "a", "x\x1fy", "b", "x"],
            "label": ["y\x1fz", "z", "b", "q", "a", "y\x1fz"],
            "speed": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        }
    )

    live = deletes.live(rows, sequence_number=4)

    assert live.column("speed").to_pylist() == [0.0, 2.0, 3.0, 5.0]
    assert len(deletes) == 2


@pytest.mark.parametrize("chunks", [1, 7])
def test_rows_of_a_composite_key_keep_their_order_whatever_the_chunks(catalog, chunks):
    """The semi-join answers in no set order: the rows kept must still come in the file's order."""
    contract = upsert_contract(zone="string", seq="long")
    listed = pa.table({"zone": [f"z{i % 5}" for i in range(0, 300, 3)], "seq": pa.array(range(0, 300, 3), pa.int64())})
    deletes = deletes_of(catalog, contract, listed, sequence_number=9)
    n = 3_000
    zones, seqs = [f"z{i % 5}" for i in range(n)], [(i * 7919) % 400 for i in range(n)]
    rows = pa.Table.from_batches(
        pa.table(
            {"zone": zones, "seq": pa.array(seqs, pa.int64()), "speed": pa.array(range(n), pa.float64())}
        ).to_batches(max_chunksize=-(-n // chunks))
    )
    listed_keys = set(zip(listed.column("zone").to_pylist(), listed.column("seq").to_pylist()))

    live = deletes.live(rows, sequence_number=8)

    expected = [float(i) for i in range(n) if (zones[i], seqs[i]) not in listed_keys]
    assert 0 < len(expected) < n
    assert live.column("speed").to_pylist() == expected
