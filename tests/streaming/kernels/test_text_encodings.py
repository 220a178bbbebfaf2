"""Hexadecimal and base64 texts to bytes over whole arrays, against the standard library's decoders."""

from __future__ import annotations

import base64
import binascii

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.kernels.text_encodings import base64_decode, hex_decode


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), st.text(alphabet="0123456789abcdefABCDEF+/=x", max_size=20))))
def test_hex_and_base64_decoding_agree_with_binascii(items):
    texts = [
        item
        if isinstance(item, str)
        else (binascii.hexlify(item).decode() if len(item) % 2 else base64.b64encode(item).decode())
        for item in items
    ]
    array = pa.array(texts, pa.string())
    for decode_all, reference in (
        (hex_decode, lambda t: binascii.unhexlify(t) if t else None),
        (base64_decode, lambda t: binascii.a2b_base64(t, strict_mode=True) if t and len(t) % 4 == 0 else None),
    ):
        decoded, ok = decode_all(array)
        for text, got, fine in zip(texts, decoded.to_pylist(), ok):
            try:
                expected = reference(text)
            except (binascii.Error, ValueError):
                expected = None
            if expected is None:
                assert not fine, (decode_all.__name__, text)
            else:
                assert fine and got == expected, (decode_all.__name__, text, got, expected)
