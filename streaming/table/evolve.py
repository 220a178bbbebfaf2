"""`geoingest table evolve`: change a table's contract in place, keeping its data and field ids.

Iceberg knows a column by its field id, not its name, and so does a contract: a column of the new
contract is the table's column of the same id. Comparing the two by id gives the changes:

- same id, another name: a rename;
- same id, a wider type (int -> long, float -> double): a widening; any other type change is refused;
- same id, required before and optional now: made optional (never the other way round);
- an id the stored contract (the table property `geoingest.contract`) lists and the new one does
  not: a drop. Columns the table gained by schema evolution at ingest, which no contract listed,
  stay unless a contract lists them first;
- an id the table lacks: a new optional column, which must carry the id Iceberg gives it, the
  table's next free one (last column id + 1, + 2, ... in declaration order), so that the
  contract's ids stay the table's.

The partition spec evolves as Iceberg evolves partitions (`_partition_changes`), when the new
contract names `partition` and its fields differ from the table's current spec: fields of the
current spec the list no longer has are removed, new ones added, in a new spec that becomes the
default. Files already written keep the spec they were written with (their manifests say which),
new files take the new one, and a scan reads both, each file pruned by its own spec. Day to hour:
`["day(event_time)"]` -> `["hour(event_time)"]`. A field of the list is an Iceberg transform in
Spark SQL words: `year|month|day|hour(column)`, `bucket(N, column)`, `truncate(W, column)`,
`identity(column)` or the bare column name, or a spatial cell `geohash(geometry, P)`: a cell column
the table lacks is added (optional, after every other column, its `geoingest.partition.cell.*`
property set), and the spec takes an identity field on it.

The geometry, the bbox covering, the Hilbert curve, the primary key, the write mode and the
input formats cannot change (the files already written and the table's geo.* properties are made
of them); the description, `schema_evolution`, the columns' sources and the file and row group
sizes can. Every change and the new `geoingest.contract` land in one commit, or nothing does: the
first refusal raises an `EvolutionError` naming the column before anything is committed. Data
files are not rewritten; readers map their columns by field id (streaming/read/query.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from pyiceberg.exceptions import CommitFailedException, ValidationError
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import DecimalType, IcebergType, NestedField, StringType

from streaming.contract import (
    CELL_PROPERTY_PREFIX,
    Column,
    Contract,
    ContractError,
    parse_contract,
    primitive_type,
    type_name,
)
from streaming.contract.partition import CellColumn
from streaming.table.catalog import table_cells
from streaming.table.native import is_native, native_table

CONTRACT_PROPERTY = "geoingest.contract"
# The type promotions Iceberg allows between the contract's column types.
WIDENINGS = {("int", "long"), ("float", "double")}


class EvolutionError(ValueError):
    """A change the new contract asks for that the table cannot take; the message names the column."""


@dataclass(frozen=True)
class Change:
    """One change to the table: `kind` is rename, widen, make-optional, drop, add, contract,
    partition-add or partition-remove (`column`: the partition field's name, `after`: its transform)."""

    kind: str
    column: str  # the column's name in the table before the change (its new name for add)
    id: int | None = None
    before: str | None = None  # the old name or type, for rename and widen
    after: str | None = None  # the new name or type, for rename, widen and add
    keys: tuple[str, ...] = ()  # contract: the top-level keys of the contract that differ

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"change": self.kind}
        if self.kind == "contract":
            return {**out, "property": CONTRACT_PROPERTY, "keys": list(self.keys)}
        if self.kind in ("partition-add", "partition-remove"):
            return {**out, "field": self.column, "transform": self.after}
        if self.kind == "cell-add":
            return {**out, "id": self.id, "column": self.column, "property": f"{CELL_PROPERTY_PREFIX}{self.column}"}
        out.update(id=self.id, column=self.column)
        if self.kind == "rename":
            out["to"] = self.after
        elif self.kind == "widen":
            out.update({"from": self.before, "to": self.after})
        elif self.kind == "add":
            out["type"] = self.after
        return out


