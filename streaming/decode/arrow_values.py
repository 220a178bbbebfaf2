"""Arrow arrays a columnar reader read in its format's own types (an Avro int as int32, a decimal
as decimal128 of the schema's precision, a record as a struct, a union of several types as a struct
of its branches) as a column's data-file type, nested or not.

Where every part of the read type converts to the column's type as `python_values` converts the
same value (an int into a long column, a float into a double, a record's members by name, a list's
elements and a map's values one level down), the whole array is converted by Arrow's casts at once.
Anything else, and any array holding a value that does not fit (an integer out of range, a decimal
with too many digits, a required member left null), is converted value by value by
`python_values.to_arrow`, which names the path of each value that does not fit: a batch converts
alike either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming.contract.types import arrow_type_holds
from streaming.decode.json_values import is_uuid
from streaming.decode.python_values import Problem, _required_left_null, to_arrow
from streaming.kernels.buffers import from_zero_offsets, offsets_with_nulls
from streaming.kernels.text_encodings import hex_decode

# A struct whose members are all named so holds one value of a union of several types: the member
# of the branch a record holds is set, the others null.
UNION_BRANCH = "union.branch."


class _Indirect(Exception):
    """A part of the read type that does not convert to its column's type by a cast."""


def is_union(kind: pa.DataType) -> bool:
    return pa.types.is_struct(kind) and kind.num_fields > 0 and all(f.name.startswith(UNION_BRANCH) for f in kind)


def union_of(branches: list[pa.Array], mask: np.ndarray | None) -> pa.Array:
    """The struct that holds a union's values: `branches[b]` set where a record holds branch b."""
    fields = [pa.field(f"{UNION_BRANCH}{b}", array.type) for b, array in enumerate(branches)]
    return pa.StructArray.from_arrays(branches, fields=fields, mask=None if mask is None else pa.array(mask))


def fit(read: pa.Array, kind: pa.DataType, path: str) -> tuple[pa.Array, list[Problem]]:
    """`read` as an array of `kind`, and (index, problem naming the path) of each value that does not
    fit, null in the array."""
    try:
        out = _cast(read, kind)
    except (_Indirect, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    else:
        if not _required_left_null(out):
            return out, []
    return to_arrow([_python(v, read.type) for v in read.to_pylist()], kind, path)


def _python(value: Any, kind: pa.DataType) -> Any:
    """A value of `read.to_pylist()` as the general readers give it: a union's value is its branch's."""
    if value is None:
        return None
    if is_union(kind):
        for f in kind:
            if value[f.name] is not None:
                return _python(value[f.name], f.type)
        return None
    if pa.types.is_struct(kind) and _holds_union(kind):
        return {f.name: _python(value[f.name], f.type) for f in kind}
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and _holds_union(kind.value_type):
        return [_python(v, kind.value_type) for v in value]
    if pa.types.is_map(kind) and _holds_union(kind.item_type):
        return [(k, _python(v, kind.item_type)) for k, v in value]
    return value


def _holds_union(kind: pa.DataType) -> bool:
    return arrow_type_holds(kind, is_union)


def _cast(read: pa.Array, kind: pa.DataType) -> pa.Array:
    source = read.type
    if pa.types.is_null(source):
        return pa.nulls(len(read), kind)
    if is_union(source):
        return _union(read, kind)
    if pa.types.is_struct(kind):
        if not pa.types.is_struct(source):
            raise _Indirect
        names = {f.name for f in source}
        children = [
            _cast(pc.struct_field(read, f.name), f.type) if f.name in names else pa.nulls(len(read), f.type)
            for f in kind
        ]
        mask = read.is_null() if read.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(kind), mask=mask)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if not (pa.types.is_list(source) or pa.types.is_large_list(source)):
            raise _Indirect
        whole = from_zero_offsets(read)
        values = _cast(whole.values, kind.value_type)
        mask = whole.is_null() if whole.null_count else None
        return pa.ListArray.from_arrays(whole.offsets, values, type=pa.list_(kind.value_field), mask=mask)
    if pa.types.is_map(kind):
        if not (pa.types.is_map(source) and pa.types.is_string(source.key_type) and pa.types.is_string(kind.key_type)):
            raise _Indirect
        whole = from_zero_offsets(read)
        items = _cast(whole.items, kind.item_type)
        return pa.MapArray.from_arrays(offsets_with_nulls(whole), whole.keys, items, type=kind)
    if source == kind:
        return read
    if is_uuid(kind):
        if not pa.types.is_string(source):
            raise _Indirect
        return _uuids(read, kind)
    if not _castable(source, kind):
        raise _Indirect
    return read.cast(kind)  # safe: a value out of range or losing digits raises, and goes value by value


def _union(read: pa.Array, kind: pa.DataType) -> pa.Array:
    """Each branch converted, then the one a record holds taken."""
    branches = [_cast(read.field(i), kind) for i in range(read.type.num_fields)]
    out = pc.coalesce(*branches) if len(branches) > 1 else branches[0]
    return out if not read.null_count else pc.if_else(read.is_null(), pa.nulls(len(read), kind), out)


def _uuids(read: pa.Array, kind: pa.DataType) -> pa.Array:
    decoded, hexadecimal = hex_decode(pc.replace_substring(read, "-", ""))
    valid = pc.is_valid(read).to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.binary_length(decoded), 0).to_numpy(zero_copy_only=False)
    if (valid & ~(hexadecimal & (lengths == 16))).any():
        raise _Indirect
    return pc.if_else(pa.array(valid), decoded, pa.nulls(len(read), pa.binary())).cast(pa.binary(16)).cast(kind)


def _castable(source: pa.DataType, kind: pa.DataType) -> bool:
    """Whether Arrow's safe cast of `source` to `kind` converts each value as `python_values` does."""
    t = pa.types
    if t.is_integer(source):
        return t.is_integer(kind) or t.is_floating(kind) or t.is_decimal(kind) or t.is_string(kind)
    if t.is_floating(source):
        return t.is_floating(kind) or t.is_integer(kind)
    if t.is_boolean(source):
        return t.is_floating(kind)
    if t.is_string(source):
        return t.is_binary(kind) or t.is_large_string(kind)
    if t.is_fixed_size_binary(source):
        return t.is_binary(kind)
    if t.is_decimal(source):
        return t.is_decimal(kind)
    if t.is_time(source):
        return t.is_time(kind)
    if t.is_timestamp(source):
        return t.is_timestamp(kind) and (source.tz is None or source.tz == "UTC")
    return False
