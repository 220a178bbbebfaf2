"""The Iceberg catalog and the tables made from contracts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import requests
import requests.adapters
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.table import Table
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
from pyiceberg.types import IcebergType, StructType

from streaming.contract import (
    CELL_PROPERTY_PREFIX,
    EVENT_TIME_PROPERTY,
    PRIMITIVE_TYPES,
    Column,
    Contract,
    check_fresh_ids,
)
from streaming.contract.partition import CellColumn, cell_field
from streaming.contract.types import grown_from
from streaming.table.native import native_catalog
from streaming.write.partitions import LayoutField, PartitionLayout
from streaming.write.rejects_table import REJECTS_SCHEMA, REJECTS_SPEC


class TableMismatch(RuntimeError):
    """The table exists, but was made from another contract."""


# A catalog property of ours: seconds a REST catalog request may take before it counts as failed.
REST_TIMEOUT = "geoingest.rest.request-timeout-s"
DEFAULT_REST_TIMEOUT_S = 60.0


def open_catalog(name: str, properties: dict[str, str]) -> Catalog:
    props = dict(properties)
    timeout_s = float(props.pop(REST_TIMEOUT, DEFAULT_REST_TIMEOUT_S))
    uri = props.get("uri", "")
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    warehouse = props.get("warehouse", "")
    if warehouse.startswith("file://"):
        Path(warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    # pyiceberg's SQL catalog creates its two tables on a fresh database by "check, then create": a
    # second opener of the same fresh file (a service's thread, `geoingest status`) can lose that
    # race, once for each table. The tables then exist, and opening again finds them.
    for attempt in range(3):
        try:
            catalog = load_catalog(name, **props)
            break
        except Exception as exc:
            if "already exists" not in str(exc) or not uri.startswith("sqlite:") or attempt == 2:
                raise
    session = getattr(catalog, "_session", None)
    if isinstance(session, requests.Session):
        # pyiceberg's REST client sends without a timeout: a catalog that hangs (a frozen server, a
        # dropped connection) would hold a commit forever instead of failing it into a retry.
        adapter = _TimeoutAdapter(timeout_s)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
    return catalog


class _TimeoutAdapter(requests.adapters.HTTPAdapter):
    def __init__(self, timeout_s: float):
        super().__init__()
        self.timeout_s = timeout_s

    def send(self, request, **kwargs):
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.timeout_s
        return super().send(request, **kwargs)


def create_table(catalog: Catalog, contract: Contract) -> tuple[Table, bool]:
    """The contract's table, created if missing. Returns (table, created)."""
    if contract.geometry.native:
        return _create_native_table(catalog, contract)
    try:
        catalog.create_namespace(contract.namespace)
    except NamespaceAlreadyExistsError:
        pass
    try:
        table = catalog.load_table(contract.table)
    except NoSuchTableError:
        check_fresh_ids(contract)
        # Unpartitioned first (spec 0), the contract's spec on top (spec 1): an upsert table's
        # equality deletes are written with spec 0, so that they reach every partition.
        tx = catalog.create_table_transaction(
            contract.table,
            schema=contract.iceberg_schema,
            properties=contract.table_properties(),
        )
        if contract.partition:
            with tx.update_spec() as spec:
                for field in contract.partition:
                    spec.add_field(field.column, _iceberg_transform(field.transform, field.param), field.name)
        tx.commit_transaction()
        table = catalog.load_table(contract.table)
        check_table_matches(table, contract)
        return table, True
    check_table_matches(table, contract)
    return table, False


def _create_native_table(catalog: Catalog, contract: Contract) -> tuple[Table, bool]:
    """A native-geometry table: made by Iceberg Java (pyiceberg writes no v3 table), unpartitioned
    spec 0 and the contract's spec on top as for a v2 table, then loaded by pyiceberg."""
    created = not catalog.table_exists(contract.table)
    if created:
        check_fresh_ids(contract)
        native_catalog(catalog).create_table(
            contract.table,
            contract.iceberg_schema.model_dump_json(),
            contract.geometry.id,
            contract.geometry.native_crs,
            contract.table_properties(),
            [(f.column, str(_iceberg_transform(f.transform, f.param)), f.name) for f in contract.partition],
        )
    table = catalog.load_table(contract.table)
    check_table_matches(table, contract)
    return table, created