def plan_evolution(table: Table, new_contract: Contract) -> list[Change]:
    """The changes `new_contract` makes to the table, checked as a commit would check them
    (pyiceberg's own checks included), without committing anything."""
    changes, _ = _staged(table, new_contract)
    return changes


def apply_evolution(table: Table, new_contract: Contract) -> list[Change]:
    """Make the table's schema and recorded contract `new_contract`'s, in one commit."""
    changes, transaction = _staged(table, new_contract)
    try:
        if is_native(table):
            _commit_native(table, changes, transaction)
        else:
            transaction.commit_transaction()
    except CommitFailedException as exc:
        # The schema the changes were planned on is no longer the table's (an ingest added a column).
        raise EvolutionError(
            f"table {new_contract.table}: it changed while the evolve ran ({exc}); nothing was changed, run it again"
        ) from None
    return changes


def stored_contract(table: Table) -> Contract:
    """The contract the table records (`geoingest.contract`): the one it was made or last evolved from."""
    name = ".".join(table.name())
    raw = table.properties.get(CONTRACT_PROPERTY)
    if not raw:
        raise EvolutionError(
            f"table {name}: no {CONTRACT_PROPERTY} property, so no contract to evolve from "
            "(was it made by 'geoingest table create'?)"
        )
    try:
        return parse_contract(json.loads(raw))
    except (json.JSONDecodeError, ContractError) as exc:
        raise EvolutionError(
            f"table {name}: its {CONTRACT_PROPERTY} property is not a usable contract ({exc})"
        ) from None


def _staged(table: Table, new: Contract) -> tuple[list[Change], Transaction]:
    """The changes, staged on a transaction that is not committed yet."""
    name = ".".join(table.name())
    if new.table != name:
        raise EvolutionError(f"table: the contract names {new.table}, not {name}")
    stored = stored_contract(table)
    _check_unchangeable_parts(stored, new)
    schema = table.schema()
    changes = _column_changes(schema, table.metadata.last_column_id, stored, new)
    _check_primary_key(stored, new)
    new_json = new.table_properties()[CONTRACT_PROPERTY]
    if table.properties.get(CONTRACT_PROPERTY) != new_json:
        differing = sorted(
            k for k in stored.source.keys() | new.source.keys() if stored.source.get(k) != new.source.get(k)
        )
        changes.append(Change("contract", "", keys=tuple(differing)))

    # A spec's new cell column comes after every other column, optional (the rows already written
    # have none), with the table's next free id once the columns above are added.
    cells = table_cells(table, stored) or ()
    next_id = table.metadata.last_column_id + 1 + sum(1 for c in changes if c.kind == "add")
    added_cells: list[CellColumn] = []
    for cell in new.cell_fields:
        if all(c.name != cell.name for c in cells + tuple(added_cells)):
            added_cells.append(CellColumn(next_id, cell, required=False, appended=True))
            changes.append(Change("cell-add", cell.name, next_id, after=cell.cell_meaning))
            next_id += 1
    new = replace(new, table_cells=cells + tuple(added_cells))

    partition_changes, partition_fields = _partition_changes(table, new)
    changes += partition_changes

    added_types = {c.name: c.iceberg_type for c in new.columns}
    transaction = table.transaction()
    try:
        with transaction.update_schema() as update:
            for change in changes:
                if change.kind == "rename":
                    update.rename_column(change.column, str(change.after))
                elif change.kind == "widen":
                    update.update_column(change.column, field_type=primitive_type(str(change.after)))
                elif change.kind == "make-optional":
                    update.make_column_optional(change.column)
                elif change.kind == "drop":
                    update.delete_column(change.column)
                elif change.kind == "add":
                    update.add_column(change.column, added_types[change.column], required=False)
            for change in changes:  # after the contract's columns: they take the ids the contract gives them
                if change.kind == "cell-add":
                    update.add_column(change.column, StringType(), required=False)
    except (ValueError, ValidationError) as exc:
        # The checks above are meant to leave pyiceberg nothing to refuse; should it, say so.
        raise EvolutionError(f"table {name}: Iceberg refuses the schema change: {exc}") from None
    if partition_changes:
        try:
            with transaction.update_spec() as spec:
                for change in partition_changes:
                    if change.kind == "partition-remove":
                        spec.remove_field(change.column)
                for field in partition_fields:
                    if any(c.kind == "partition-add" and c.column == field.name for c in partition_changes):
                        spec.add_field(field.source, field.iceberg_transform, field.name)
        except ValueError as exc:
            raise EvolutionError(f"partition: Iceberg refuses the partition change: {exc}") from None
    _check_staged_schema(name, transaction.table_metadata.schema(), new)
    if any(change.kind == "contract" for change in changes):
        transaction.set_properties({CONTRACT_PROPERTY: new_json})
    cell_properties = {f"{CELL_PROPERTY_PREFIX}{c.name}": c.field.cell_meaning for c in added_cells}
    if cell_properties:
        transaction.set_properties(cell_properties)
    return changes, transaction


