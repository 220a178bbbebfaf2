"""The GeoJSON properties no column maps: their names, the type their values have, and where they
were first seen. Under `schema_evolution: off` they are counted and logged; under `add-columns`
they become the table's new columns (streaming/write/evolution.py).

A block of documents is read at once by pyarrow's JSON reader, inferring every member. It refuses
a block whose members change type between documents (a property a number here and a string there,
Points beside Polygons); such a block is read document by document with json.loads.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from streaming.contract import Contract
from streaming.contract.types import primitive_type, promotes
from streaming.decode.formats.geojson_geometry import ndjson
from streaming.kernels.buffers import lists_whole

# Under `schema_evolution: off` the decoder looks for names in the first OFF_SAMPLE GeoJSON records
# of every OFF_SAMPLE_EVERY-th Arrow batch it decodes (the first included; 10,000 records a batch by
# default). Reading every record would cost about half the decode (bench/evolution.py), to count
# what the contract chose to ignore; a read has a fixed cost of about 1 ms, hence the spacing.
OFF_SAMPLE = 256
OFF_SAMPLE_EVERY = 4
# An object or an array whose type cannot be told (empty, all nulls, or elements of mixed kinds).
NESTED = "nested"
# A document with more brackets than this is read by json.loads, which fails cleanly at any depth:
# pyarrow's reader recurses once per level as it infers types and overflows the stack on very deep
# documents (100,000 levels crash it, 10,000 do not); brackets bound the depth from above.
MAX_BLOCK_BRACKETS = 1_000
_GEOMETRY_TYPE = r'"geometry"\s*:\s*\{\s*"type"\s*:\s*"(?P<type>[A-Za-z]+)"'
_PROPERTIES_ONLY = pa.schema([("properties", pa.struct([]))])


@dataclass(frozen=True)
class PropertySeen:
    """One property name in a set of records: the column type its values have ("long", "double",
    "boolean", "string", a struct or list as the contract spells it, in JSON text (`nested_kind`),
    or NESTED), how many records hold a value, and the first of them in Kafka order (timestamp,
    partition, offset)."""

    type: str
    count: int
    first: tuple[int, int, int]

    def merged(self, other: PropertySeen) -> PropertySeen:
        earlier, later = (self, other) if self.first <= other.first else (other, self)
        return PropertySeen(merged_kind(earlier.type, later.type), self.count + other.count, earlier.first)


def nested_kind(spelling: dict) -> str:
    """A struct or list type as the contract spells it (no ids), as PropertySeen holds it."""
    return json.dumps(spelling, separators=(",", ":"))


def spelling_of(kind: str) -> Any:
    """The contract's spelling of a PropertySeen type."""
    return json.loads(kind) if kind.startswith("{") else kind


def merged_kind(earlier: str, later: str) -> str:
    """The type values of both kinds fit, the earlier's where they differ otherwise (a value of
    the other kind is then rejected as a type mismatch): whole numbers beside fractions are
    doubles (JSON has one kind of number); a struct takes the members of both, a list the
    elements of both, a map the values of both; an unknown (NESTED) kind takes the other's."""
    if earlier == later or later == NESTED:
        return earlier
    if earlier == NESTED:
        return later
    if {earlier, later} == {"long", "double"}:
        return "double"
    # Writer schemas that widened a field by Iceberg's rules (int then long, a decimal's digits up).
    first_type, second_type = primitive_type(earlier), primitive_type(later)
    if first_type is not None and second_type is not None:
        if promotes(second_type, first_type):
            return later
        if promotes(first_type, second_type):
            return earlier
    first, second = spelling_of(earlier), spelling_of(later)
    if isinstance(first, dict) and isinstance(second, dict) and first["type"] == second["type"]:
        if first["type"] == "list":
            element = merged_kind(kind_of_spelling(first["element"]), kind_of_spelling(second["element"]))
            return nested_kind({"type": "list", "element": spelling_of(element)})
        if first["type"] == "map":  # a writer schema's map (JSON objects are seen as structs)
            value = merged_kind(kind_of_spelling(first["value"]), kind_of_spelling(second["value"]))
            return nested_kind({**first, "value": spelling_of(value)})
        members = {f["name"]: kind_of_spelling(f["type"]) for f in first["fields"]}
        for field in second["fields"]:
            kind = kind_of_spelling(field["type"])
            members[field["name"]] = merged_kind(members[field["name"]], kind) if field["name"] in members else kind
        return nested_kind(
            {"type": "struct", "fields": [{"name": n, "type": spelling_of(k)} for n, k in members.items()]}
        )
    return earlier


