"""The contract's columns of each record: from the GeoJSON Feature's id and properties, a JSON
event's fields (`json.<path>`), the Kafka
key, timestamp, topic, partition and offset, a Kafka header, or the asset key of a raster row, the first source that is set
winning; each cast to its column's type, a value that does not fit rejecting its record."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming.contract import ASSET_KEY_SOURCE, DEBEZIUM_SOURCES, JSON_SOURCE_PREFIX, Column, Contract
from streaming.decode.rejects import Reason, Rejects, shown


def property_types(contract: Contract) -> dict[str, pa.DataType]:
    """The GeoJSON properties the contract reads (`properties.<name>` sources) and their column
    types, as the data files hold them (the formats read them so; ColumnMapper makes them the
    types the rows travel in)."""
    schema = contract.data_file_schema
    types: dict[str, pa.DataType] = {}
    for col in contract.all_columns:
        for src in col.sources:
            if src.startswith("properties."):
                types[src.removeprefix("properties.")] = schema.field(col.name).type
    return types


def json_field_types(contract: Contract) -> dict[str, pa.DataType]:
    """The JSON event fields the contract's columns read (`json.<path>` sources), by path, and
    their column types as the data files hold them."""
    schema = contract.data_file_schema
    types: dict[str, pa.DataType] = {}
    for col in contract.all_columns:
        for src in col.sources:
            if src.startswith(JSON_SOURCE_PREFIX):
                types[src.removeprefix(JSON_SOURCE_PREFIX)] = schema.field(col.name).type
    return types


def unavailable_of(col: Column, unavailable: dict[str, np.ndarray]) -> np.ndarray | None:
    """The records whose value of one of the column's properties was unavailable (None: no such
    property), from a format's per-property masks."""
    names = [src.removeprefix("properties.") for src in col.sources if src.startswith("properties.")]
    masks = [unavailable[name] for name in names if name in unavailable]
    return np.logical_or.reduce(masks) if masks else None


class ColumnMapper:
    def __init__(self, contract: Contract):
        self.contract = contract
        self._data_schema = contract.arrow_schema

    def map(
        self,
        batch: pa.RecordBatch,
        feature_ids: pa.Array,
        properties: dict[str, pa.Array],
        rejects: Rejects,
        fields: dict[str, pa.Array] | None = None,
        parts: pa.Array | None = None,
        unavailable: dict[str, np.ndarray] | None = None,
    ) -> dict[str, pa.Array]:
        """Each contract column of each record, from the first of its sources that is set; a
        required column none of them sets rejects the record, unless its value is one the record
        did not carry (`unavailable`, per property: the upsert pass keeps the key's current one)."""
        columns: dict[str, pa.Array] = {}
        for col in self.contract.all_columns:
            target = self._data_schema.field(col.name).type
            merged: pa.Array | None = None
            for src in col.sources:
                wanted = None if merged is None else pc.is_null(merged)
                candidate = self._source_array(
                    batch, src, feature_ids, properties, fields or {}, col, target, rejects, wanted, parts
                )
                merged = candidate if merged is None else pc.coalesce(merged, candidate)
            if col.required:
                missing = rejects.ok & pc.is_null(merged).to_numpy(zero_copy_only=False)
                lacking = unavailable_of(col, unavailable or {})
                if lacking is not None:
                    missing &= ~lacking
                rejects.add(
                    missing,
                    Reason.MISSING_REQUIRED_FIELD,
                    f"{col.name}: required, but none of {list(col.sources)} is set",
                )
            columns[col.name] = merged
        return columns

    def _source_array(
        self,
        batch: pa.RecordBatch,
        src: str,
        feature_ids: pa.Array,
        properties: dict[str, pa.Array],
        fields: dict[str, pa.Array],
        col: Column,
        target: pa.DataType,
        rejects: Rejects,
        wanted: pa.Array | None,
        parts: pa.Array | None = None,
    ) -> pa.Array:
        """Values of one source as the column's type, for the rows in `wanted` (all if None)."""
        if src.startswith("properties."):
            return _travelling(properties[src.removeprefix("properties.")], target)
        if src.startswith(JSON_SOURCE_PREFIX) or src in DEBEZIUM_SOURCES:
            # A change event's op, LSN and commit time are among the fields under their source's name.
            path = src.removeprefix(JSON_SOURCE_PREFIX)
            raw = _travelling(fields[path], target) if path in fields else pa.nulls(batch.num_rows, target)
            if wanted is not None:
                raw = pc.if_else(wanted, raw, pa.nulls(len(raw), raw.type))
            return _cast_or_reject(raw, target, f"{col.name} (from {src})", rejects)
        if src == "id":
            raw = feature_ids
        elif src == ASSET_KEY_SOURCE:
            raw = parts if parts is not None else pa.nulls(batch.num_rows, pa.string())
        elif src == "kafka.key":
            raw = batch.column("key")
        elif src == "kafka.timestamp":
            raw = batch.column("timestamp")
        elif src in ("kafka.topic", "kafka.partition", "kafka.offset"):
            raw = batch.column(src.removeprefix("kafka."))
        else:
            raw = header_values(batch, src.removeprefix("kafka.headers."))
        if wanted is not None:
            raw = pc.if_else(wanted, raw, pa.nulls(len(raw), raw.type))
        return _cast_or_reject(raw, target, f"{col.name} (from {src})", rejects)