def _commit_native(table: Table, changes: list[Change], staged: Transaction) -> None:
    """The staged changes made by Iceberg Java (pyiceberg writes no v3 table), on the metadata they
    were planned on: a table changed since is refused (CommitFailedException), as pyiceberg's commit
    would refuse it."""
    schema = staged.table_metadata.schema()  # the types as pyiceberg staged them
    columns: list[tuple[str, str, str | None]] = []
    for change in changes:
        if change.kind == "widen":
            columns.append(
                ("widen", change.column, schema.find_field(int(change.id or 0)).field_type.model_dump_json())
            )
        elif change.kind in ("add", "cell-add"):
            columns.append(("add", change.column, schema.find_field(change.column).field_type.model_dump_json()))
        elif change.kind in ("rename", "make-optional", "drop"):
            columns.append((change.kind, change.column, change.after))
    # Cell columns after the contract's: they take the ids after the ones the contract gives.
    columns.sort(key=lambda c: any(ch.kind == "cell-add" and ch.column == c[1] for ch in changes))
    spec = staged.table_metadata.spec()
    added = {c.column for c in changes if c.kind == "partition-add"}
    partition_fields = [
        (schema.find_column_name(f.source_id) or "", str(f.transform), f.name) for f in spec.fields if f.name in added
    ]
    removed = [c.column for c in changes if c.kind == "partition-remove"]
    properties = {k: v for k, v in staged.table_metadata.properties.items() if table.properties.get(k) != v}
    native_table(table).evolve(table.metadata_location, columns, removed, partition_fields, properties)


def _check_unchangeable_parts(stored: Contract, new: Contract) -> None:
    """The parts of a contract the table's files and geo.* properties are made of: unchanged
    (the primary key too: `_check_primary_key`)."""
    for key in ("id", "name", "types", "dimensions", "crs", "encoding", "invalid_polygons"):
        before, after = getattr(stored.geometry, key), getattr(new.geometry, key)
        if before != after:
            raise EvolutionError(
                f"geometry.{key}: {_shown(before)} -> {_shown(after)}; a table's geometry column cannot change"
            )
    for key, before, after in (
        ("stored", stored.bbox_stored, new.bbox_stored),
        ("id", stored.bbox_id, new.bbox_id),
        ("name", stored.bbox_name, new.bbox_name),
        ("flat_columns", stored.bbox_flat_columns, new.bbox_flat_columns),
    ):
        if before != after:
            raise EvolutionError(
                f"bbox.{key}: {_shown(before)} -> {_shown(after)}; a table's bbox column cannot change"
            )
    for key in ("hilbert_bits", "extent"):
        before, after = getattr(stored.clustering, key), getattr(new.clustering, key)
        if before != after:
            raise EvolutionError(
                f"clustering.{key}: {_shown(before)} -> {_shown(after)}; the table's files are sorted along "
                "its Hilbert curve, which cannot change"
            )
    if stored.raster != new.raster:
        raise EvolutionError(
            f"raster: {_shown(stored.source.get('raster'))} -> {_shown(new.source.get('raster'))}; "
            "a table's raster column cannot change"
        )
    if stored.mode != new.mode:
        raise EvolutionError(f"mode: {stored.mode!r} -> {new.mode!r}; a table's write mode cannot change")
    if stored.formats != new.formats:
        raise EvolutionError(
            f"formats: {list(stored.formats)} -> {list(new.formats)}; the input formats cannot change by evolve"
        )


