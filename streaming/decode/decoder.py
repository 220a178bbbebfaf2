"""Decode, validate and reproject a batch of Kafka records: Arrow in, Arrow out.

Input is the Kafka source's batch (key, value, topic, partition, offset, timestamp, headers);
headers come as a list of (key, value) structs, or as the JSON text Spark's to_json makes of them
(values base64), which is how the streaming job hands them over (see `headers_from_json`).
Output has one row per input row (or, for a format whose records make several rows, a STAC Item
read as one row per asset, one per such row, the record's Kafka fields repeated): the contract's columns, the WKB geometry in the table CRS,
its bbox, its Hilbert key and the record's source coordinates. A record that cannot be used
keeps its row, with a stable reason code and a message naming the offending field or value,
so nothing is dropped silently: the caller routes rejects to the dead-letter topic.

This module is the batch: the checks of a whole record (null, size), which format reads each
value (streaming/decode/formats/, by its first significant byte), then the geometry rules
(streaming/decode/validate.py) and the contract's columns (streaming/decode/columns.py) for every format alike,
and the output batch. Every step is vectorised over the batch.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from streaming.contract import Contract
from streaming.decode.columns import ColumnMapper, property_types, unavailable_of
from streaming.decode.covering import covering_array, covering_bounds
from streaming.decode.formats import INPUT_FORMATS, Decoded
from streaming.decode.formats.debezium import DebeziumFormat
from streaming.decode.formats.wkb import to_stored_wkb
from streaming.decode.properties import (
    OFF_SAMPLE,
    OFF_SAMPLE_EVERY,
    PropertySeen,
    mapped_names,
    merge_seen,
    record_order,
    unmapped_properties,
)
from streaming.decode.rejects import Reason, Rejects
from streaming.decode.schema_registry import RegistrySettings, RegistryUnavailable
from streaming.decode.validate import GeometryRules
from streaming.kernels.buffers import NONE, offsets_and_bytes, scatter_into
from streaming.kernels.hilbert import hilbert_keys_of_bounds

log = logging.getLogger("geoingest.decode")

# Columns the decoder adds beside the contract's: where the record came from, and its fate.
HILBERT = "_hilbert"
SOURCE_TOPIC = "_source_topic"
SOURCE_PARTITION = "_source_partition"
SOURCE_OFFSET = "_source_offset"
SOURCE_TIMESTAMP = "_source_timestamp"
REJECT_REASON = "_reject_reason"
REJECT_DETAIL = "_reject_detail"
RAW_KEY = "_raw_key"
RAW_VALUE = "_raw_value"
RAW_HEADERS = "_raw_headers"
# True where a valid record deletes its key (a change event's delete, a tombstone the format reads):
# the row holds the primary key columns only, and the upsert pass applies it as a tombstone.
DELETE = "_delete"
# The contract columns whose value the record did not carry (null where it carried all): Debezium's
# placeholder of a TOASTed value an update left unchanged. The row holds null there, and the upsert
# pass keeps the key's current value (streaming/write/versions.py); an unavailable geometry leaves
# the row without geometry, bbox and Hilbert key, valid all the same.
UNAVAILABLE = "_unavailable"
UNAVAILABLE_TYPE = pa.list_(pa.string())

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_JSON_WHITESPACE = (0x20, 0x09, 0x0D, 0x0A)


@dataclass(frozen=True)
class DecodeOptions:
    max_message_bytes: int = 1024 * 1024
    max_vertices: int = 100_000
    max_record_seconds: float = 2.0
    # Geometries nested in geometries (GeometryCollection, Multi*, Feature in a geometry member):
    # GEOS reads and walks them recursively, and a few thousand levels overflow its stack.
    max_nesting: int = 32
    # The schema registry of registry-encoded formats (Avro in the Confluent wire format).
    schema_registry: RegistrySettings = RegistrySettings()


def decoded_schema(contract: Contract) -> pa.Schema:
    """Schema of `Decoder.decode` output: every field nullable, since reject rows carry no data."""
    data = contract.arrow_schema
    fields = [pa.field(f.name, f.type, nullable=True) for f in data]
    fields += [
        pa.field(HILBERT, pa.int64()),
        pa.field(SOURCE_TOPIC, pa.string()),
        pa.field(SOURCE_PARTITION, pa.int32()),
        pa.field(SOURCE_OFFSET, pa.int64()),
        pa.field(SOURCE_TIMESTAMP, pa.timestamp("us", tz="UTC")),
        pa.field(REJECT_REASON, pa.string()),
        pa.field(REJECT_DETAIL, pa.string()),
        pa.field(RAW_KEY, pa.binary()),
        pa.field(RAW_VALUE, pa.binary()),
        pa.field(RAW_HEADERS, HEADERS_TYPE),
        pa.field(DELETE, pa.bool_()),
        pa.field(UNAVAILABLE, UNAVAILABLE_TYPE),
    ]
    return pa.schema(fields)


class Decoder:
    def __init__(self, contract: Contract, options: DecodeOptions | None = None):
        self.contract = contract
        self.options = options or DecodeOptions()
        self.schema = decoded_schema(contract)
        self._data_schema = contract.arrow_schema
        self._table_epsg = contract.geometry.epsg
        self._property_types = property_types(contract)
        formats = [
            f(contract, self.options.max_nesting, self._property_types) for f in INPUT_FORMATS if f.active(contract)
        ]
        registry = [f for f in formats if f.registry_encoded and set(f.names) & set(contract.formats)]
        self._formats = registry or [f for f in formats if not f.registry_encoded]
        # The registry formats, and those that read registry-encoded values beside others (Debezium's).
        for fmt in self._formats:
            fmt.use_registry(self.options.schema_registry)
        self._tombstones = next((f for f in self._formats if f.reads_tombstones), None)
        self._rules = GeometryRules(contract, self.options.max_vertices, self.options.max_record_seconds)
        self._columns = ColumnMapper(contract)
        # Property names no column maps, seen in a sample of each batch's GeoJSON records.
        self.unmapped: dict[str, PropertySeen] = {}
        self._decoded_batches = 0
        self._mapped = mapped_names(contract)
        described = list(dict.fromkeys(f.described for f in self._formats))
        shown = list(dict.fromkeys(b for f in self._formats for b in f.first_bytes_shown))
        self._unknown_format = (
            f"value is neither {', '.join(described[:-1])} nor {described[-1]} "
            f"(first byte is not {', '.join(shown[:-1])} or {shown[-1]})"
        )

    # -- entry point ---------------------------------------------------------------------------
    def decode(self, batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        """Every input row comes out, valid or with a reason: no input bytes make this raise."""
        batch = _normalized(batch)
        try:
            return self._decode(batch)
        except RegistryUnavailable:
            raise  # every record behind it would fail alike: stop, naming the registry
        except Exception as exc:  # noqa: BLE001 - isolate the record behind a defect, keep the stream going
            log.warning(
                "decoder failed on a batch; isolating the record",
                extra={"summary": {"rows": batch.num_rows, "error": f"{type(exc).__name__}: {exc}"[:500]}},
            )
            return self._decode_isolating(batch, exc)

    def _decode_isolating(self, batch: pa.RecordBatch, exc: Exception) -> pa.RecordBatch:
        if batch.num_rows == 1:
            return self.failed(batch, f"the decoder failed on this record: {type(exc).__name__}: {str(exc)[:300]}")
        half = batch.num_rows // 2
        parts = []
        for part in (batch.slice(0, half), batch.slice(half)):
            try:
                parts.append(self._decode(part))
            except RegistryUnavailable:
                raise
            except Exception as part_exc:  # noqa: BLE001
                parts.append(self._decode_isolating(part, part_exc))
        return pa.Table.from_batches(parts, schema=self.schema).combine_chunks().to_batches()[0]

    def failed(self, batch: pa.RecordBatch, detail: str) -> pa.RecordBatch:
        """One record the decoder itself could not handle, as a decode_failed reject."""
        batch = _normalized(batch)
        rejects = Rejects(1)
        rejects.add(np.array([0]), Reason.DECODE_FAILED, detail)
        columns = {col.name: pa.nulls(1, self._data_schema.field(col.name).type) for col in self.contract.all_columns}
        return self._assemble(
            batch,
            columns,
            np.full(1, None, dtype=object),
            rejects,
            np.full(1, None, dtype=object),
            np.full((1, 2), np.nan),
        )

    def _decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        values = batch.column("value")
        rejects = Rejects(n)

        lengths = pc.fill_null(pc.binary_length(values), -1).to_numpy(zero_copy_only=False)
        tombstones = np.zeros(n, dtype=bool)
        if self._tombstones is not None and "key" in batch.schema.names:
            tombstones = (lengths < 0) & pc.is_valid(batch.column("key")).to_numpy(zero_copy_only=False)
        rejects.add((lengths < 0) & ~tombstones, Reason.NULL_VALUE, "the Kafka record has a null value")
        sizes = _record_bytes(batch)
        too_big = rejects.ok & (sizes > self.options.max_message_bytes)
        rejects.add(
            too_big,
            Reason.MESSAGE_TOO_LARGE,
            [
                f"record of {int(b)} bytes (key + value + headers) exceeds "
                f"max_message_bytes={self.options.max_message_bytes}"
                for b in sizes[too_big]
            ],
        )

        # A record that makes several rows (a STAC Item, one per asset) is repeated over them.
        exploded = next((e for f in self._formats if (e := f.explode(values, rejects.ok)) is not None), None)
        if exploded is not None:
            batch = batch.take(pa.array(exploded.parents))
            values, n, rejects = batch.column("value"), batch.num_rows, rejects.take(exploded.parents)
            tombstones = tombstones[exploded.parents]
        decoded = Decoded.empty(n, self._table_epsg, self._property_types, rejects)
        decoded.exploded = exploded

        # Each value goes to the format its first significant byte names.
        first = first_significant_byte(values, rejects.ok)
        claimed = [np.zeros(n, dtype=bool) for _ in self._formats]
        taken = np.zeros(n, dtype=bool)
        for i in sorted(range(len(self._formats)), key=lambda i: -self._formats[i].precedence):
            claimed[i] = self._formats[i].claims(values, first) & ~taken
            taken |= claimed[i]
        unknown = rejects.ok & ~np.logical_or.reduce(claimed) & ~tombstones
        for fmt in self._formats:
            for byte, (reason, detail) in fmt.refused_first_bytes.items():
                rejects.add(unknown & (first == byte), reason, detail)
        rejects.add(unknown, Reason.UNKNOWN_FORMAT, self._unknown_format)
        for fmt, mine in zip(self._formats, claimed):
            rows = np.flatnonzero(mine & rejects.ok)
            if rows.size:
                fmt.decode(values, rows, decoded)
                # Of the records the format read (a record it rejected may be anything).
                sample = rows[decoded.rejects.ok[rows]][:OFF_SAMPLE]
                if sample.size and self._decoded_batches % OFF_SAMPLE_EVERY == 0:
                    if "geojson" in fmt.names:
                        seen = unmapped_properties(
                            values.take(pa.array(sample)), self._mapped, record_order(batch, sample)
                        )
                        merge_seen(self.unmapped, seen)
                    elif isinstance(fmt, DebeziumFormat):
                        order = record_order(batch, sample)
                        merge_seen(self.unmapped, fmt.unmapped_fields(values, sample, self._mapped, order))

        if self._tombstones is not None:
            rows = np.flatnonzero(tombstones & rejects.ok)
            if rows.size:
                self._tombstones.decode_tombstones(batch.column("key"), rows, decoded)

        deletes = decoded.deletes
        # Deletes carry no geometry, nor do updates whose geometry was unavailable.
        with rejects.set_aside(deletes | decoded.geometry_unavailable):
            self._rules.apply(decoded)
        self._decoded_batches += 1
        parts = None if exploded is None else pa.array(exploded.parts, pa.string())
        with rejects.set_aside(deletes):
            columns = self._columns.map(
                batch, decoded.feature_ids, decoded.properties, rejects, decoded.fields, parts, decoded.unavailable
            )
        if deletes.any():
            self._check_delete_keys(columns, deletes, rejects)
        return self._assemble(
            batch,
            columns,
            decoded.geoms,
            rejects,
            decoded.wkb,
            decoded.points_xy,
            decoded.bounds,
            decoded.raster,
            deletes,
            decoded.geometry_unavailable,
            self._unavailable_lists(columns, decoded, rejects.ok & ~deletes),
        )

    def _unavailable_lists(self, columns: dict[str, pa.Array], decoded: Decoded, valid: np.ndarray) -> pa.Array:
        """Per valid row, the contract columns whose value its record did not carry (null: none)."""
        n = len(valid)
        names, lacking = [], []
        for col in self.contract.all_columns:
            lacks = unavailable_of(col, decoded.unavailable)
            if lacks is not None:
                # Another of the column's sources may have given it a value.
                lacking.append(lacks & pc.is_null(columns[col.name]).to_numpy(zero_copy_only=False))
                names.append(col.name)
        if decoded.geometry_unavailable.any():
            lacking.append(decoded.geometry_unavailable)
            names.append(self.contract.geometry.name)
        if not names:
            return pa.nulls(n, UNAVAILABLE_TYPE)
        table = np.stack(lacking, axis=1) & valid[:, None]
        counts = table.sum(axis=1)
        if not counts.any():
            return pa.nulls(n, UNAVAILABLE_TYPE)
        offsets = pa.array(np.r_[0, np.cumsum(counts)].astype(np.int32))
        values = pa.array(names, pa.string()).take(pa.array(np.nonzero(table)[1]))
        return pa.ListArray.from_arrays(offsets, values, mask=pa.array(counts == 0))

    def _check_delete_keys(self, columns: dict[str, pa.Array], deletes: np.ndarray, rejects: Rejects) -> None:
        """A delete must name its whole key: the other columns are not in it."""
        for name in self.contract.primary_key:
            missing = deletes & rejects.ok & pc.is_null(columns[name]).to_numpy(zero_copy_only=False)
            rejects.add(missing, Reason.MISSING_REQUIRED_FIELD, f"{name}: a delete names no value of this key column")

    def _assemble(
        self,
        batch: pa.RecordBatch,
        columns: dict[str, pa.Array],
        geoms: np.ndarray,
        rejects: Rejects,
        wkb: np.ndarray,
        points_xy: np.ndarray,
        given_bounds: np.ndarray | None = None,
        raster: pa.Array | None = None,
        deletes: np.ndarray | None = None,
        no_geometry: np.ndarray | None = None,
        unavailable: pa.Array | None = None,
    ) -> pa.RecordBatch:
        n = batch.num_rows
        deleting = np.zeros(n, dtype=bool) if deletes is None else deletes & rejects.ok
        # The rows that get a geometry: the valid ones, but for deletes and those whose geometry
        # their record did not carry.
        ok = rejects.ok & ~deleting
        if no_geometry is not None:
            ok &= ~no_geometry
        keep = np.where(ok, geoms, NONE)
        wkb = np.where(ok, wkb, NONE)
        unwritten = ok & np.equal(wkb, NONE)
        wkb[unwritten] = to_stored_wkb(geoms[unwritten])
        bounds = covering_bounds(keep, points_xy, self.contract.geometry.antimeridian)
        if given_bounds is not None:
            # A raster's bounds are its own (Havasu's raster bounds), not its footprint polygon's.
            given = ok & np.isfinite(given_bounds).all(axis=1)
            bounds[given] = given_bounds[given]
        extent = self.contract.clustering.extent
        keys = np.zeros(n, dtype=np.int64)
        if ok.any():
            b = bounds[ok]
            keys[ok] = hilbert_keys_of_bounds(
                b[:, 0], b[:, 1], b[:, 2], b[:, 3], extent, self.contract.clustering.hilbert_bits
            )
        # Rows without a box (an update whose geometry was unavailable) still cast to the row type.
        bbox = covering_array(bounds, ok, self.schema.field(self.contract.bbox_name).type)
        out: dict[str, pa.Array] = dict(columns)
        out[self.contract.geometry.name] = pa.array(wkb, pa.binary())
        out[self.contract.bbox_name] = bbox
        if self.contract.raster is not None:
            raster_type = self.schema.field(self.contract.raster.name).type
            if raster is None:
                out[self.contract.raster.name] = pa.nulls(n, raster_type)
            else:
                out[self.contract.raster.name] = pc.if_else(pa.array(ok), raster, pa.nulls(n, raster.type))
        out[HILBERT] = pa.array(keys, pa.int64(), mask=~ok)
        out[SOURCE_TOPIC] = batch.column("topic").cast(pa.string())
        out[SOURCE_PARTITION] = batch.column("partition").cast(pa.int32())
        out[SOURCE_OFFSET] = batch.column("offset").cast(pa.int64())
        out[SOURCE_TIMESTAMP] = batch.column("timestamp").cast(pa.timestamp("us", tz="UTC"))
        out[DELETE] = pa.array(deleting, pa.bool_())
        out[UNAVAILABLE] = unavailable if unavailable is not None else pa.nulls(n, UNAVAILABLE_TYPE)
        out[REJECT_REASON] = pa.array(rejects.reason, pa.string())
        out[REJECT_DETAIL] = pa.array(rejects.detail, pa.string())
        # The raw record is kept for rejects only (their dead letters).
        ok = rejects.ok
        rejected = pa.array(ok)
        for name, source, raw_type in (
            (RAW_KEY, "key", pa.binary()),
            (RAW_VALUE, "value", pa.binary()),
            (RAW_HEADERS, "headers", HEADERS_TYPE),
        ):
            if ok.all() or source not in batch.schema.names:
                out[name] = pa.nulls(n, raw_type)
            else:
                out[name] = pc.if_else(rejected, pa.nulls(n, raw_type), batch.column(source).cast(raw_type))
        arrays = [out[f.name].cast(f.type) if out[f.name].type != f.type else out[f.name] for f in self.schema]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def first_significant_byte(values: pa.Array, live: np.ndarray) -> np.ndarray:
    """First byte of each value after leading JSON whitespace; -1 where there is none."""
    values = values.cast(pa.binary())
    n = len(values)
    offsets, data = offsets_and_bytes(values)
    lengths = np.diff(offsets)
    has_byte = live & (lengths > 0)
    first = np.full(n, -1, dtype=np.int64)
    first[has_byte] = data[offsets[:-1][has_byte]]
    # Leading whitespace is only legal before JSON, and rare: strip it row by row.
    for i in np.flatnonzero(np.isin(first, _JSON_WHITESPACE)):
        stripped = values[int(i)].as_py().lstrip(b" \t\r\n")
        first[i] = stripped[0] if stripped else -1
    return first


def _record_bytes(batch: pa.RecordBatch) -> np.ndarray:
    """Key + value + header keys and values of each record, in bytes."""
    n = batch.num_rows
    size = np.zeros(n, dtype=np.int64)
    for name in ("key", "value"):
        if name in batch.schema.names:
            size += pc.fill_null(pc.binary_length(batch.column(name)), 0).to_numpy(zero_copy_only=False)
    if "headers" in batch.schema.names:
        headers = batch.column("headers")
        flat = pc.list_flatten(headers)
        if len(flat):
            each = pc.add(
                pc.fill_null(pc.binary_length(pc.struct_field(flat, "key")), 0),
                pc.fill_null(pc.binary_length(pc.struct_field(flat, "value")), 0),
            )
            size += np.bincount(
                pc.list_parent_indices(headers).to_numpy(), weights=each.to_numpy(), minlength=n
            ).astype(np.int64)
    return size


def _normalized(batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """One record batch, its headers as a list of structs."""
    if isinstance(batch, pa.Table):
        batch = (
            batch.combine_chunks().to_batches()[0]
            if batch.num_rows
            else pa.RecordBatch.from_pylist([], schema=batch.schema)
        )
    if "headers" in batch.schema.names and pa.types.is_string(batch.schema.field("headers").type):
        batch = batch.set_column(
            batch.schema.get_field_index("headers"), "headers", headers_from_json(batch.column("headers"))
        )
    return batch


def headers_from_json(headers: pa.Array) -> pa.Array:
    """Kafka headers from the JSON text Spark's to_json writes of them ('[{"key":"k","value":"<base64>"}]',
    a header with a null value has no "value") to a list of (key, value) structs.

    Spark converts arrays to Arrow an order of magnitude slower than strings (measured: 60k against
    200k+ records/s on 2 cores, even for empty arrays), so the job sends the headers as text; most
    records have none ('[]'), and only those that do are parsed here."""
    n = len(headers)
    has_any = pc.fill_null(pc.greater(pc.binary_length(headers), 2), False).to_numpy(zero_copy_only=False)
    if not has_any.any():
        return pc.if_else(pc.is_null(headers), pa.nulls(n, HEADERS_TYPE), pa.array([[]] * n, HEADERS_TYPE))
    rows = np.flatnonzero(has_any)
    lines = pc.binary_join_element_wise('{"h":', headers.take(pa.array(rows)), "}", "")
    text = pa.py_buffer("\n".join(lines.to_pylist()).encode())
    parsed = pa_json.read_json(
        pa.BufferReader(text),
        read_options=pa_json.ReadOptions(use_threads=False, block_size=max(text.size + 1, 1 << 20)),
        parse_options=pa_json.ParseOptions(
            explicit_schema=pa.schema([("h", pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())])))])
        ),
    )
    lists = parsed.column("h").combine_chunks()
    flat = pc.list_flatten(lists)
    values = pa.array(
        [None if v is None else base64.b64decode(v) for v in flat.field("value").to_pylist()], pa.binary()
    )
    decoded = pa.ListArray.from_arrays(
        lists.offsets, pa.StructArray.from_arrays([flat.field("key"), values], fields=list(HEADERS_TYPE.value_type))
    )
    empty = pc.if_else(pc.is_null(headers), pa.nulls(n, HEADERS_TYPE), pa.array([[]] * n, HEADERS_TYPE))
    return scatter_into(empty, decoded, rows)
