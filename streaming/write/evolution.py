"""Schema evolution at ingest (`schema_evolution` in the contract).

Under `add-columns`, a batch first runs a scan of its GeoJSON properties (`PropertyScan`); the
driver turns the names no column maps into new optional columns (`plan_new_columns`), with the
ids the table assigns next; the batch's files are then written with them, and the committer adds
the columns in the same commit as the files. A writer that finds the table's schema moved
meanwhile (another writer added columns) checks that its columns are the ones added; if not, its
files do not fit the table and the batch is written again on the new schema (`SchemaMoved`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.table import Transaction

from streaming.contract import Column, Contract
from streaming.decode.columns import property_types
from streaming.decode.decoder import first_significant_byte
from streaming.decode.formats.avro import AvroFormat
from streaming.decode.formats.debezium import DebeziumFormat
from streaming.decode.formats.protobuf import ProtobufFormat
from streaming.decode.properties import NESTED, PropertySeen, merge_seen, record_order, unmapped_properties
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
class ColumnPlan:
    added: tuple[Column, ...] = ()
    # property name -> why no column takes it
    ignored: dict[str, str] = field(default_factory=dict)


def plan_new_columns(contract: Contract, seen: dict[str, PropertySeen], last_column_id: int) -> ColumnPlan:
    """The columns these properties become (in the order they were first seen, ids after
    `last_column_id`), and why the others are left out."""
    policy = contract.schema_evolution
    taken = {f.name for f in contract.iceberg_schema.fields}
    columns = len(contract.iceberg_schema.fields)
    added: list[Column] = []
    ignored: dict[str, str] = {}
    for name, property_seen in sorted(seen.items(), key=lambda item: item[1].first):
        if policy.mode != "add-columns":
            ignored[name] = "schema_evolution is off"
        elif name in taken:
            ignored[name] = "a column of that name reads another source"
        elif property_seen.type == NESTED:
            ignored[name] = "its values are objects or arrays, which no column type holds"
        elif not re.fullmatch(policy.name_pattern, name):
            ignored[name] = f"the name does not match schema_evolution.name_pattern {policy.name_pattern!r}"
        elif len(added) >= policy.max_new_columns_per_batch:
            ignored[name] = f"schema_evolution.max_new_columns_per_batch ({policy.max_new_columns_per_batch}) reached"
        elif columns + len(added) >= policy.max_columns:
            ignored[name] = f"schema_evolution.max_columns ({policy.max_columns}) reached"
        else:
            added.append(
                Column(last_column_id + 1 + len(added), name, property_seen.type, False, (f"properties.{name}",))
            )
    return ColumnPlan(tuple(added), ignored)


def add_columns(tx: Transaction, schema: Schema, last_column_id: int, columns: tuple[Column, ...]) -> None:
    """Stage the columns of a batch on a transaction of the table whose current schema is `schema`.

    A column the table already has (another writer added it meanwhile) must have the id and type
    the batch's files give it; a missing one is added, and must get the id the files use."""
    missing = []
    for column in columns:
        try:
            existing = schema.find_field(column.name)
        except ValueError:
            missing.append(column)
            continue
        if existing.field_id != column.id or existing.field_type != column.iceberg_type:
            raise SchemaMoved(
                f"column {column.name!r}: the table has it as id {existing.field_id} {existing.field_type}, "
                f"this batch wrote it as id {column.id} {column.iceberg_type}"
            )
    for offset, column in enumerate(missing, start=1):
        if column.id != last_column_id + offset:
            raise SchemaMoved(
                f"column {column.name!r}: this batch wrote it as id {column.id}, "
                f"but the table's next id is {last_column_id + offset}"
            )
    if missing:
        with tx.update_schema() as update:
            for column in missing:
                update.add_column(column.name, column.iceberg_type)


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
                    merge_seen(seen, avro.unmapped_fields(values, rows, self.mapped, record_order(batch, rows)))
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