def _check_primary_key(stored: Contract, new: Contract) -> None:
    """The same key columns, by name and by id: after the column checks, so that dropping a key
    column is refused as that, and renaming one as a key change."""
    stored_key = [(n, _column_id(stored, n)) for n in stored.primary_key]
    new_key = [(n, _column_id(new, n)) for n in new.primary_key]
    if stored_key != new_key:
        raise EvolutionError(
            f"primary_key: {_key_shown(stored_key)} -> {_key_shown(new_key)}; a table's primary key cannot change "
            "(upserts and equality deletes address rows by it, under its name)"
        )


def _column_changes(schema: Schema, last_column_id: int, stored: Contract, new: Contract) -> list[Change]:
    """Drops in the stored contract's order, then renames, widenings, columns made optional and
    additions in the new contract's (drops first: a column may be added under a dropped one's name)."""
    columns = {f.field_id: f for f in schema.fields}
    changes: list[Change] = []
    listed = {c.id for c in new.columns}
    key_ids = {_column_id(stored, n) for n in stored.primary_key}
    for column in stored.columns:
        field = columns.get(column.id)
        if column.id in listed or field is None:
            continue  # kept, or already gone from the table
        if column.id in key_ids:
            raise EvolutionError(
                f"column {field.name!r} (id {column.id}): a primary key column cannot be dropped; keep it in columns"
            )
        changes.append(Change("drop", field.name, column.id))

    # The geometry, the bbox and its flat copies, the raster: no contract column may take their ids.
    fixed_ids = {new.geometry.id, *new.covering_column_ids, *_raster_ids(new)}
    stored_ids = {c.id for c in stored.columns}
    next_id = last_column_id + 1
    for i, column in enumerate(new.columns):
        where = f"columns[{i}] {column.name!r}"
        field = columns.get(column.id)
        if field is None:
            changes.append(_added(where, column, schema, next_id))
            next_id += 1
        elif column.id in fixed_ids:
            raise EvolutionError(f"{where}: id {column.id} is the table's {field.name!r}, not a contract column")
        elif column.id not in stored_ids and field.name != column.name:
            # A column schema evolution added at ingest, listed for the first time: under another
            # name it is more likely a new column given a taken id than a rename.
            raise EvolutionError(
                f"{where}: id {column.id} is the table's column {field.name!r}, which schema evolution added and "
                f"no contract listed yet; list it as {field.name!r} (and rename it in a later evolve), or give "
                f"a new column the table's next free id, {next_id}"
            )
        else:
            changes += _changed(where, column, field)

    _check_names(schema, new, changes)
    return changes


def _added(where: str, column: Column, schema: Schema, next_id: int) -> Change:
    nested = schema.find_column_name(column.id)
    if nested is not None:
        raise EvolutionError(
            f"{where}: id {column.id} is the table's field {nested!r}; a new column takes the table's "
            f"next free id, {next_id}"
        )
    if column.id != next_id:
        raise EvolutionError(
            f"{where}: id {column.id} is not the table's; a new column takes the table's next free id, "
            f"{next_id} (ids are never reused)"
        )
    if column.required:
        raise EvolutionError(
            f"{where}: a new column must be optional (required: false); the rows already written have no value for it"
        )
    return Change("add", column.name, column.id, after=column.type)


def _wider_decimal(before: IcebergType, after: IcebergType) -> bool:
    """Iceberg widens a decimal's precision, its scale kept."""
    return (
        isinstance(before, DecimalType)
        and isinstance(after, DecimalType)
        and before.scale == after.scale
        and before.precision <= after.precision
    )


