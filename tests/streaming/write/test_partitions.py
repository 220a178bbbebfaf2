"""The partition of each row, against Iceberg's own transforms (pyiceberg's, value by value)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    MonthTransform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import LongType, StringType, TimestamptzType

from streaming.contract.terms import MAX_PARTITIONS_PER_BATCH
from streaming.write.partitions import (
    LayoutField,
    PartitionLayout,
    PartitionLimitError,
    partition_path,
    split_by_partition,
)

MICROS = [0, -1, 1_764_028_800_000_000, 1_764_028_800_000_000 + 3_599_999_999, 951_782_400_000_000, None]
ROWS = pa.table(
    {
        "t": pa.array(MICROS, pa.timestamp("us", tz="UTC")),
        "s": pa.array(["alpha", "al", None, "beta", "b", "alpha"]),
        "n": pa.array([7, -7, 0, 12, None, 100], pa.int64()),
        "row": pa.array(range(6)),
    }
)


def partitions_of(*fields: LayoutField) -> dict[int, tuple]:
    """row number -> its partition values."""
    out = {}
    for values, rows in split_by_partition(ROWS, PartitionLayout(1, fields)):
        for row in rows.column("row").to_pylist():
            out[row] = values
    return out


def expected(transform, source_type, column) -> list:
    apply = transform.transform(source_type)
    return [None if v is None else apply(v) for v in column]


def test_time_transforms_are_icebergs():
    for name, transform in (
        ("day", DayTransform()),
        ("hour", HourTransform()),
        ("month", MonthTransform()),
        ("year", YearTransform()),
    ):
        got = partitions_of(LayoutField(1000, f"t_{name}", name, None, "t", "timestamptz"))
        assert [got[i][0] for i in range(6)] == expected(transform, TimestamptzType(), MICROS), name


def test_bucket_and_truncate_are_icebergs():
    strings, numbers = ROWS.column("s").to_pylist(), ROWS.column("n").to_pylist()
    got = partitions_of(
        LayoutField(1000, "s_bucket_8", "bucket", 8, "s", "string"),
        LayoutField(1001, "n_bucket_3", "bucket", 3, "n", "long"),
        LayoutField(1002, "s_trunc_2", "truncate", 2, "s", "string"),
        LayoutField(1003, "n_trunc_10", "truncate", 10, "n", "long"),
    )
    assert [got[i][0] for i in range(6)] == expected(BucketTransform(8), StringType(), strings)
    assert [got[i][1] for i in range(6)] == expected(BucketTransform(3), LongType(), numbers)
    assert [got[i][2] for i in range(6)] == expected(TruncateTransform(2), StringType(), strings)
    assert [got[i][3] for i in range(6)] == expected(TruncateTransform(10), LongType(), numbers)


def test_the_split_keeps_the_row_order_within_each_partition_and_names_folders():
    layout = PartitionLayout(1, (LayoutField(1000, "t_day", "day", None, "t", "timestamptz"),))
    parts = list(split_by_partition(ROWS, layout))
    for _, rows in parts:
        order = rows.column("row").to_pylist()
        assert order == sorted(order)
    assert sum(rows.num_rows for _, rows in parts) == ROWS.num_rows
    assert partition_path(layout, (20417,)) == "t_day=2025-11-25"
    assert partition_path(layout, (None,)) == "t_day=null"


def test_rows_in_more_partitions_than_a_batch_may_write_are_refused_naming_the_field():
    """An identity field has no bound the contract can check in advance: the split refuses."""
    n = MAX_PARTITIONS_PER_BATCH + 1
    rows = pa.table({"id": pa.array([f"e{i}" for i in range(n)]), "kind": pa.array(["a", "b"] * (n // 2) + ["a"])})
    layout = PartitionLayout(
        1,
        (
            LayoutField(1000, "kind", "identity", None, "kind", "string"),
            LayoutField(1001, "id", "identity", None, "id", "string"),
        ),
    )
    with pytest.raises(
        PartitionLimitError,
        match=r"^partition field id \(identity of id\): these rows fall in 100,001 partitions \(100,001 values of id\), more than 100,000 per batch",
    ):
        list(split_by_partition(rows, layout))
    assert len(list(split_by_partition(rows.slice(0, 1_000), layout))) == 1_000
