"""Schema evolution at ingest (`schema_evolution` in the contract).

Under `add-columns`, a batch first runs a scan of its GeoJSON properties (`PropertyScan`); the
driver turns the names no column maps into new optional columns (`plan_new_columns`): objects
become structs of their members, arrays lists of their elements. The members a struct column's
values hold and its type lacks become new optional members of it, nested structs too. Each gets
the id the table assigns next, in the order Iceberg assigns them; the batch's files are then
written with them, and the committer adds them in the same commit as the files. A registry
topic's writer schema that declares a mapped field wider than its column (an Avro long for an int
column, a double for a float, a decimal of more digits at the same scale) widens the column by
Iceberg's rules (`ColumnPlan.widened`), in the same way; a change the rules forbid is no
widening: its values that do not fit are dead letters (`property_type_mismatch`). A writer that finds the table's schema moved
meanwhile (another writer added columns) checks that its columns are the ones added; if not, its
files do not fit the table and the batch is written again on the new schema (`SchemaMoved`).
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.table import Transaction
from pyiceberg.types import IcebergType, ListType, MapType, NestedField, StructType

from streaming.contract import Column, Contract
from streaming.contract.types import assign_ids, nested_fields, parse_type, placeholders, primitive_type, promotes
from streaming.decode.columns import property_types
from streaming.decode.decoder import first_significant_byte
from streaming.decode.formats.avro import AvroFormat
from streaming.decode.formats.debezium import DebeziumFormat
from streaming.decode.formats.protobuf import ProtobufFormat
from streaming.decode.properties import (
    NESTED,
    PropertySeen,
    kind_of_spelling,
    merge_seen,
    merged_kind,
    record_order,
    spelling_of,
    unmapped_properties,
)
from streaming.decode.schema_registry import RegistrySettings

PROPERTY_SCAN_SCHEMA = pa.schema(
    [
        ("name", pa.string()),
        ("type", pa.string()),
        ("n", pa.int64()),
        ("first_ms", pa.int64()),
        ("first_partition", pa.int32()),
        ("first_offset", pa.int64()),
    ]
)


class SchemaMoved(RuntimeError):
    """The table's schema changed under a batch so that its new columns no longer fit: another
    writer gave a name or an id another type or meaning."""


@dataclass(frozen=True)
class AddedMember:
    """An optional member a batch adds to a struct column: `path` is the column's name, then the
    names of the structs on the way, then its own; `type` carries the ids of what it holds."""

    path: tuple[str, ...]
    field_id: int
    type: IcebergType

    @property
    def ids(self) -> int:
        """How many ids it takes: its own and those of what it holds."""
        return 1 + sum(1 for _ in nested_fields(self.type))


@dataclass(frozen=True)
class ColumnPlan:
    added: tuple[Column, ...] = ()
    # property name -> why no column takes it
    ignored: dict[str, str] = field(default_factory=dict)
    members: tuple[AddedMember, ...] = ()
    # (column, its wider type): columns a writer schema's declared type widens
    widened: tuple[tuple[str, IcebergType], ...] = ()

    def applied(self, contract: Contract) -> Contract:
        """The contract the batch's files are written under: its columns, the added ones, its
        struct columns with the added members and its widened columns."""
        contract = contract.with_added_columns(contract.added_columns + self.added)
        types = {c.name: c.iceberg_type for c in contract.all_columns}
        for member in self.members:
            column, *inside = member.path
            types[column] = _with_member(types[column], tuple(inside), member)
        changed = {m.path[0]: types[m.path[0]] for m in self.members}
        return contract.with_column_types({**changed, **dict(self.widened)})

    def __bool__(self) -> bool:
        """Whether the batch changes the table's schema."""
        return bool(self.added or self.members or self.widened)


def _with_member(kind: IcebergType, path: tuple[str, ...], member: AddedMember) -> IcebergType:
    """`kind` with `member` added at `path` (inside it: member names, `element`, `value`)."""
    if isinstance(kind, ListType):
        assert path[0] == "element", path
        element = _with_member(kind.element_type, path[1:], member)
        return ListType(kind.element_id, element, element_required=kind.element_required)
    if isinstance(kind, MapType):
        assert path[0] == "value", path
        value = _with_member(kind.value_type, path[1:], member)
        return MapType(kind.key_id, kind.key_type, kind.value_id, value, value_required=kind.value_required)
    assert isinstance(kind, StructType), kind  # plan_new_columns adds members to structs only
    if len(path) == 1:
        return StructType(*kind.fields, NestedField(member.field_id, path[0], member.type, required=False))
    return StructType(
        *(
            NestedField(
                f.field_id, f.name, _with_member(f.field_type, path[1:], member), required=f.required, doc=f.doc
            )
            if f.name == path[0]
            else f
            for f in kind.fields
        )
    )


