"""Debezium change events written by an Avro converter (Apicurio's or Confluent's) through a schema
registry: the Avro half of the "debezium" format (streaming/decode/formats/debezium.py), which
hands it the values that start with a zero byte, the Confluent wire format's magic byte.

The envelope is an Avro record: `before` and `after` (each null or the row record, Debezium's
`Value` type, named once and referred to again), `source` (its `lsn`, its commit time `ts_ms`),
`op`; a PostGIS column is the record `{wkb: bytes, srid: int}` (the bytes EWKB, no base64 here).
Each schema id is fetched from the registry and compiled once (the avro format's cache, its
compiler and its columnar reader, streaming/decode/formats/avro.py); the events of a schema are
read at once, and the leaves they give (`op`, `source.lsn`, `after.<column>`,
`after.<geometry>.wkb` ...) go through the same rules as the JSON converter's events; a column
whose Connect type the converter notes (`connect.name`: a Decimal with its scale, a Date, a
MicroTimestamp, a Json ...) is converted to its contract type as the JSON converter's are
(streaming/decode/formats/debezium_values.py). An array column (`text[]`, `int[]` ...) is an Avro
array, read whole for all events by the nested reader's steps into its list column. A column added
with ALTER TABLE comes as a new version of the value schema, a new id: its `after` fields that no
contract column reads are what schema evolution sees. A tombstone's key is an Avro record of the
primary key's columns, in the wire format too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming.decode.arrow_values import fit
from streaming.decode.columns import _cast_or_reject
from streaming.decode.formats.avro import WIRE_HEADER, AvroFormat, RecordReader, wire_parts
from streaming.decode.formats.avro_schema import EVOLVED_KIND, Node, Plan, UnsupportedSchema
from streaming.decode.formats.base import Decoded
from streaming.decode.formats.debezium_values import avro_wire, to_column, wire_read_type
from streaming.decode.properties import NESTED, PropertySeen, merge_seen
from streaming.decode.rejects import Reason, Rejects
from streaming.decode.schema_registry import RegistrySettings, UnknownSchemaId
from streaming.kernels.buffers import offsets_and_bytes, scatter_into

if TYPE_CHECKING:
    from streaming.decode.formats.debezium import DebeziumFormat

SIDES = ("before", "after")
_SHORT = "shorter than the Confluent wire format's header (a zero byte and a 4-byte schema id)"


class EnvelopeReader(RecordReader):
    """The columnar reader, also noting which records hold a `before` and an `after` row: a null
    row and a row whose columns are all null read alike as leaves."""

    def __init__(self, plan: Plan, data: np.ndarray, pos: np.ndarray, end: np.ndarray):
        super().__init__(plan, data, pos, end)
        self.present = {side: np.zeros(len(pos), dtype=bool) for side in SIDES}

    def _read(self, node: Node, sel: np.ndarray) -> None:
        # A row's record node is read only for the records whose union took its branch.
        if node.kind == "record" and node.name in self.present:
            self.present[node.name][sel[~self.bad[sel]]] = True
        super()._read(node, sel)


class AvroEvents:
    """Reads the wire-format values and keys of a Debezium format."""

    def __init__(self, fmt: DebeziumFormat):
        self.fmt = fmt
        # The avro format's registry client and its schemas compiled by id, shared, not copied.
        self.schemas = AvroFormat(fmt.contract, fmt.max_nesting, {})
        self.settings = RegistrySettings()

    def use_registry(self, settings: RegistrySettings) -> None:
        self.settings = settings
        self.schemas.use_registry(settings)

    def _plan(self, schema_id: int, rows: np.ndarray, rejects: Rejects, what: str) -> Plan | None:
        """The compiled schema of an id, or None with its records rejected; an unreachable
        registry raises (RegistryUnavailable), which stops the batch."""
        try:
            return self.schemas.plan(schema_id)
        except UnknownSchemaId:
            rejects.add(
                rows,
                Reason.UNKNOWN_SCHEMA_ID,
                f"{what}schema id {schema_id} is not in the schema registry at {self.settings.url}",
            )
        except UnsupportedSchema as exc:
            rejects.add(rows, Reason.SCHEMA_NOT_SUPPORTED, f"{what}{exc}")
        return None

    def _groups(
        self, values: pa.Array, rows: np.ndarray, rejects: Rejects, what: str
    ) -> Iterator[tuple[Plan, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Per schema id: its plan, its values (positions in `rows`), the bytes and where each of
        its records starts and ends; short values and unknown or unsupported ids are rejected on
        the way."""
        _, data, offsets, ids, short = wire_parts(values, rows)
        rejects.add(rows[short], Reason.BAD_WIRE_FORMAT, f"{what}{_SHORT}")
        for schema_id in np.unique(ids[~short]):
            local = np.flatnonzero(~short & (ids == schema_id))
            plan = self._plan(int(schema_id), rows[local], rejects, what)
            if plan is not None:
                yield plan, local, data, offsets[:-1][local] + WIRE_HEADER, offsets[1:][local]

    def decode(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        n = len(values)
        rejects = out.rejects
        for plan, local, data, start, end in self._groups(values, rows, rejects, ""):
            group = rows[local]
            if "op" not in plan.leaves:
                rejects.add(
                    group,
                    Reason.NOT_A_CHANGE_EVENT,
                    f"schema id {plan.schema_id} has no field 'op': not a Debezium change event "
                    "(before, after, op and source)",
                )
                continue
            reader = EnvelopeReader(plan, data, start, end)
            reader.read()
            _mismatches(reader, group, rejects, "")

            def read(path: str, reader: EnvelopeReader = reader) -> pa.Array:
                return reader.arrow(path) if path in reader.columns else pa.nulls(len(reader.pos))

            converted = self._converted(plan, group, read, out)

            def leaf(path: str, read=read, converted=converted) -> pa.Array:
                return converted[path] if path in converted else read(path)

            self.fmt.apply(group, n, out, leaf("op"), leaf("source.lsn"), leaf("source.ts_ms"), reader.present, leaf)

    def _converted(self, plan: Plan, rows: np.ndarray, read, out: Decoded) -> dict[str, pa.Array]:
        """The columns whose Connect type the converter noted (a Decimal's bytes and scale, a
        Date's days, a jsonb's text ...) as their contract types, by leaf path; a value that does
        not fit rejects its record (a delete's `before` only its key's), naming its path."""
        ops = pc.fill_null(read("op").cast(pa.string()), "").to_numpy(zero_copy_only=False)
        converted: dict[str, pa.Array] = {}
        for name, target in self.fmt.columns.items():
            for side in SIDES:
                path = f"{side}.{name}"
                node = plan.leaves.get(path)
                if node is None or (side == "before" and name not in self.fmt.before_columns):
                    continue
                if node.kind == "nested":  # an array column: its items' types are Avro's own
                    value, problems = fit(read(path), target, path)
                else:
                    wire = avro_wire(node.kind, node.connect_name, node.scale)
                    if not (wire.name or pa.types.is_decimal(target)) or wire_read_type(wire, target) is None:
                        continue
                    value, problems = to_column(read(path), wire, target, path, np.arange(len(rows)))
                for local, detail in problems:
                    if side == "after" or ops[local] == "d":
                        out.rejects.add(rows[[local]], Reason.PROPERTY_TYPE_MISMATCH, detail)
                converted[path] = value
        return converted

    def decode_keys(self, keys: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        """Tombstones whose Kafka key is an Avro record of the primary key's columns."""
        rejects = out.rejects
        what = "the tombstone's key: "
        for plan, local, data, start, end in self._groups(keys, rows, rejects, what):
            group = rows[local]
            reader = RecordReader(plan, data, start, end)
            reader.read()
            _mismatches(reader, group, rejects, what)
            for name in self.fmt.contract.primary_key:
                source = self.fmt.source_name(name)
                if source not in reader.columns:
                    continue  # the key column stays null: the decoder rejects a delete without its key
                target = self.fmt.property_types.get(source, pa.string())
                checked = Rejects(len(group))
                value = _cast_or_reject(reader.arrow(source), target, f"{what}{source}", checked)
                rejects.add(group[~checked.ok], Reason.PROPERTY_TYPE_MISMATCH, list(checked.detail[~checked.ok]))
                out.properties[source] = scatter_into(out.properties[source], value, group)
            out.deletes[group[rejects.ok[group]]] = True

    def unmapped_fields(
        self, values: pa.Array, rows: np.ndarray, mapped: frozenset[str], order: tuple[np.ndarray, ...]
    ) -> dict[str, PropertySeen]:
        """The fields of these events' `after` row that no contract column reads, from each
        schema's fields (a column added with ALTER TABLE is in the schema versions after it); a
        field counts the events of the schemas that have it. Records whose schema is unknown or
        unsupported name none (the decoder rejects them)."""
        timestamps, partitions, offsets = order
        taken = mapped | {self.fmt.spec.geometry}
        seen: dict[str, PropertySeen] = {}
        for plan, local, *_ in self._groups(values, rows, Rejects(len(values)), ""):
            k = local[np.lexsort((offsets[local], partitions[local], timestamps[local]))[0]]
            first = (int(timestamps[k]), int(partitions[k]), int(offsets[k]))
            found: dict[str, PropertySeen] = {}
            for path, node in plan.leaves.items():
                column, _, inner = path.removeprefix("after.").partition(".")
                if not path.startswith("after.") or column in taken:
                    continue
                kind = NESTED if inner else EVOLVED_KIND.get(node.kind, NESTED)
                found[column] = PropertySeen(kind, int(local.size), first)
            merge_seen(seen, found)
        return seen


def _mismatches(reader: RecordReader, rows: np.ndarray, rejects: Rejects, what: str) -> None:
    bad = reader.bad
    rejects.add(
        rows[bad],
        Reason.SCHEMA_MISMATCH,
        [f"{what}the record does not match its schema (id {reader.plan.schema_id}): {d}" for d in reader.detail[bad]],
    )


def starts_with_zero(values: pa.Array, rows: np.ndarray) -> np.ndarray:
    """Which of the values at rows begin with a zero byte (the wire format's; JSON begins otherwise)."""
    taken = values.take(pa.array(rows)).cast(pa.binary())
    offsets, data = offsets_and_bytes(taken)
    lengths = np.diff(offsets)
    zero = np.zeros(len(rows), dtype=bool)
    has = lengths > 0
    zero[has] = data[offsets[:-1][has]] == 0
    return zero
