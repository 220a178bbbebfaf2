"""The Arrow buffer helpers the decoder shares, on arrays built by hand and by pyarrow's reader."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from streaming.kernels.buffers import from_zero_offsets, lists_whole, scatter_into


def read(ndjson: bytes) -> pa.Table:
    return pa_json.read_json(pa.BufferReader(ndjson), read_options=pa_json.ReadOptions(use_threads=False))


def test_lists_whole_passes_every_well_formed_nesting():
    table = pa.table(
        {
            "tags": pa.array([[None, "x"], None, []]),
            "deep": pa.array(
                [{"l": [[None, 1]], "m": [("k", 1)]}, None, {"l": [], "m": []}],
                pa.struct([("l", pa.list_(pa.list_(pa.int64()))), ("m", pa.map_(pa.string(), pa.int64()))]),
            ),
        }
    )
    assert lists_whole(table)
    assert lists_whole(table.slice(1)) and lists_whole(table.column("deep").chunk(0).slice(2))
    assert lists_whole(pa.array([1, 2]))


def test_lists_whole_finds_the_lists_pyarrows_reader_leaves_short():
    """apache/arrow#51305: a list led by nulls, read before its element type is known, loses them."""
    for broken in (
        b'{"tags":[null,"x"]}\n',
        b'{"a":{"b":[null,1.5]}}\n',
        b'{"t":null}\n{"t":[null,null]}\n{"t":["x"]}\n',
    ):
        table = read(broken)
        assert not lists_whole(table), broken
    assert lists_whole(read(b'{"tags":[1,null,2]}\n'))  # a null after the first value is kept


def test_from_zero_offsets_copies_only_a_slice_that_needs_it():
    lists = pa.array([[1], [2, 3], [4]])
    assert from_zero_offsets(lists) is lists
    moved = from_zero_offsets(lists.slice(1))
    assert moved.offsets.to_pylist() == [0, 2, 3] and moved.to_pylist() == [[2, 3], [4]]


def test_scatter_into_puts_each_value_at_its_row_whether_some_rows_or_all():
    base = pa.array([None, None, None, 4], pa.int64())
    assert scatter_into(base, pa.array([7, 8], pa.int32()), np.array([2, 0])).to_pylist() == [8, None, 7, 4]
    assert scatter_into(base, pa.array([1, 2, 3, 5], pa.int32()), np.arange(4)).to_pylist() == [1, 2, 3, 5]
    assert scatter_into(base, pa.array([1, 2, 3, 5]), np.array([3, 2, 1, 0])).to_pylist() == [5, 3, 2, 1]