def create_rejects_table(catalog: Catalog, identifier: str) -> Table:
    """The rejects table (streaming/write/rejects_table.py), created if missing. A table of that name
    made otherwise (other columns) is refused, naming it: its files would not fit."""
    namespace = identifier.rsplit(".", 1)[0] if "." in identifier else ""
    if not namespace:
        raise ValueError(f"rejects_table: {identifier!r} needs a namespace (namespace.table)")
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        try:
            table = catalog.create_table(identifier, schema=REJECTS_SCHEMA, partition_spec=REJECTS_SPEC)
        except TableAlreadyExistsError:  # another service made it first
            table = catalog.load_table(identifier)
    if table.schema().as_struct() != REJECTS_SCHEMA.as_struct():
        raise TableMismatch(
            f"rejects_table: {identifier} exists with the columns {table.schema().column_names}, not a rejects "
            f"table's {REJECTS_SCHEMA.column_names}"
        )
    return table


def _iceberg_transform(name: str, param: int | None) -> Transform:
    if name == "bucket":
        return BucketTransform(param or 1)
    if name == "truncate":
        return TruncateTransform(param or 1)
    simple: dict[str, Transform] = {
        "year": YearTransform(),
        "month": MonthTransform(),
        "day": DayTransform(),
        "hour": HourTransform(),
    }
    return simple.get(name, IdentityTransform())


def partition_layout(table: Table) -> PartitionLayout:
    """The table's current partition spec, as the writers apply it."""
    spec = table.spec()
    schema = table.schema()
    types: dict[IcebergType, str] = {t: name for name, t in PRIMITIVE_TYPES.items()}
    fields = []
    for field in spec.fields:
        source = schema.find_field(field.source_id)
        text = str(field.transform)
        transform, _, rest = text.partition("[")
        if transform not in ("identity", "year", "month", "day", "hour", "bucket", "truncate"):
            raise TableMismatch(
                f"table {'.'.join(table.name())}: partition field {field.name}: transform {text} is not one geoingest writes"
            )
        if source.field_type not in types:
            raise TableMismatch(
                f"table {'.'.join(table.name())}: partition field {field.name}: source {source.name} is a {source.field_type}"
            )
        param = int(rest.rstrip("]")) if rest else None
        fields.append(LayoutField(field.field_id, field.name, transform, param, source.name, types[source.field_type]))
    return PartitionLayout(spec.spec_id, tuple(fields))


def unpartitioned_spec_id(table: Table) -> int | None:
    """The id of a spec of the table without fields (where equality deletes reach every partition)."""
    default = table.spec()
    if not default.fields:
        return default.spec_id
    for spec_id, spec in sorted(table.specs().items()):
        if not spec.fields:
            return spec_id
    return None


def load_contract_table(catalog: Catalog, contract: Contract) -> Table:
    try:
        table = catalog.load_table(contract.table)
    except NoSuchTableError:
        raise NoSuchTableError(
            f"table {contract.table} does not exist; create it with 'geoingest table create --contract <file>'"
        ) from None
    check_table_matches(table, contract)
    return table


def table_cells(table: Table, contract: Contract) -> tuple[CellColumn, ...] | None:
    """The cell columns the table holds, by the property each has (`geoingest.partition.cell.<column>`):
    those it was made with and those a partition evolution added after its other columns. None for
    a table that records none (the contract's spec says then)."""
    schema = table.schema()
    found = []
    for key, meaning in sorted(table.properties.items()):
        if not key.startswith(CELL_PROPERTY_PREFIX):
            continue
        name = key.removeprefix(CELL_PROPERTY_PREFIX)
        field = cell_field(meaning)
        column = next((f for f in schema.fields if f.name == name), None)
        if field is None or column is None or field.name != name:
            raise TableMismatch(
                f"table {contract.table}: property {key} = {meaning!r} is not a geohash cell column of the table"
            )
        found.append((column.field_id, field, column.required))
    if not found:
        return None
    # A cell column with an id past the bbox's own fields came after the table was made.
    if contract.bbox_stored:
        bbox = next((f for f in schema.fields if f.field_id == contract.bbox_id), None)
        fields = bbox.field_type.fields if bbox and isinstance(bbox.field_type, StructType) else ()
        last_nested = max((f.field_id for f in fields), default=contract.bbox_id)
    else:
        # No covering: past every nested id, or past the cells a new table gets.
        top = {f.field_id for f in schema.fields}
        nested = [fid for fid in schema.field_ids if fid not in top]
        last_nested = max(nested, default=contract.bbox_id + len(contract.cell_fields) - 1)
    return tuple(CellColumn(fid, field, required, fid > last_nested) for fid, field, required in sorted(found))