def _travelling(values: pa.Array, target: pa.DataType) -> pa.Array:
    """A format's values of a column (in the data files' type) in the type rows travel in."""
    return values if values.type == target or values.type == pa.null() else values.cast(target)


def header_values(batch: pa.RecordBatch, name: str) -> pa.Array:
    n = batch.num_rows
    if "headers" not in batch.schema.names:
        return pa.nulls(n, pa.binary())
    headers = batch.column("headers")
    flat = pc.list_flatten(headers)
    if len(flat) == 0:
        return pa.nulls(n, pa.binary())
    parents = pc.list_parent_indices(headers).to_numpy()
    hits = pc.fill_null(pc.equal(flat.field("key"), name), False).to_numpy(zero_copy_only=False)
    positions = np.full(n, -1, dtype=np.int64)
    # The last header of a name wins, as Kafka clients do when reading a single value.
    positions[parents[hits]] = np.flatnonzero(hits)
    found = positions >= 0
    values = flat.field("value")
    taken = values.take(pa.array(np.where(found, positions, 0)))
    return pc.if_else(pa.array(found), taken, pa.nulls(n, values.type))


def _cast_or_reject(raw: pa.Array, target: pa.DataType, label: str, rejects: Rejects) -> pa.Array:
    if raw.type == target:
        return raw
    if pa.types.is_binary(raw.type) and pa.types.is_string(target):
        try:
            return raw.cast(target)
        except pa.ArrowInvalid:
            return _cast_each(raw.to_pylist(), target, label, rejects, lambda b: b.decode("utf-8"))
    try:
        return raw.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if pa.types.is_binary(raw.type):
            return _cast_each(
                raw.to_pylist(), target, label, rejects, lambda b: pa.scalar(b.decode("utf-8")).cast(target).as_py()
            )
        return _cast_each(raw.to_pylist(), target, label, rejects, lambda v: pa.scalar(v).cast(target).as_py())


def _cast_each(values: list, target: pa.DataType, label: str, rejects: Rejects, convert) -> pa.Array:
    out: list[object] = []
    for i, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        try:
            out.append(convert(value))
        except (ValueError, TypeError, UnicodeDecodeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            rejects.add(np.array([i]), Reason.PROPERTY_TYPE_MISMATCH, f"{label}: {shown(value)} is not a {target}")
            out.append(None)
    return pa.array(out, target)