def _changed(where: str, column: Column, field: NestedField) -> list[Change]:
    """What turns the table's column `field` into the contract's `column` (same id)."""
    current_type = type_name(field.field_type)
    if not field.field_type.is_primitive and field.field_type != column.iceberg_type:
        raise EvolutionError(
            f"{where}: the table's column id {column.id} ({field.name!r}) is {field.field_type}, the contract says "
            f"{column.iceberg_type}; `table evolve` changes no nested type (ingest's schema evolution adds members)"
        )
    changes = []
    if field.name != column.name:
        changes.append(Change("rename", field.name, column.id, before=field.name, after=column.name))
    if current_type != column.type:
        if (current_type, column.type) not in WIDENINGS and not _wider_decimal(field.field_type, column.iceberg_type):
            raise EvolutionError(
                f"{where}: {current_type} -> {column.type} is not a type change Iceberg allows "
                f"(only {', '.join(f'{a} -> {b}' for a, b in sorted(WIDENINGS))})"
            )
        changes.append(Change("widen", field.name, column.id, before=current_type, after=column.type))
    if field.required and not column.required:
        changes.append(Change("make-optional", field.name, column.id))
    elif not field.required and column.required:
        raise EvolutionError(
            f"{where}: optional -> required is not a change Iceberg allows; the rows already written may hold nulls"
        )
    return changes


def _check_names(schema: Schema, new: Contract, changes: list[Change]) -> None:
    """Every top-level name of the evolved table is one column's. The new contract's own names are
    unique (parse_contract); a clash is with a column it neither lists nor drops (one schema
    evolution at ingest added), or a name that a kept column still has when a column is added."""
    renamed = {c.id: str(c.after) for c in changes if c.kind == "rename"}
    dropped = {c.id for c in changes if c.kind == "drop"}
    listed = {c.id for c in new.columns} | {
        new.geometry.id,
        *new.covering_column_ids,
        *_raster_ids(new),
    }
    unlisted = {f.name: f.field_id for f in schema.fields if f.field_id not in listed and f.field_id not in dropped}
    kept_names = {f.name: f.field_id for f in schema.fields if f.field_id not in dropped}
    for i, column in enumerate(new.columns):
        where = f"columns[{i}] {column.name!r}"
        other = unlisted.get(column.name)
        if other is not None and other != column.id:
            raise EvolutionError(
                f"{where}: the name is the table's column id {other}, which schema evolution added and the "
                "contract neither lists nor drops; give this column another name"
            )
        added = any(c.kind == "add" and c.id == column.id for c in changes)
        holder = kept_names.get(column.name)
        if added and holder is not None:
            # Iceberg adds a column only under a name no column of the table keeps, even one
            # renamed in the same change.
            raise EvolutionError(
                f"{where}: the name is still the table's column id {holder}, which this contract renames to "
                f"{renamed.get(holder, column.name)!r}; rename it in one evolve and add this column in the next"
            )


def _check_staged_schema(table_name: str, staged: Schema, new: Contract) -> None:
    """Every field of the new contract is the evolved table's field of its id: what
    `streaming.table.catalog.table_contract` checks whenever the service opens the table."""
    for expected in new.iceberg_schema.fields:
        try:
            found: NestedField | None = staged.find_field(expected.field_id)
        except ValueError:
            found = None
        if found != expected:
            raise EvolutionError(
                f"table {table_name}: field id {expected.field_id} would be {found or 'missing'} after the change, "
                f"the contract says {expected}"
            )


def _raster_ids(contract: Contract) -> tuple[int, ...]:
    return (contract.raster.id,) if contract.raster is not None else ()


def _column_id(contract: Contract, name: str) -> int | None:
    return next((c.id for c in contract.columns if c.name == name), None)


def _key_shown(key: list[tuple[str, int | None]]) -> str:
    return "[" + ", ".join(f"{name!r} (id {fid})" for name, fid in key) + "]"


