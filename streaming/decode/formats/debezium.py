"""Debezium change events of a PostGIS table (contract format "debezium"), with Kafka Connect's
JSON converter, its schemas on (`{"schema": ..., "payload": <envelope>}`) or off (the envelope), or
with an Avro converter through a schema registry (a zero byte first: read by
streaming/decode/formats/debezium_avro.py, then `apply` as the JSON events are).

The envelope: `op` (c: insert, r: snapshot read, u: update, d: delete), `before` and `after` (the
row, each column a member), `source` (where in the source's log: `lsn`, commit time `ts_ms`). A
PostGIS geometry or geography column comes as the struct `{"wkb": <base64>, "srid": <int>}`
(io.debezium.data.geometry.Geometry / Geography), the bytes PostGIS's EWKB: the contract's
`debezium.geometry` names that column. Inserts, reads and updates give the row from `after`;
deletes give the key columns from `before` (REPLICA IDENTITY DEFAULT holds the primary key there)
and mark the row as a delete, which the upsert pass applies as tombstones are
(streaming/write/upsert.py). The tombstone Debezium writes after a delete (a null value, the
key) deletes the key again: its key columns are read from the Kafka key (the primary key, as
Debezium writes it: `{"id": 1}`, or `{"schema": ..., "payload": {"id": 1}}`). Nothing else of
`before` is read (REPLICA IDENTITY FULL holds the whole old row there).

An update may lack values it left unchanged: under REPLICA IDENTITY DEFAULT the log holds a TOASTed
value (over about 2 KB) only if the update changed it, and the connector sends its placeholder
(`unavailable.value.placeholder`, the contract's `debezium.unavailable_value`) for a text or bytes
column, a null struct for a geometry. Such a value is never stored: the column is null and listed
in `Decoded.unavailable` (the geometry in `Decoded.geometry_unavailable`, the row valid without
one), and the upsert pass keeps the key's current value (docs/debezium.md, large values). A double's
NaN and infinities come as the strings "NaN", "Infinity", "-Infinity" from the JSON converter, and
bytea as base64 text.

Typed and nested columns (decimal, date, time, timestamp, timestamptz, uuid, list, struct, map) take
PostgreSQL's numeric, date, time, timestamp, timestamptz, uuid, arrays and jsonb as the connector
spells them (streaming/decode/formats/debezium_values.py, which lists the decisions: a numeric of any
decimal.handling.mode, exact or rejected, never rounded but in double mode; a jsonb as its text in
a string column, parsed into a struct, map or list column). An enveloped event's schema says how
each column is spelt (a Decimal's scale, a timestamp's unit): the events of a batch are grouped by
their schema's text, each distinct text read once, and each group read with the leaf types its
spelling needs; a bare event is taken as spelt with the connector's defaults.

A block of events is read at once by pyarrow's JSON reader, the columns the contract reads (each at
its path, with its type, for both envelope spellings) as its explicit schema, as the JSON-fields
format reads (streaming/decode/formats/json_fields.py); the geometries' base64 and WKB are decoded
over the whole batch. Ordering is the source's commit order within a Kafka partition: Debezium
keys each change by the row's primary key, so all changes of a row are in one partition, in order.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import shapely

from streaming.contract import Contract
from streaming.decode.columns import _cast_or_reject
from streaming.decode.formats.base import Decoded, InputFormat
from streaming.decode.formats.debezium_avro import AvroEvents, starts_with_zero
from streaming.decode.formats.debezium_values import JSON_TEXT, Wire, default_wire, to_column, wire_read_type
from streaming.decode.formats.geojson import _invalid_utf8, _raw_control_characters, _still_ok
from streaming.decode.formats.json_blocks import one_per_line
from streaming.decode.formats.json_fields import QUOTED_NON_FINITE, _BlockParser, _leaf
from streaming.decode.formats.wkb import EWKB_SRID_FLAG, read_wkb
from streaming.decode.properties import PropertySeen, merge_seen, unmapped_properties
from streaming.decode.rejects import Reason, Rejects, shown
from streaming.decode.schema_registry import RegistrySettings
from streaming.kernels.buffers import offsets_and_bytes, scatter, scatter_into
from streaming.kernels.text_encodings import base64_decode

PAYLOAD = "payload"
UPSERT_OPS = ("c", "r", "u")
UPDATE_OP = "u"
DELETE_OP = "d"
# How Kafka Connect's JSON converter spells an enveloped event: the schema first, then the payload.
_SCHEMA_FIRST = '{"schema":'
_PAYLOAD_MEMBER = '"payload":'
_ENVELOPE = {"op": pa.string(), "source.lsn": pa.int64(), "source.ts_ms": pa.int64()}


class DebeziumFormat(InputFormat):
    names: ClassVar[tuple[str, ...]] = ("debezium",)
    # JSON ('{'), or Avro in the Confluent wire format (its zero byte, claimed before WKB's).
    first_bytes: ClassVar[tuple[int, ...]] = (ord("{"), 0)
    precedence: ClassVar[int] = 1
    described: ClassVar[str] = "a Debezium change event (a JSON object, or Avro in the Confluent wire format)"
    first_bytes_shown: ClassVar[tuple[str, ...]] = ("'{'", "0x00")
    refused_first_bytes: ClassVar[dict[int, tuple[Reason, str]]] = {
        ord("["): (Reason.NOT_A_CHANGE_EVENT, "a JSON array is not a Debezium change event (an object)")
    }
    # A null value with a key is Debezium's tombstone of that key, read by `decode_tombstones`.
    reads_tombstones: ClassVar[bool] = True

    @classmethod
    def active(cls, contract: Contract) -> bool:
        return "debezium" in contract.formats

    def __init__(self, contract: Contract, max_nesting: int, property_types: dict[str, pa.DataType]):
        super().__init__(contract, max_nesting, property_types)
        assert contract.debezium is not None  # the contract requires the section with the format
        self.spec = contract.debezium
        geometry = self.spec.geometry
        self.columns = {name: t for name, t in property_types.items() if name != geometry}
        # A delete needs only its key: of `before` only the key columns are read, so the other old
        # values REPLICA IDENTITY FULL sends (a NaN, anything) are never parsed and reject nothing.
        key_sources = {self.source_name(name) for name in contract.primary_key}
        self.before_columns = [name for name in self.columns if name in key_sources]
        # Each column as the connector's defaults spell its type, until an event's schema says otherwise.
        self.default_wires = {name: default_wire(t) for name, t in self.columns.items()}
        self._parsers: dict[tuple, _BlockParser] = {}
        self._schema_wires: dict[bytes, tuple] = {}
        self._parser_of(self._signature(self.default_wires))  # the common case, made up front
        keys = {
            self.source_name(name): property_types.get(self.source_name(name), pa.string())
            for name in contract.primary_key
        }
        self.key_parser = _BlockParser({**keys, **{f"{PAYLOAD}.{k}": t for k, t in keys.items()}}, self._kind_of)
        self.avro = AvroEvents(self)

    def source_name(self, column: str) -> str:
        """The source table's column a primary key column reads (its `properties.<name>` source)."""
        col = next(c for c in self.contract.all_columns if c.name == column)
        return next((s.removeprefix("properties.") for s in col.sources if s.startswith("properties.")), column)

    def _kind_of(self, path: str) -> str:
        return "column"

    def _signature(self, wires: dict[str, Wire | None]) -> tuple[Wire | None, ...]:
        return tuple(wires.get(name) for name in self.columns)

    def _parser_of(self, signature: tuple[Wire | None, ...]) -> _BlockParser:
        """The reader of events whose columns are spelt `signature` (one per column), made once."""
        parser = self._parsers.get(signature)
        if parser is not None:
            return parser
        geometry = self.spec.geometry
        # The JSON converter writes bytes as base64 text: read as text, decoded in `apply`.
        text = {}
        for (name, target), wire in zip(self.columns.items(), signature):
            text[name] = wire_read_type(wire, target) or (pa.string() if _is_binary(target) else target)
        envelope = dict(_ENVELOPE)
        envelope.update({f"after.{geometry}.wkb": pa.string(), f"after.{geometry}.srid": pa.int64()})
        envelope.update({f"after.{name}": t for name, t in text.items()})
        envelope.update({f"before.{name}": text[name] for name in self.before_columns})
        leaves = {**envelope, **{f"{PAYLOAD}.{path}": t for path, t in envelope.items()}}
        kinds = {path: "text" for path in (f"after.{geometry}.wkb", f"{PAYLOAD}.after.{geometry}.wkb")}
        kinds.update({path: QUOTED_NON_FINITE for path, t in leaves.items() if pa.types.is_floating(t)})
        parser = _BlockParser(leaves, lambda path: kinds.get(path, "column"))
        self._parsers[signature] = parser
        return parser

    def _signatures(self, docs: pa.Array, was_cut: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
        """Which spelling each event's columns have: its group (an index into the returned list of
        signatures). An enveloped event's schema says (each distinct schema text read once, and
        remembered); an event without one has the defaults' (group 0)."""
        signatures: list[tuple] = [self._signature(self.default_wires)]
        groups = np.zeros(len(docs), dtype=np.int64)
        if not was_cut.any():
            return groups, signatures
        positions = np.flatnonzero(was_cut)
        enveloped = docs.take(pa.array(positions)).cast(pa.binary())
        at = pc.find_substring(enveloped, _PAYLOAD_MEMBER).to_numpy(zero_copy_only=False)
        # A topic's events share one schema, or a few (a column added): each distinct head (the
        # text before the payload) is found by comparing it with every head at once, so a batch
        # costs one pass per distinct schema, no copy of the heads.
        unassigned = np.ones(len(positions), dtype=bool)
        while unassigned.any():
            first = int(np.argmax(unassigned))
            whole = enveloped[first].as_py()
            head = whole[: int(at[first])]
            same = unassigned & (at == at[first])
            same &= pc.fill_null(pc.starts_with(enveloped, head), False).to_numpy(zero_copy_only=False)
            same[first] = True
            unassigned &= ~same
            signature = self._schema_wires.get(head)
            if signature is None:
                signature = self._signature_of_schema(head, whole)
                if len(self._schema_wires) > 256:  # schemas change seldom: a bound, not a cache policy
                    self._schema_wires.clear()
                self._schema_wires[head] = signature
            if signature not in signatures:
                signatures.append(signature)
            groups[positions[same]] = signatures.index(signature)
        return groups, signatures

    def _signature_of_schema(self, head: bytes, whole: bytes) -> tuple:
        """The spellings the schema of an enveloped event gives its `after` row's columns (the
        defaults' for a column it lacks, or a schema that cannot be read: the event is rejected
        on its own then)."""
        try:
            schema = json.loads(head + b'"payload":null}')["schema"]
        except (ValueError, TypeError, KeyError):
            try:
                schema = json.loads(whole)["schema"]
            except (ValueError, TypeError, KeyError):
                return self._signature(self.default_wires)
        wires = dict(self.default_wires)
        fields = schema.get("fields") if isinstance(schema, dict) else None
        for side in fields if isinstance(fields, list) else []:
            if not isinstance(side, dict) or side.get("field") != "after":
                continue
            for column in side.get("fields") or []:
                if isinstance(column, dict) and column.get("field") in self.columns:
                    wires[column["field"]] = Wire.of_schema(column)
        return self._signature(wires)

    def use_registry(self, settings: RegistrySettings) -> None:
        self.avro.use_registry(settings)

    def decode(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        # Avro through a registry (a zero byte first) or JSON ('{'): a topic may change converter.
        avro = starts_with_zero(values, rows)
        if (~avro).any():
            self._decode_json(values, rows[~avro], out)
        if avro.any():
            self.avro.decode(values, rows[avro], out)

    def _decode_json(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        n = len(values)
        rejects = out.rejects
        # The payload is cut out first: the schema before it is most of an enveloped event's bytes.
        docs = values.take(pa.array(rows)).cast(pa.binary())
        cut, was_cut = _payloads(docs)
        rejects.add(rows[_invalid_utf8(cut)], Reason.MALFORMED_JSON, "value is not valid UTF-8 JSON")
        for local, detail in _raw_control_characters(cut):
            rejects.add(rows[[local]], Reason.MALFORMED_JSON, detail)
        keep = rejects.ok[rows]
        if not keep.all():
            mask = pa.array(keep)
            rows, cut, docs, was_cut = rows[keep], cut.filter(mask), docs.filter(mask), was_cut[keep]
        if rows.size == 0:
            return
        groups, signatures = self._signatures(docs, was_cut)
        for group, signature in enumerate(signatures):
            members = np.flatnonzero(groups == group)
            if members.size == 0:
                continue
            if members.size == len(rows):
                self._decode_group(signature, rows, n, cut, docs, was_cut, out)
            else:
                at = pa.array(members)
                self._decode_group(signature, rows[members], n, cut.take(at), docs.take(at), was_cut[members], out)

    def _decode_group(
        self,
        signature: tuple[Wire | None, ...],
        rows: np.ndarray,
        n: int,
        cut: pa.Array,
        docs: pa.Array,
        was_cut: np.ndarray,
        out: Decoded,
    ) -> None:
        """Events whose columns are spelt alike: read at once, their columns converted to the
        contract's types, then applied."""
        rejects = out.rejects
        table, errors = self._parse(self._parser_of(signature), one_per_line(cut), docs, was_cut)
        for local, (reason, detail) in errors.items():
            rejects.add(rows[[local]], reason, detail)
        enveloped = pc.is_valid(table.column(PAYLOAD).combine_chunks())

        def read(path: str) -> pa.Array:
            return pc.if_else(enveloped, _leaf(table, f"{PAYLOAD}.{path}"), _leaf(table, path))

        op = read("op")
        converted = self._converted(signature, rows, n, read, op, out)

        def leaf(path: str) -> pa.Array:
            return converted[path] if path in converted else read(path)

        present = {side: pc.is_valid(read(side)).to_numpy(zero_copy_only=False) for side in ("after", "before")}
        self.apply(rows, n, out, op, read("source.lsn"), read("source.ts_ms"), present, leaf, base64_bytes=True)

    def _converted(
        self,
        signature: tuple[Wire | None, ...],
        rows: np.ndarray,
        n: int,
        read: Callable[[str], pa.Array],
        op: pa.Array,
        out: Decoded,
    ) -> dict[str, pa.Array]:
        """The columns read in a spelling of their own (a numeric's base64, a date's days, a jsonb's
        text ...) as their contract types, by leaf path; a value that does not fit rejects its
        record (a delete's `before` only its key's), naming the column's path."""
        rejects = out.rejects
        ops = pc.fill_null(op, "").to_numpy(zero_copy_only=False)
        converted: dict[str, pa.Array] = {}
        for (name, target), wire in zip(self.columns.items(), signature):
            if wire is None or wire_read_type(wire, target) is None:
                continue
            sides = ("after", "before") if name in self.before_columns else ("after",)
            for side in sides:
                path = f"{side}.{name}"
                value = read(path)
                if value.type == pa.null():
                    continue
                if side == "after" and wire.name == JSON_TEXT and not pa.types.is_string(target):
                    value = self._json_unavailable(name, value, ops == UPDATE_OP, rows, n, out)
                value, problems = to_column(value, wire, target, path, np.arange(len(rows)))
                for local, detail in problems:
                    if side == "after" or ops[local] == DELETE_OP:
                        rejects.add(rows[[local]], Reason.PROPERTY_TYPE_MISMATCH, detail)
                converted[path] = value
        return converted

    def _json_unavailable(
        self, name: str, texts: pa.Array, update: np.ndarray, rows: np.ndarray, n: int, out: Decoded
    ) -> pa.Array:
        """A jsonb read into a struct or map: the placeholder of a value an update left unchanged
        set to null (never parsed), its record noted in `out.unavailable`."""
        lacking = update & pc.fill_null(pc.equal(texts, self.spec.unavailable_text), False).to_numpy(
            zero_copy_only=False
        )
        if not lacking.any():
            return texts
        out.unavailable.setdefault(name, np.zeros(n, dtype=bool))[rows[lacking]] = True
        return pc.if_else(pa.array(lacking), pa.nulls(len(texts), texts.type), texts)

    def apply(
        self,
        rows: np.ndarray,
        n: int,
        out: Decoded,
        op: pa.Array,
        lsn: pa.Array,
        ts_ms: pa.Array,
        present: dict[str, np.ndarray],
        leaf: Callable[[str], pa.Array],
        base64_bytes: bool = False,
    ) -> None:
        """What change events do, whichever converter wrote them: `op` and the leaves of the
        events at rows (`leaf("after.name")`, one value per row), `present` where an event holds
        its `before` / `after` row; `base64_bytes` where the leaves of binary columns are base64
        text (the JSON converter's). Rows the reader rejected are skipped."""
        rejects = out.rejects
        live = rejects.ok[rows]
        no_op = live & pc.is_null(op).to_numpy(zero_copy_only=False)
        rejects.add(
            rows[no_op],
            Reason.NOT_A_CHANGE_EVENT,
            "no 'op' member: not a Debezium change event (before, after, op and source, or {schema, payload})",
        )
        ops = pc.fill_null(op, "").to_numpy(zero_copy_only=False)
        upsert = np.isin(ops, UPSERT_OPS)
        delete = ops == DELETE_OP
        # Only an update can lack a value: the log holds every value of an insert, and a snapshot
        # reads the row.
        update = ops == UPDATE_OP
        odd = live & ~no_op & ~upsert & ~delete
        rejects.add(
            rows[odd],
            Reason.UNKNOWN_OPERATION,
            [f"op {shown(o)} is not c, r, u or d (insert, snapshot read, update, delete)" for o in ops[odd]],
        )
        for side, wanted in (("after", upsert), ("before", delete)):
            missing = rejects.ok[rows] & wanted & ~present[side]
            rejects.add(
                rows[missing],
                Reason.MISSING_ROW,
                f"op {'d' if side == 'before' else 'c/r/u'} without '{side}' (a delete needs the key in "
                "'before': REPLICA IDENTITY DEFAULT or FULL on the source table)",
            )
        deleting = pa.array(delete)
        commit_ms = ts_ms.cast(pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
        for name, value in (("debezium.op", op.cast(pa.string())), ("debezium.lsn", lsn.cast(pa.int64()))):
            _put(out.fields, name, value, rows, n)
        _put(out.fields, "debezium.commit_time", commit_ms, rows, n)
        for name, target in self.columns.items():
            value = leaf(f"after.{name}")
            if name in self.before_columns:
                before = leaf(f"before.{name}")
                # A field the event's schema lacks reads as nulls of no type.
                before = before.cast(value.type) if before.type == pa.null() else before
                value = value.cast(before.type) if value.type == pa.null() else value
                value = pc.if_else(deleting, before, value)
            checked = Rejects(len(rows))
            if base64_bytes and _is_binary(target) and pa.types.is_string(value.type):
                value = _base64_column(value, f"properties.{name}", checked)
            value = self._unavailable(name, value, update, rows, n, out)
            value = _cast_or_reject(value, target, f"properties.{name}", checked)
            rejects.add(rows[~checked.ok], Reason.PROPERTY_TYPE_MISMATCH, list(checked.detail[~checked.ok]))
            out.properties[name] = scatter_into(out.properties[name], value, rows)
        live = rejects.ok[rows]
        out.deletes[rows[live & delete]] = True
        out.srids[rows] = self.spec.epsg
        geometry_rows = pa.array(live & upsert)
        self._geometries(
            leaf(f"after.{self.spec.geometry}.wkb").filter(geometry_rows),
            leaf(f"after.{self.spec.geometry}.srid").filter(geometry_rows),
            rows[live & upsert],
            update[live & upsert],
            out,
        )

    def _unavailable(
        self, name: str, value: pa.Array, update: np.ndarray, rows: np.ndarray, n: int, out: Decoded
    ) -> pa.Array:
        """The values of a column with the connector's placeholder of an unavailable value (text,
        or bytes) set to null, and their records noted in `out.unavailable`."""
        if pa.types.is_string(value.type) or pa.types.is_large_string(value.type):
            placeholder: str | bytes = self.spec.unavailable_text
        elif _is_binary(value.type):
            placeholder = self.spec.unavailable_bytes
        else:
            return value
        if not update.any():
            return value
        lacking = update & pc.fill_null(pc.equal(value, pa.scalar(placeholder, value.type)), False).to_numpy(
            zero_copy_only=False
        )
        if not lacking.any():
            return value
        out.unavailable.setdefault(name, np.zeros(n, dtype=bool))[rows[lacking]] = True
        return pc.if_else(pa.array(lacking), pa.nulls(len(value), value.type), value)

    def _parse(
        self, parser: _BlockParser, cut: pa.Array, docs: pa.Array, was_cut: np.ndarray
    ) -> tuple[pa.Table, dict[int, tuple[Reason, str]]]:
        """The leaves of each event, read from its cut (the payload alone, `_payloads`). An event
        whose cut the reader refuses (a schema that holds the text "payload": itself) is read again
        whole."""
        table, errors = parser.parse(cut)
        again = np.array(sorted(i for i in errors if was_cut[i]), dtype=np.int64)
        if again.size == 0:
            return table, errors
        whole, whole_errors = parser.parse(one_per_line(docs.take(pa.array(again))))
        index = np.arange(len(cut))
        index[again] = len(cut) + np.arange(again.size)
        table = pa.concat_tables([table, whole]).take(pa.array(index))
        errors = {i: e for i, e in errors.items() if not was_cut[i]}
        errors.update({int(again[local]): e for local, e in whole_errors.items()})
        return table, errors

    def _geometries(self, wkb: pa.Array, srid: pa.Array, rows: np.ndarray, update: np.ndarray, out: Decoded) -> None:
        """The geometries of upserts: `wkb` the bytes (Avro) or their base64 text (JSON). An
        update without one lacks a geometry it left unchanged (the connector sends a null struct
        for a TOASTed one under REPLICA IDENTITY DEFAULT): an upsert table keeps the key's current
        geometry, so the row is valid without one."""
        rejects, where = out.rejects, f"after.{self.spec.geometry}"
        missing = pc.is_null(wkb).to_numpy(zero_copy_only=False)
        lacking = missing & update
        if self.contract.mode == "upsert":
            out.geometry_unavailable[rows[lacking]] = True
        else:
            rejects.add(
                rows[lacking],
                Reason.UNAVAILABLE_VALUE,
                f"{where}: an update without the geometry it left unchanged (a TOASTed value under REPLICA "
                f"IDENTITY DEFAULT), and a {self.contract.mode} table keeps no current row to take it from; "
                "set REPLICA IDENTITY FULL on the source table, or the connector's reselect post-processor "
                "(post.processors=reselector, reselector.reselect.unavailable.values=true)",
            )
        rejects.add(rows[missing & ~update], Reason.MISSING_GEOMETRY, f"{where}: missing or null")
        keep = pa.array(~missing)
        rows, wkb, srid = rows[~missing], wkb.filter(keep), srid.filter(keep)
        if pa.types.is_string(wkb.type):
            blobs, ok = base64_decode(wkb)
            rejects.add(
                rows[~ok],
                Reason.BAD_GEOMETRY_ENCODING,
                [f"{where}.wkb: {shown(v)} is not base64 text" for v in wkb.filter(pa.array(~ok)).to_pylist()],
            )
        else:
            blobs, ok = wkb.cast(pa.binary()), np.ones(len(wkb), dtype=bool)
        given = pc.fill_null(srid.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)[ok]
        rows, blobs = rows[ok], blobs.filter(pa.array(ok))
        read_rows, codes, geoms = read_wkb(blobs, rows, out, self.contract, self.max_nesting, f"{where}.wkb")
        given = given[np.isin(rows, read_rows)]
        # PostGIS's EWKB carries the SRID; else the struct's, else (0: unknown) the contract's CRS.
        has_srid = (codes & EWKB_SRID_FLAG) != 0
        fallback = np.where(given > 0, given, self.spec.epsg)
        out.srids[read_rows] = np.where(has_srid, shapely.get_srid(geoms), fallback)
        # Plain WKB points are read as if in the table CRS: these may be in another.
        plain = ~np.isnan(out.points_xy[read_rows, 0]) & ~has_srid & (fallback != self.contract.geometry.epsg)
        moved = read_rows[plain]
        out.geoms[moved] = shapely.points(out.points_xy[moved])
        out.points_xy[moved] = np.nan
        out.wkb[moved] = None

    def decode_tombstones(self, keys: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        """Tombstones (null values) of these Kafka keys: deletes of the keys' rows."""
        avro = starts_with_zero(keys, rows)
        if avro.any():
            self.avro.decode_keys(keys, rows[avro], out)
        rows = rows[~avro]
        if rows.size == 0:
            return
        n = len(keys)
        rejects = out.rejects
        docs = keys.take(pa.array(rows)).cast(pa.binary())
        rejects.add(rows[_invalid_utf8(docs)], Reason.MALFORMED_JSON, "the tombstone's key is not valid UTF-8 JSON")
        rows, docs = _still_ok(rows, docs, rejects)
        if rows.size == 0:
            return
        table, errors = self.key_parser.parse(one_per_line(docs))
        for local, (reason, detail) in errors.items():
            rejects.add(rows[[local]], reason, f"the tombstone's key: {detail}")
        enveloped = pc.is_valid(table.column(PAYLOAD).combine_chunks())
        for name in self.contract.primary_key:
            source = self.source_name(name)
            value = pc.if_else(enveloped, _leaf(table, f"{PAYLOAD}.{source}"), _leaf(table, source))
            out.properties[source] = pc.coalesce(out.properties[source], scatter(value, rows, n))
        out.deletes[rows[rejects.ok[rows]]] = True

    def unmapped_fields(
        self,
        values: pa.Array,
        rows: np.ndarray,
        mapped: frozenset[str],
        order: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> dict[str, PropertySeen]:
        """The source columns in these events' `after` that no contract column reads: what a
        column added with ALTER TABLE brings, for schema evolution."""
        avro = starts_with_zero(values, rows)
        seen: dict[str, PropertySeen] = {}
        if avro.any():
            part = np.flatnonzero(avro)
            seen = self.avro.unmapped_fields(values, rows[part], mapped, tuple(o[part] for o in order))
            rows, order = rows[~avro], (order[0][~avro], order[1][~avro], order[2][~avro])
        if rows.size == 0:
            return seen
        docs, _ = _payloads(values.take(pa.array(rows)))
        # The JSON converter writes the schema (or the payload) as the first member of an enveloped event.
        enveloped = pc.match_substring_regex(docs, r'^\s*\{\s*"(schema|payload)"\s*:').to_numpy(zero_copy_only=False)
        taken = mapped | {self.spec.geometry}
        for mask, member in ((enveloped, (PAYLOAD, "after")), (~enveloped, ("after",))):
            if mask.any():
                positions = np.flatnonzero(mask)
                part_order = (order[0][positions], order[1][positions], order[2][positions])
                merge_seen(seen, unmapped_properties(docs.take(pa.array(positions)), taken, part_order, member))
        return seen


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _base64_column(texts: pa.Array, label: str, checked: Rejects) -> pa.Array:
    """The bytes of a binary column's base64 text; a text that is none rejects its record."""
    blobs, ok = base64_decode(texts)
    # base64_decode refuses the empty text, which is the empty bytea's.
    ok |= pc.fill_null(pc.equal(texts, ""), True).to_numpy(zero_copy_only=False)
    bad = ~ok
    if bad.any():
        checked.add(
            bad,
            Reason.PROPERTY_TYPE_MISMATCH,
            [f"{label}: {shown(v)} is not base64 text" for v in texts.filter(pa.array(bad)).to_pylist()],
        )
    return pc.if_else(pc.is_null(texts), pa.nulls(len(texts), pa.binary()), blobs)


def _put(fields: dict[str, pa.Array], name: str, value: pa.Array, rows: np.ndarray, n: int) -> None:
    """value[i] into row rows[i] of the field (JSON and Avro events of a batch fill it in turn)."""
    fields[name] = scatter(value, rows, n) if name not in fields else scatter_into(fields[name], value, rows)


def _payloads(docs: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Each enveloped event (`{"schema": ..., "payload": {...}}`, as the JSON converter writes it)
    cut down to its payload, the others as they are; and which were cut. Over the whole batch: the
    kept bytes of every event gathered at once."""
    docs = docs.cast(pa.binary())
    if len(docs) == 0:
        return docs, np.zeros(0, dtype=bool)
    at = pc.find_substring(docs, _PAYLOAD_MEMBER).to_numpy(zero_copy_only=False)
    cut = (
        pc.fill_null(pc.starts_with(docs, _SCHEMA_FIRST), False).to_numpy(zero_copy_only=False)
        & pc.fill_null(pc.ends_with(docs, "}"), False).to_numpy(zero_copy_only=False)
        & (at > 0)
    )
    if not cut.any():
        return docs, cut
    offsets, data = offsets_and_bytes(docs)
    offsets = offsets.astype(np.int64)
    start = offsets[:-1] + np.where(cut, at + len(_PAYLOAD_MEMBER), 0)
    end = offsets[1:] - cut  # the envelope's closing brace
    lengths = end - start
    new_offsets = np.concatenate([[0], np.cumsum(lengths)])
    gather = np.arange(new_offsets[-1]) + np.repeat(start - new_offsets[:-1], lengths)
    out = pa.Array.from_buffers(
        pa.binary(),
        len(docs),
        [None, pa.py_buffer(new_offsets.astype(np.int32).tobytes()), pa.py_buffer(data[gather].tobytes())],
    )
    return out, cut