def plan_new_columns(contract: Contract, seen: dict[str, PropertySeen], last_column_id: int) -> ColumnPlan:
    """The columns these properties become (in the order they were first seen, ids after
    `last_column_id`), the members struct columns gain, and why the other properties are left out."""
    policy = contract.schema_evolution
    taken = {f.name for f in contract.iceberg_schema.fields}
    columns = len(contract.iceberg_schema.fields)
    by_property = {
        src.removeprefix("properties."): c
        for c in contract.all_columns
        for src in c.sources
        if src.startswith("properties.")
    }
    counter = itertools.count(last_column_id + 1)

    def next_id() -> int:
        return next(counter)

    added: list[Column] = []
    ignored: dict[str, str] = {}
    widened: dict[str, IcebergType] = {}
    in_order = sorted(seen.items(), key=lambda item: item[1].first)
    for name, property_seen in in_order:
        if name in by_property:
            # A column reads it: a writer schema may declare it wider; a struct may gain members, below.
            reader = by_property[name]
            declared = primitive_type(property_seen.type)
            if policy.mode == "add-columns" and declared is not None and promotes(declared, reader.iceberg_type):
                widened[reader.name] = declared
            continue
        if policy.mode != "add-columns":
            ignored[name] = "schema_evolution is off"
        elif name in taken:
            ignored[name] = "a column of that name reads another source"
        elif property_seen.type == NESTED:
            ignored[name] = (
                "no column type can be told: its values are empty objects or arrays or only nulls, "
                "or its schema's type holds a union of several types or itself"
            )
        elif not re.fullmatch(policy.name_pattern, name):
            ignored[name] = f"the name does not match schema_evolution.name_pattern {policy.name_pattern!r}"
        elif len(added) >= policy.max_new_columns_per_batch:
            ignored[name] = f"schema_evolution.max_new_columns_per_batch ({policy.max_new_columns_per_batch}) reached"
        elif columns + len(added) >= policy.max_columns:
            ignored[name] = f"schema_evolution.max_columns ({policy.max_columns}) reached"
        else:
            column_id = next_id()
            kind = assign_ids(parse_type(spelling_of(property_seen.type), name, placeholders()), next_id)
            added.append(Column.of_type(column_id, name, kind, False, (f"properties.{name}",)))
    members: list[AddedMember] = []
    if policy.mode == "add-columns":
        for name, property_seen in in_order:
            column = by_property.get(name)
            spelling = spelling_of(property_seen.type)
            if column is not None:
                members += _missing_members(column.iceberg_type, spelling, (column.name,), next_id)
    return ColumnPlan(tuple(added), ignored, tuple(members), tuple(widened.items()))


def _missing_members(
    kind: IcebergType, seen: Any, path: tuple[str, ...], next_id: Callable[[], int]
) -> list[AddedMember]:
    """The members the values hold (`seen`, as the contract spells a type) that the structs of
    `kind` lack: its own members, a list's element's, a map's value's (the member's path then
    goes through `element` or `value`, as Iceberg names them)."""
    if not isinstance(seen, dict):
        return []  # a primitive value: a type mismatch if anything, not a change of the column
    if isinstance(kind, ListType):
        if seen.get("type") != "list":
            return []
        return _missing_members(kind.element_type, seen["element"], (*path, "element"), next_id)
    if isinstance(kind, MapType):
        if seen.get("type") == "map":  # a writer schema's map
            return _missing_members(kind.value_type, seen["value"], (*path, "value"), next_id)
        # A JSON object read into a map: each of its keys holds a value, whose members all count.
        if seen.get("type") != "struct" or not seen["fields"]:
            return []
        values = functools.reduce(merged_kind, (kind_of_spelling(f["type"]) for f in seen["fields"]))
        return _missing_members(kind.value_type, spelling_of(values), (*path, "value"), next_id)
    if not isinstance(kind, StructType) or seen.get("type") != "struct":
        return []  # another kind of value: rejected as a type mismatch, not a change of the column
    have = {f.name: f.field_type for f in kind.fields}
    missing = []
    for member in seen["fields"]:
        name, spelling = member["name"], member["type"]
        if name not in have:
            field_id = next_id()
            member_type = assign_ids(parse_type(spelling, ".".join((*path, name)), placeholders()), next_id)
            missing.append(AddedMember((*path, name), field_id, member_type))
        else:
            missing += _missing_members(have[name], spelling, (*path, name), next_id)
    return missing


def add_columns(tx: Transaction, schema: Schema, last_column_id: int, change: ColumnPlan) -> None:
    """Stage the columns, struct members and widened columns of a batch (`change`) on a
    transaction of the table whose current schema is `schema` (`schema_changes`)."""
    missing, widen = schema_changes(schema, last_column_id, change)
    if missing or widen:
        with tx.update_schema() as update:
            for path, kind in missing:
                update.add_column(path if len(path) > 1 else path[0], kind)
            for name, kind in widen:
                update.update_column(name, field_type=kind)