def _shown(value: Any) -> str:
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


# -- partition spec ---------------------------------------------------------------------------------
_PARTITION_TERM = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?:\((.*)\))?\s*$")
_SIMPLE_TRANSFORMS: dict[str, Transform] = {
    "identity": IdentityTransform(),
    "year": YearTransform(),
    "month": MonthTransform(),
    "day": DayTransform(),
    "hour": HourTransform(),
}


@dataclass(frozen=True)
class _PartitionTerm:
    """One field of a contract's `partition` list, as Iceberg takes it."""

    text: str
    transform: str  # year, month, day, hour, bucket, truncate or identity
    source: str
    param: int | None = None

    @property
    def iceberg_transform(self) -> Transform:
        if self.transform == "bucket":
            return BucketTransform(self.param or 1)
        if self.transform == "truncate":
            return TruncateTransform(self.param or 1)
        return _SIMPLE_TRANSFORMS[self.transform]

    @property
    def name(self) -> str:
        """The partition field's name, as Iceberg's defaults name it."""
        if self.transform == "identity":
            return self.source
        if self.transform == "bucket":
            return f"{self.source}_bucket_{self.param}"
        if self.transform == "truncate":
            return f"{self.source}_trunc_{self.param}"
        return f"{self.source}_{self.transform}"


def _partition_term(text: Any, where: str, columns: dict[str, int]) -> _PartitionTerm:
    match = _PARTITION_TERM.match(text) if isinstance(text, str) else None
    if match is None:
        raise EvolutionError(f"{where}: {text!r} is not a column or a transform like 'day(event_time)'")
    head, inner = match.group(1), match.group(2)
    transform, args = ("identity", [head]) if inner is None else (head.lower(), [a.strip() for a in inner.split(",")])
    param = None
    if transform in ("bucket", "truncate"):
        if len(args) != 2 or not args[0].isdigit() or int(args[0]) < 1:
            raise EvolutionError(f"{where}: {text}: expected {transform}(N, column), N a positive whole number")
        param, args = int(args[0]), args[1:]
    elif transform == "geohash" and len(args) == 2 and args[1].isdigit():
        # The contract checked it (parse_partition); its cell column is partitioned by identity.
        transform, args = "identity", [f"{args[0]}_geohash{int(args[1])}"]
    elif transform not in _SIMPLE_TRANSFORMS:
        raise EvolutionError(
            f"{where}: {text}: evolve changes a partition by an Iceberg transform (year, month, day, hour, "
            "bucket, truncate, identity) or a spatial cell (geohash)"
        )
    if len(args) != 1 or args[0] not in columns:
        raise EvolutionError(f"{where}: {text}: {', '.join(args)!r} is not a column of the table")
    return _PartitionTerm(text, transform, args[0], param)


def _partition_changes(table: Table, new: Contract) -> tuple[list[Change], list[_PartitionTerm]]:
    """The partition fields to remove from the table's current spec and to add, for the spec the
    new contract's `partition` names (none when it names none: the table keeps its spec)."""
    raw = new.source.get("partition")
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        raise EvolutionError(f"partition: expected a list of transforms like ['day(event_time)'], got {raw!r}")
    schema = table.schema()
    columns = {f.name: f.field_id for f in schema.fields} | new.cell_field_ids
    wanted = [_partition_term(text, f"partition[{i}]", columns) for i, text in enumerate(raw)]
    current = table.spec()
    have = {(f.source_id, str(f.transform)): f for f in current.fields}
    want = {(columns[t.source], str(t.iceberg_transform)): t for t in wanted}
    if len(want) != len(wanted):
        raise EvolutionError(f"partition: {raw!r} names a field twice")
    changes = [Change("partition-remove", f.name, after=str(f.transform)) for key, f in have.items() if key not in want]
    changes += [
        Change("partition-add", t.name, after=str(t.iceberg_transform)) for key, t in want.items() if key not in have
    ]
    return changes, wanted
