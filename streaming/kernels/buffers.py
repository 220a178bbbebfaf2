"""Arrow arrays as numpy views and back: the few helpers every step of the decoder shares."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# None as numpy reads it in np.equal(a, None) or np.where(c, a, None); numpy's stubs do not take a
# bare None where they expect an array.
NONE = np.array(None, dtype=object)
NONE.flags.writeable = False


def offsets_and_bytes(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary array's n + 1 value offsets and its data bytes, as numpy views (no copy)."""
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset : values.offset + len(values) + 1]
    data_buffer = values.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return offsets, data


def scatter(partial: pa.Array, rows: np.ndarray, n: int) -> pa.Array:
    """A length-n array holding partial[i] at rows[i] and null elsewhere."""
    positions = np.full(n, len(partial), dtype=np.int64)
    positions[rows] = np.arange(len(rows))
    padded = pa.concat_arrays([partial, pa.nulls(1, partial.type)])
    return padded.take(pa.array(positions))


def scatter_into(base: pa.Array, partial: pa.Array, rows: np.ndarray) -> pa.Array:
    """`base` with partial[i] at rows[i]."""
    if len(rows) == len(base) and (len(rows) == 0 or (rows[0] == 0 and (np.diff(rows) == 1).all())):
        return partial.cast(base.type)  # every row, in order: a batch of one schema
    positions = np.arange(len(base), dtype=np.int64)
    positions[rows] = len(base) + np.arange(len(rows))
    return pa.concat_arrays([base, partial.cast(base.type)]).take(pa.array(positions))


def from_zero_offsets(values: pa.Array) -> pa.Array:
    """A list or map array whose offsets start at 0 (a slice's do not), as from_arrays wants them;
    copied into fresh buffers only when they do not."""
    if len(values) and values.offsets[0].as_py() != 0:
        return pa.concat_arrays([values])
    return values


def offsets_with_nulls(values: pa.Array) -> pa.Array:
    """A map array's offsets, null where the map is: MapArray.from_arrays takes its nulls from them."""
    if not values.null_count:
        return values.offsets
    nulls = pa.concat_arrays([values.is_null(), pa.array([False])])
    return pc.if_else(nulls, pa.nulls(len(values.offsets), values.offsets.type), values.offsets)


def lists_whole(data: pa.Table | pa.Array | pa.ChunkedArray) -> bool:
    """Whether every list (and map) in `data`, at any depth, holds all the values its offsets span:
    the structural check that Table.validate() skips and full validation pays every value for."""
    if isinstance(data, pa.Table):
        return all(lists_whole(column) for column in data.columns)
    if isinstance(data, pa.ChunkedArray):
        return not _holds_lists(data.type) or all(lists_whole(chunk) for chunk in data.chunks)
    if not _holds_lists(data.type):
        return True
    if isinstance(data, pa.StructArray):
        return all(lists_whole(data.field(i)) for i in range(data.type.num_fields))
    if isinstance(data, (pa.ListArray, pa.LargeListArray, pa.MapArray)):
        if len(data) and data.offsets[-1].as_py() > len(data.values):
            return False
        return lists_whole(data.values)
    return True


def _holds_lists(t: pa.DataType) -> bool:
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return True
    return pa.types.is_struct(t) and any(_holds_lists(f.type) for f in t)
