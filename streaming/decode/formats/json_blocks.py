"""A batch of JSON documents read in blocks by pyarrow's JSON reader, the documents a block read
refuses read one by one: the loop the GeoJSON and the JSON-fields formats share."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Where pyarrow's JSON reader names the document it refused.
ROW_IN_ERROR = re.compile(r"in row (\d+)")

# read_block(lo, hi): the documents lo..hi-1 as a table, or None and the index (from lo) of the
# document the reader refused (None: it named none).
ReadBlock = Callable[[int, int], tuple[pa.Table | None, int | None]]


def read_in_blocks(
    n: int,
    read_block: ReadBlock,
    add_block: Callable[[pa.Table], None],
    one_by_one: Callable[[int, int], None],
    min_block: int,
    max_run: int,
    readable: bool = True,
) -> None:
    """Read documents 0..n-1: whole blocks while the reader takes them (doubling the block after a
    success), the rows before a refused one as a block, the refused one alone, and after it a run of
    rows one by one, longer while refusals keep coming: a batch of bad documents costs about what
    reading them one by one costs, never a block read per document. Not `readable` (the reader
    cannot read what the columns ask for, a map): every document one by one."""
    if not readable:
        one_by_one(0, n)
        return
    lo, window, run = 0, n, 0
    while lo < n:
        hi = min(n, lo + window)
        table, refused = read_block(lo, hi)
        if table is not None:
            add_block(table)
            lo, window, run = hi, 2 * window, 0
        elif refused is None:  # no row named (a value holding several documents): smaller blocks
            if hi - lo > min_block:
                window = (hi - lo) // 2
            else:
                one_by_one(lo, hi)
                lo = hi
        elif refused >= min_block:
            prefix, _ = read_block(lo, lo + refused)
            if prefix is not None:
                add_block(prefix)
            else:
                one_by_one(lo, lo + refused)
            one_by_one(lo + refused, lo + refused + 1)
            lo, window, run = lo + refused + 1, 2 * refused, 0
        else:
            run = min(2 * run or min_block, max_run)
            stop = min(n, lo + refused + 1 + run)
            one_by_one(lo, stop)
            lo, window = stop, min_block


def has_line_break(docs: pa.Array) -> bool:
    """Whether any document holds a CR or LF: one pass over the bytes, without a kernel call per
    document (most batches have none, and then the searches for them are skipped)."""
    if len(docs) == 0:
        return False
    binary = docs.cast(pa.binary())
    offsets = np.frombuffer(binary.buffers()[1], dtype=np.int32)
    data = binary.buffers()[2]
    if data is None:
        return False
    start, stop = offsets[binary.offset], offsets[binary.offset + len(binary)]
    chars = np.frombuffer(data, dtype=np.uint8)[start:stop]
    return bool(np.any((chars == 0x0A) | (chars == 0x0D)))


def one_per_line(docs: pa.Array) -> pa.Array:
    """The documents with their line breaks made spaces, for the block readers that split
    documents on them: called once the breaks inside strings are refused, so the ones left lie
    between tokens, where they are whitespace."""
    if not has_line_break(docs):
        return docs
    return pc.replace_substring(pc.replace_substring(docs, "\n", " "), "\r", " ")