def schema_changes(
    schema: Schema, last_column_id: int, change: ColumnPlan
) -> tuple[list[tuple[tuple[str, ...], IcebergType]], list[tuple[str, IcebergType]]]:
    """(columns and members to add, by path, in order; columns to widen) for a batch's `change`
    on the table whose current schema is `schema`.

    One the table already has (another writer added it meanwhile) must have the id and type the
    batch's files give it; a missing one is added, and must get the id the files use: Iceberg
    numbers what is added in order, each column or member before what it holds. A widened column
    the table has at that type already (another writer widened it) is left as it is."""
    widen: list[tuple[str, IcebergType]] = []
    for name, kind in change.widened:
        existing_type = schema.find_field(name).field_type
        if existing_type == kind:
            continue
        if not promotes(kind, existing_type):
            raise SchemaMoved(f"column {name!r}: the table has it as {existing_type}, this batch wrote it as {kind}")
        widen.append((name, kind))
    missing: list[tuple[tuple[str, ...], int, IcebergType, int]] = []
    wanted: list[tuple[tuple[str, ...], int, IcebergType, int]] = [
        ((c.name,), c.id, c.iceberg_type, 1 + sum(1 for _ in nested_fields(c.iceberg_type))) for c in change.added
    ]
    wanted += [(m.path, m.field_id, m.type, m.ids) for m in change.members]
    for path, field_id, kind, ids in wanted:
        try:
            existing = schema.find_field(".".join(path))
        except ValueError:
            missing.append((path, field_id, kind, ids))
            continue
        if existing.field_id != field_id or existing.field_type != kind:
            raise SchemaMoved(
                f"column {'.'.join(path)!r}: the table has it as id {existing.field_id} {existing.field_type}, "
                f"this batch wrote it as id {field_id} {kind}"
            )
    expected = last_column_id + 1
    for path, field_id, _, ids in missing:
        if field_id != expected:
            raise SchemaMoved(
                f"column {'.'.join(path)!r}: this batch wrote it as id {field_id}, but the table's next id is {expected}"
            )
        expected += ids
    return [(path, kind) for path, _, kind, _ in missing], widen


@dataclass(frozen=True)
class PropertyScan:
    """The mapInArrow function of the scan pass: Kafka source batches in, one row per property
    name no column maps out (its type and first record)."""

    mapped: frozenset[str]
    # A registry-encoded contract (format "avro"): the fields of each record's writer schema are
    # its properties, read from the schema registry.
    registry_contract: Contract | None = None
    registry: RegistrySettings = RegistrySettings()
    # A contract of Debezium change events: the members of each event's row ('after') are its properties.
    debezium_contract: Contract | None = None
    # Mapped registry fields whose declared type is scanned too: their columns may widen to it.
    declared: frozenset[str] = frozenset()

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        seen: dict[str, PropertySeen] = {}
        avro = None
        if self.registry_contract is not None:
            kind = ProtobufFormat if "protobuf" in self.registry_contract.formats else AvroFormat
            avro = kind(self.registry_contract, 0, {})
            avro.use_registry(self.registry)
        debezium = None
        if self.debezium_contract is not None:
            debezium = DebeziumFormat(self.debezium_contract, 0, property_types(self.debezium_contract))
            debezium.use_registry(self.registry)
        for batch in batches:
            values = batch.column("value")
            live = pc.is_valid(values).to_numpy(zero_copy_only=False)
            first = first_significant_byte(values, live)
            if avro is not None:
                rows = np.flatnonzero(first == 0)
                if rows.size:
                    order = record_order(batch, rows)
                    merge_seen(seen, avro.unmapped_fields(values, rows, self.mapped, order, self.declared))
                continue
            if debezium is not None:
                # Its events with the JSON converter, or an Avro one (the wire format's zero byte).
                rows = np.flatnonzero((first == ord("{")) | (first == 0))
                if rows.size == 0:
                    continue
                merge_seen(seen, debezium.unmapped_fields(values, rows, self.mapped, record_order(batch, rows)))
                continue
            rows = np.flatnonzero(first == ord("{"))
            if rows.size == 0:
                continue
            merge_seen(seen, unmapped_properties(values.take(pa.array(rows)), self.mapped, record_order(batch, rows)))
        yield seen_batch(seen)


def seen_batch(seen: dict[str, PropertySeen]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {
                "name": name,
                "type": s.type,
                "n": s.count,
                "first_ms": s.first[0],
                "first_partition": s.first[1],
                "first_offset": s.first[2],
            }
            for name, s in seen.items()
        ],
        schema=PROPERTY_SCAN_SCHEMA,
    )


def seen_from_rows(rows: Iterable) -> dict[str, PropertySeen]:
    seen: dict[str, PropertySeen] = {}
    for row in rows:
        one = PropertySeen(row["type"], row["n"], (row["first_ms"], row["first_partition"], row["first_offset"]))
        merge_seen(seen, {row["name"]: one})
    return seen