def kind_of_spelling(spelling: Any) -> str:
    """The PropertySeen type of a type as the contract spells it (spelling_of's inverse)."""
    return nested_kind(spelling) if isinstance(spelling, dict) else spelling


def merge_seen(into: dict[str, PropertySeen], more: dict[str, PropertySeen]) -> dict[str, PropertySeen]:
    for name, seen in more.items():
        into[name] = seen if name not in into else into[name].merged(seen)
    return into


def mapped_names(contract: Contract) -> frozenset[str]:
    """Property names a column reads."""
    return frozenset(
        src.removeprefix("properties.")
        for col in contract.all_columns
        for src in col.sources
        if src.startswith("properties.")
    )


def record_order(batch: pa.RecordBatch, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(timestamp ms, partition, offset) of these records of a Kafka source batch; a batch without
    those columns (a test's) counts its rows in order."""
    take = pa.array(rows, pa.int64())
    names = batch.schema.names
    if not {"timestamp", "partition", "offset"} <= set(names):
        zeros = np.zeros(rows.size, dtype=np.int64)
        return zeros, zeros, rows.astype(np.int64)
    micros = pc.fill_null(pc.cast(batch.column("timestamp").take(take), pa.int64()), 0)
    return (
        micros.to_numpy(zero_copy_only=False) // 1000,
        batch.column("partition").take(take).to_numpy(zero_copy_only=False),
        batch.column("offset").take(take).to_numpy(zero_copy_only=False),
    )


def unmapped_properties(
    docs: pa.Array,
    mapped: Collection[str],
    order: tuple[np.ndarray, np.ndarray, np.ndarray],
    member: tuple[str, ...] = ("properties",),
) -> dict[str, PropertySeen]:
    """The property names of these GeoJSON documents that are not in `mapped`, with their types.

    `order` is the (timestamp ms, partition, offset) of each document; `member` the path of the
    object whose members are the properties (a Debezium event's row: ("after",)). A document that
    is not JSON, or not an object, holds no properties here (the decoder rejects it for what it is)."""
    docs = docs.cast(pa.binary())
    brackets = (pc.count_substring(docs, "[") + pc.count_substring(docs, "{")).to_numpy(zero_copy_only=False)
    by_block = np.nan_to_num(brackets, nan=0) <= MAX_BLOCK_BRACKETS
    # The reader refuses a block whose geometries differ in kind (a Point's coordinates beside a
    # Polygon's): a block per geometry type.
    text = pa.Array.from_buffers(pa.string(), len(docs), docs.buffers(), docs.null_count, docs.offset)
    geometry_types = pc.fill_null(pc.struct_field(pc.extract_regex(text, _GEOMETRY_TYPE), [0]), "")
    groups = [
        np.flatnonzero(by_block & pc.equal(geometry_types, kind).to_numpy(zero_copy_only=False))
        for kind in pc.unique(geometry_types.filter(pa.array(by_block))).to_pylist()
    ]
    seen: dict[str, PropertySeen] = {}
    timestamps, partitions, offsets = order
    for positions, block in [*((g, True) for g in groups), (np.flatnonzero(~by_block), False)]:
        if positions.size == 0:
            continue
        part = docs.take(pa.array(positions))
        kinds = (_kinds_by_block(part, member) if block else None) or _kinds_one_by_one(part, member)
        for name, (kind, first, count) in kinds.items():
            if name in mapped:
                continue
            at = positions[first]
            found = PropertySeen(kind, count, (int(timestamps[at]), int(partitions[at]), int(offsets[at])))
            merge_seen(seen, {name: found})
    return seen


def _kinds_by_block(docs: pa.Array, member: tuple[str, ...]) -> dict[str, tuple[str, int, int]] | None:
    """name -> (type, first document holding a value, documents holding one); None when the
    reader refuses the block."""
    flat = pc.replace_substring(pc.replace_substring(docs.cast(pa.binary()), "\n", " "), "\r", " ")
    data = ndjson(flat)
    read_options = pa_json.ReadOptions(use_threads=False, block_size=max(data.size + 1, 1 << 20))
    schema = _PROPERTIES_ONLY if member == ("properties",) else _member_only(member)
    parse_options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
    try:
        table = pa_json.read_json(pa.BufferReader(data), read_options=read_options, parse_options=parse_options)
        if not lists_whole(table):
            # pyarrow's reader drops the nulls that lead a list whose element type it has not yet
            # inferred ([null, "x"]) and keeps their offsets (apache/arrow#51305): the types it
            # inferred are right, and read with them spelled out, the lists are whole.
            spelled = pa_json.ParseOptions(explicit_schema=table.schema, unexpected_field_behavior="infer")
            table = pa_json.read_json(pa.BufferReader(data), read_options=read_options, parse_options=spelled)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(docs) or not lists_whole(table):
        return None
    properties = table.column(member[0]).combine_chunks()
    for name in member[1:]:
        if not pa.types.is_struct(properties.type) or properties.type.get_field_index(name) < 0:
            return None
        properties = pc.struct_field(properties, name)
    if not pa.types.is_struct(properties.type):
        return None
    kinds = {}
    for i, field in enumerate(properties.type):
        values = properties.field(i)
        present = pc.is_valid(values)
        count = pc.sum(present).as_py() or 0
        if count == 0:
            continue
        kinds[field.name] = (_arrow_kind(field.type), int(pc.index(present, True).as_py()), count)
    return kinds


def _arrow_kind(t: pa.DataType) -> str:
    """The column type of what the reader inferred: objects are structs of their members, arrays
    lists; a member or element of no known type (only nulls, an empty array) is left out."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t):
        return "long"
    if pa.types.is_floating(t):
        return "double"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_timestamp(t):
        return "string"  # the reader takes ISO times for timestamps; the column keeps the text
    if pa.types.is_struct(t):
        members = [(f.name, _arrow_kind(f.type)) for f in t]
        known = [{"name": n, "type": spelling_of(k)} for n, k in members if k != NESTED]
        return nested_kind({"type": "struct", "fields": known}) if known else NESTED
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = _arrow_kind(t.value_type)
        return NESTED if element == NESTED else nested_kind({"type": "list", "element": spelling_of(element)})
    return NESTED


def _member_only(member: tuple[str, ...]) -> pa.Schema:
    inner: pa.DataType = pa.struct([])
    for name in reversed(member[1:]):
        inner = pa.struct([(name, inner)])
    return pa.schema([(member[0], inner)])


def _kinds_one_by_one(docs: pa.Array, member: tuple[str, ...]) -> dict[str, tuple[str, int, int]]:
    kinds: dict[str, tuple[str, int, int]] = {}
    for position, raw in enumerate(docs.to_pylist()):
        try:
            doc = json.loads(raw)
        except (ValueError, TypeError, RecursionError):
            continue
        properties = doc
        for name in member:
            properties = properties.get(name) if isinstance(properties, dict) else None
        if not isinstance(properties, dict):
            continue
        for name, value in properties.items():
            if value is None:
                continue
            kind = _python_kind(value)
            known = kinds.get(name)
            if known is None:
                kinds[name] = (kind, position, 1)
            else:
                kinds[name] = (merged_kind(known[0], kind), known[1], known[2] + 1)
    return kinds


def _python_kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long" if -(2**63) <= value < 2**63 else "double"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        members = [(str(k), _python_kind(v)) for k, v in value.items() if v is not None]
        known = [{"name": n, "type": spelling_of(k)} for n, k in members if k != NESTED]
        return nested_kind({"type": "struct", "fields": known}) if known else NESTED
    if isinstance(value, list):
        element = NESTED
        for item in value:
            if item is not None:
                element = merged_kind(element, _python_kind(item))
        return NESTED if element == NESTED else nested_kind({"type": "list", "element": spelling_of(element)})
    return NESTED
