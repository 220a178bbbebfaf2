import numpy as np

from streaming.kernels.varint import unzigzag, varints, words_at

# (bytes, the integer they spell): one to ten bytes, and the edges of each length
CASES = [
    (b"\x00", 0),
    (b"\x01", 1),
    (b"\x7f", 127),
    (b"\x80\x01", 128),
    (b"\xff\x7f", 16383),
    (b"\x80\x80\x01", 16384),
    (b"\xac\x02", 300),
    (b"\xff\xff\xff\xff\x0f", 2**32 - 1),
    (b"\xff\xff\xff\xff\xff\xff\xff\x7f", 2**56 - 1),
    (b"\x80\x80\x80\x80\x80\x80\x80\x80\x01", 2**56),
    (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 2**64 - 1),
]


def test_each_integer_of_up_to_8_bytes_is_read_with_its_length():
    data = np.frombuffer(b"".join(b for b, _ in CASES) + bytes(8), dtype=np.uint8)
    starts = np.cumsum([0] + [len(b) for b, _ in CASES[:-1]])
    raw, n_bytes = varints(words_at(data)[starts])
    assert n_bytes.tolist() == [len(b) if len(b) <= 8 else 0 for b, _ in CASES]
    short = n_bytes > 0
    assert raw[short].tolist() == [v for b, v in CASES if len(b) <= 8]


def test_zigzag_alternates_signs_up_to_the_extremes():
    raw = np.array([0, 1, 2, 3, 4294967294, 2**64 - 2, 2**64 - 1], dtype=np.uint64)
    assert unzigzag(raw).tolist() == [0, -1, 1, -2, 2147483647, 2**63 - 1, -(2**63)]