def check_table_matches(table: Table, contract: Contract) -> None:
    """The table's schema and geometry properties are the contract's: writes would break otherwise."""
    table_contract(table, contract)


def table_contract(table: Table, contract: Contract) -> Contract:
    """The contract as this table holds it: every field of the contract is the table's field of
    the same id, name, type and nullability, and the table's other fields (optional columns of
    a contract type, gained by schema evolution) become its added columns, each read from the
    property of its name. Anything else means that writes would break: TableMismatch."""
    cells = table_cells(table, contract)
    if cells is not None:
        contract = replace(contract, table_cells=cells)
    actual = {f.field_id: f for f in table.schema().fields}
    grown: dict[str, IcebergType] = {}
    for expected in contract.iceberg_schema.fields:
        found = actual.pop(expected.field_id, None)
        if (
            found is not None
            and found != expected
            and (found.name, found.required) == (expected.name, expected.required)
            and grown_from(found.field_type, expected.field_type)
        ):
            grown[found.name] = found.field_type  # a struct column that gained members at ingest
            continue
        if found != expected:
            raise TableMismatch(
                f"table {contract.table}: field id {expected.field_id} is {found or 'missing'} in the table, "
                f"the contract says {expected}"
            )
    added = []
    for field in sorted(actual.values(), key=lambda f: f.field_id):
        if field.required:
            raise TableMismatch(
                f"table {contract.table}: column {field.name!r} (id {field.field_id}, {field.field_type}) is not in "
                "the contract, and only optional columns can be added to it"
            )
        added.append(Column.of_type(field.field_id, field.name, field.field_type, False, (f"properties.{field.name}",)))
    contract = contract.with_added_columns(tuple(added)).with_column_types(grown)
    props = table.properties
    for key, value in contract.table_properties().items():
        if key.startswith("geo.") and props.get(key) != value:
            raise TableMismatch(
                f"table {contract.table}: property {key} is {props.get(key)!r}, the contract says {value!r}"
            )
    return contract


def describe(table: Table) -> dict[str, Any]:
    """What a user wants to see of a geospatial table: schema, geometry column, layout, snapshots."""
    props = table.properties
    geometry = props.get("geo.primary-column")
    prefix = f"geo.column.{geometry}."
    snapshot = table.current_snapshot()
    return {
        "table": ".".join(table.name()),
        "location": table.location(),
        # What iceberg_scan (DuckDB) and other catalog-less readers open: this snapshot's metadata.
        "metadata_location": table.metadata_location,
        "format_version": table.metadata.format_version,
        "schema": [
            {"id": f.field_id, "name": f.name, "type": str(f.field_type), "required": f.required}
            for f in table.schema().fields
        ],
        "geometry": {
            "column": geometry,
            **{k.removeprefix(prefix): v for k, v in props.items() if k.startswith(prefix)},
        },
        "hilbert": {
            "bits": int(props["geo.hilbert.bits"]) if "geo.hilbert.bits" in props else None,
            "extent": [float(v) for v in props.get("geo.hilbert.extent", "").split(",") if v],
        },
        "partition": [
            {"name": f.name, "transform": str(f.transform), "source": table.schema().find_field(f.source_id).name}
            for f in table.spec().fields
        ],
        "partition_cells": {
            k.removeprefix(CELL_PROPERTY_PREFIX): v for k, v in props.items() if k.startswith(CELL_PROPERTY_PREFIX)
        },
        "event_time": props.get(EVENT_TIME_PROPERTY),
        "snapshots": len(table.metadata.snapshots),
        "current_snapshot": None
        if snapshot is None
        else {
            "id": snapshot.snapshot_id,
            "timestamp_ms": snapshot.timestamp_ms,
            "summary": dict(snapshot.summary.additional_properties) if snapshot.summary else {},
        },
        "contract": json.loads(props["geoingest.contract"]) if "geoingest.contract" in props else None,
    }
