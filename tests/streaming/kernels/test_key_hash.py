"""The key hash that routes an upsert batch's versions to their reducer, on hard-coded values: equal
keys hash alike wherever they sit in an array and whatever its chunks, and the values stay the
same from one release to the next (executors of two releases would route a key apart)."""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pytest

from streaming.kernels.key_hash import key_hashes


def test_the_hashes_of_text_keys_are_fixed():
    assert key_hashes([pa.array(["k1", "k2", ""])]).tolist() == [
        14839274331584283345,
        16174033783883629238,
        0,
    ]


def test_equal_keys_hash_alike_wherever_they_sit_and_whatever_the_chunks():
    values = ["a", "bb", "a", "ccc", "bb"]
    whole = key_hashes([pa.array(values)])
    assert whole[0] == whole[2] and whole[1] == whole[4] and len(set(whole.tolist())) == 3
    assert key_hashes([pa.array(values).slice(2)]).tolist() == whole[2:].tolist(), "an array's offset is read"
    chunked = pa.chunked_array([pa.array(values[:3]), pa.array(values[3:])])
    assert key_hashes([chunked]).tolist() == whole.tolist()
    assert key_hashes([pa.array(values, pa.large_string())]).tolist() == whole.tolist()
    assert key_hashes([pa.array(values).dictionary_encode()]).tolist() == whole.tolist()


def test_binary_keys_hash_their_bytes_utf8_or_not():
    binary = key_hashes([pa.array([b"\xff\x00\x80", b"k1"], pa.binary())])
    assert binary[1] == key_hashes([pa.array(["k1"])])[0], "text hashes as its UTF-8 bytes"
    assert binary[0] != binary[1]
    assert key_hashes([pa.array([b"ab"], pa.binary(2))]).tolist() == key_hashes([pa.array(["ab"])]).tolist()


def test_the_place_of_each_byte_counts():
    hashed = key_hashes([pa.array(["ab", "ba", "abc", "cba"])])
    assert len(set(hashed.tolist())) == 4


def test_keys_of_several_columns_combine_in_order():
    a, b = pa.array(["x", "y", "x"]), pa.array([1, 1, 1])
    hashed = key_hashes([a, b])
    assert hashed[0] == hashed[2] and hashed[0] != hashed[1]
    assert key_hashes([b, a]).tolist() != hashed.tolist(), "the columns' order is part of the key"
    assert key_hashes([pa.array(["x\x1f1"])])[0] != hashed[0]


def test_fixed_width_keys():
    ints = key_hashes([pa.array([7, 7, -7], pa.int64())])
    assert ints[0] == ints[1] != ints[2]
    assert key_hashes([pa.array([7], pa.int32())]).tolist() == ints[:1].tolist(), "a key's width does not route it"
    assert key_hashes([pa.array([0.0, -0.0])]).tolist()[0] == key_hashes([pa.array([-0.0])]).tolist()[0]
    days = key_hashes([pa.array([datetime.date(2024, 1, 1), datetime.date(2024, 1, 1), datetime.date(2024, 1, 2)])])
    assert days[0] == days[1] != days[2]
    assert key_hashes([pa.array([True, False, True])]).tolist()[0] == key_hashes([pa.array([True])]).tolist()[0]


def test_a_null_hashes_apart_from_every_value():
    hashed = key_hashes([pa.array(["", None, "x"])])
    assert len(set(hashed.tolist())) == 3


def test_keys_spread_evenly_over_buckets():
    keys = pa.array([f"key-{i}" for i in range(64_000)])
    counts = np.bincount((key_hashes([keys]) % np.uint64(64)).astype(np.int64), minlength=64)
    assert counts.min() > 800 and counts.max() < 1_200


def test_a_column_of_another_type_is_refused_naming_it():
    with pytest.raises(TypeError, match="list<item: int64>"):
        key_hashes([pa.array([[1]])])
