import pyarrow as pa
import pytest

from streaming.decode.formats.json_blocks import has_line_break, one_per_line

DOCS = ['{"a": 1}', '{"a":\n 2}', '{"a": 3}', '{"a":\r\n4}', '{"a": 5}']


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [(0, 1, False), (0, 2, True), (2, 3, False), (2, 4, True), (4, 5, False), (0, 0, False)],
)
def test_a_line_break_is_found_only_in_the_documents_of_a_slice(lo, hi, expected):
    docs = pa.array(DOCS, pa.string()).slice(lo, hi - lo)
    assert has_line_break(docs) is expected
    assert has_line_break(docs.cast(pa.binary())) is expected


def test_line_breaks_become_spaces_and_documents_without_them_are_left_as_they_are():
    docs = pa.array(DOCS, pa.string())
    assert one_per_line(docs).to_pylist() == ['{"a": 1}', '{"a":  2}', '{"a": 3}', '{"a":  4}', '{"a": 5}']
    clean = docs.slice(2, 1)
    assert one_per_line(clean) is clean
