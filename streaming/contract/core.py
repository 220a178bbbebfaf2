"""Table contracts: what a table holds and how events map onto it.

A contract is a JSON file in `schemas/`. It is validated when loaded, and every error names the
field that caused it (`columns[2].type: ...`). From a contract come the Iceberg schema, the
Arrow schema of the data files, and the table properties that record the geometry column.

Field ids are those Iceberg assigns on table creation (top-level fields 1..n in order, then the
fields of the bbox struct), so the contract states them and loading checks them: the ids a
contract promises are the ids the table gets.

`bbox.flat_columns` (opt-in) adds the covering's four values again as top-level columns
`<bbox>_xmin .. <bbox>_ymax` (ids right after the bbox column's, the struct's fields after them):
DuckDB's iceberg_scan prunes data files on the manifest bounds of top-level columns only, not on
those of the struct's fields (bench/duckdb_pruning.py).

`bbox.stored: false` (native-geometry tables only) keeps the covering out of the table: the rows
still carry it between the decoder and the writer, which derives the cells and the Hilbert key
from it, but the files hold the geometry alone and the manifests' geometry bounds prune. The
covering then takes no id: the columns after it (cells, raster) take the ids it would have had.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    DoubleType,
    GeometryType,
    IcebergType,
    NestedField,
    StringType,
    StructType,
)
from pyproj import CRS

from streaming.contract.columns import (
    check_unique_ids,
    declared_ids,
    number_nested_fields,
    parse_column,
    parse_primary_key,
)
from streaming.contract.partition import (
    CellColumn,
    PartitionField,
    parse_contract_retention,
    parse_event_time,
    parse_partition,
)
from streaming.contract.parts import Clustering, Column, GeometrySpec, SchemaEvolution
from streaming.contract.sources import (
    DebeziumSpec,
    JsonFields,
    RasterSpec,
    RegistrySpec,
    parse_debezium,
    parse_json_fields,
    parse_raster,
    parse_registry,
)
from streaming.contract.terms import (
    ANTIMERIDIAN_READINGS,
    ASSET_KEY_SOURCE,
    BBOX_FIELDS,
    CELL_PROPERTY_PREFIX,
    DEFAULT_HILBERT_BITS,
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_TARGET_FILE_BYTES,
    DIMENSIONS,
    EVENT_TIME_PROPERTY,
    FORMATS,
    GEOMETRY_TYPES,
    JSON_OBJECT_FORMATS,
    SCHEMA_EVOLUTION_MODES,
    TIME_TRANSFORMS,
    WRITE_MODES,
    ContractError,
    epsg_code,
    known_keys_only,
    require,
)
from streaming.contract.types import nested_fields, placeholders, regular_types, transport_type


@dataclass(frozen=True)
class Contract:
    table: str
    description: str
    formats: tuple[str, ...]
    columns: tuple[Column, ...]
    geometry: GeometrySpec
    bbox_name: str
    bbox_id: int
    clustering: Clustering
    source: dict[str, Any]
    bbox_flat_columns: bool = False
    # False: the covering is not a column of the table (`bbox.stored`); bbox_id is then the id the
    # column after the geometry takes in a new table (the first cell column's, or the raster's).
    bbox_stored: bool = True
    # Columns that address a feature; empty in append mode unless the contract names them.
    primary_key: tuple[str, ...] = ()
    # "append": every event is a row; "upsert": one current row per primary key, tombstones delete it.
    mode: str = "append"
    schema_evolution: SchemaEvolution = SchemaEvolution()
    # Columns the table has and the contract file does not: added by schema evolution (or by
    # `geoingest table evolve` from another contract), each read from the property of its name.
    added_columns: tuple[Column, ...] = ()
    # Where JSON events hold their geometry (format "json"); None for contracts without it.
    json: JsonFields | None = None
    # For registry-encoded topics (REGISTRY_FORMATS): where the records hold their geometry.
    registry: RegistrySpec | None = None
    # Debezium change events (format "debezium"): the source column that holds the geometry.
    debezium: DebeziumSpec | None = None
    # The partition spec of a new table (an existing table keeps the spec it has), and the column
    # that holds an event's time (None: the contract has none).
    partition: tuple[PartitionField, ...] = ()
    event_time: str | None = None

    @property
    def cell_fields(self) -> tuple[PartitionField, ...]:
        """The spatial cells of the spec: each a string column the writer fills."""
        return tuple(f for f in self.partition if f.is_cell)

    @property
    def cell_columns(self) -> tuple[CellColumn, ...]:
        """The cell columns the writer fills: the table's (`table_cells`), else the spec's, after
        the flat bbox columns and before the bbox's fields, as a new table gets them."""
        if self.table_cells is not None:
            return self.table_cells
        first = self.bbox_id + self.covering_columns
        return tuple(CellColumn(first + i, f) for i, f in enumerate(self.cell_fields))

    @property
    def stored_bbox_id(self) -> int | None:
        """The bbox column's id; None where the table stores no covering."""
        return self.bbox_id if self.bbox_stored else None

    @property
    def covering_column_ids(self) -> set[int]:
        """The top-level ids the covering takes (the bbox and its flat copies); none where not stored."""
        return {self.bbox_id, *self.flat_bbox_field_ids.values()} if self.bbox_stored else set()

    @property
    def covering_columns(self) -> int:
        """How many top-level columns the covering takes: the bbox struct and its flat copies, or none."""
        return (1 + len(self.flat_bbox_names)) if self.bbox_stored else 0

    @property
    def cell_field_ids(self) -> dict[str, int]:
        """Ids of the cell columns, by name."""
        return {c.name: c.id for c in self.cell_columns}

    # The cell columns of the table the contract writes to (streaming/table/catalog.py's
    # table_contract), which a partition evolution may have changed from the spec's; None: the spec's.
    table_cells: tuple[CellColumn, ...] | None = None
    # How long rows are kept (`"retention": "30 days"`), in seconds; None: for ever. Maintenance
    # drops whole partitions of the time partition column once past it (streaming/maintenance/retention.py).
    retention_s: int | None = None
    # The raster column of a table of rasters (format "stac"); None for tables of geometries.
    raster: RasterSpec | None = None
    # The ids of bbox.xmin .. bbox.ymax once a column is retyped (`with_column_types`): Iceberg
    # gave them when the table was created, and a struct column that gains members later must not
    # move them. None: numbered from the columns, as a new table numbers them.
    bbox_ids: tuple[int, ...] | None = None

    @property
    def all_columns(self) -> tuple[Column, ...]:
        """The contract's columns, then the ones the table gained."""
        return self.columns + self.added_columns

    def with_added_columns(self, added: tuple[Column, ...]) -> Contract:
        return replace(self, added_columns=added)

    def with_column_types(self, types: dict[str, IcebergType]) -> Contract:
        """The contract with these columns (by name) of these types: struct columns that gained
        members at ingest, as the table has them."""

        def retyped(columns: tuple[Column, ...]) -> tuple[Column, ...]:
            return tuple(
                Column.of_type(c.id, c.name, types[c.name], c.required, c.sources) if c.name in types else c
                for c in columns
            )

        return replace(
            self,
            columns=retyped(self.columns),
            added_columns=retyped(self.added_columns),
            bbox_ids=tuple(self.bbox_field_ids.values()) if self.bbox_stored else None,
        )

    @property
    def namespace(self) -> str:
        return self.table.rsplit(".", 1)[0]

    @property
    def bbox_field_ids(self) -> dict[str, int]:
        """Ids of bbox.xmin .. bbox.ymax: Iceberg numbers nested fields after all top-level ones,
        the columns' before the bbox's."""
        if self.bbox_ids is not None:
            return dict(zip(BBOX_FIELDS, self.bbox_ids, strict=True))
        first = self.first_covering_field_id
        return {name: first + i for i, name in enumerate(BBOX_FIELDS)}

    @property
    def first_covering_field_id(self) -> int:
        """The id of bbox.xmin in a new table; without a stored covering, the first nested id
        after the columns' (a raster's fields start there)."""
        return (
            sum(1 for c in self.columns for _ in nested_fields(c.iceberg_type))
            + self.bbox_id
            + self.covering_columns
            + sum(1 for c in self.cell_columns if not c.appended)
            + (1 if self.raster is not None else 0)
        )

    @property
    def flat_bbox_names(self) -> tuple[str, ...]:
        """The top-level copies of the covering (`bbox_xmin` ..), in BBOX_FIELDS order; none unless
        the contract asks for them (`bbox.flat_columns`)."""
        return flat_bbox_names(self.bbox_name) if self.bbox_flat_columns else ()

    @property
    def flat_bbox_field_ids(self) -> dict[str, int]:
        """Ids of the flat columns, by name: right after the bbox column's, before its fields'."""
        return {name: self.bbox_id + 1 + i for i, name in enumerate(self.flat_bbox_names)}

    # Built once per contract (a task unpickles one with them built): pyiceberg's schema objects
    # cost milliseconds to build, and every task's decoder and writer ask for them.
    @cached_property
    def iceberg_schema(self) -> Schema:
        fields = [NestedField(c.id, c.name, c.iceberg_type, required=c.required) for c in self.columns]
        geometry_type = GeometryType(self.geometry.native_crs) if self.geometry.native else BinaryType()
        fields.append(NestedField(self.geometry.id, self.geometry.name, geometry_type, required=True))
        if self.bbox_stored:
            fields.append(self.covering_field)
        for name, fid in self.flat_bbox_field_ids.items():
            fields.append(NestedField(fid, name, DoubleType(), required=True))
        appended = [c for c in self.cell_columns if c.appended]
        for cell in self.cell_columns:
            if not cell.appended:
                fields.append(NestedField(cell.id, cell.name, StringType(), required=cell.required))
        if self.raster is not None:
            first = max(self.bbox_field_ids.values()) + 1 if self.bbox_stored else self.first_covering_field_id
            fields.append(NestedField(self.raster.id, self.raster.name, self.raster.iceberg_type(first), required=True))
        # Iceberg appends the columns a table gains after all others.
        later = [(c.id, c.name, c.iceberg_type) for c in self.added_columns]
        later += [(c.id, c.name, StringType()) for c in appended]
        fields += [
            NestedField(fid, name, kind, required=False) for fid, name, kind in sorted(later, key=lambda f: f[0])
        ]
        return Schema(*fields)

    @property
    def covering_field(self) -> NestedField:
        """The bbox struct column, as a table that stores it has it."""
        bbox = StructType(
            *(NestedField(fid, name, DoubleType(), required=True) for name, fid in self.bbox_field_ids.items())
        )
        return NestedField(self.bbox_id, self.bbox_name, bbox, required=True)

    @cached_property
    def data_file_schema(self) -> pa.Schema:
        """Arrow schema of the data files, with Iceberg field ids on every field: the rows'
        columns (`arrow_schema`), then the flat bbox columns when the contract asks for them.

        pyiceberg maps strings and binaries to Arrow's large types; Spark exchanges the regular
        ones with Python workers, and Parquet stores both alike, so the regular ones are used.
        """
        return regular_types(schema_to_pyarrow(self.iceberg_schema))

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        """Arrow schema of the rows the decoder makes and the writer takes (the data files' columns
        but the flat bbox columns and the cell columns, which the writer derives from the covering),
        in the types Spark's Arrow exchange carries (`transport_type`); the writer casts them back."""
        schema = self.data_file_schema
        flat = set(self.flat_bbox_names) | set(self.cell_field_ids)
        fields = [f.with_type(transport_type(f.type)) for f in schema if f.name not in flat]
        if not self.bbox_stored:
            # The rows carry the covering all the same, right after the geometry.
            covering = regular_types(schema_to_pyarrow(Schema(self.covering_field))).field(0)
            fields.insert([f.name for f in fields].index(self.geometry.name) + 1, covering)
        return pa.schema(fields, metadata=schema.metadata)

    def table_properties(self) -> dict[str, str]:
        """How the geometry is stored, recorded on the table in the spirit of Havasu."""
        g = self.geometry
        prefix = f"geo.column.{g.name}"
        return {
            "format-version": "3" if g.native else "2",
            "write.parquet.compression-codec": "zstd",
            # Truncated WKB bytes bound nothing; the bbox.* columns carry the spatial bounds.
            f"write.metadata.metrics.column.{g.name}": "counts",
            "geo.primary-column": g.name,
            f"{prefix}.encoding": g.encoding.lower(),
            f"{prefix}.types": ",".join(g.types),
            f"{prefix}.dimensions": ",".join(g.dimensions),
            f"{prefix}.crs": g.crs,
            **({f"{prefix}.covering": self.bbox_name} if self.bbox_stored else {}),
            # Only with the option, so that the properties of tables without it stay as they were.
            **({f"{prefix}.covering-flat-columns": ",".join(self.flat_bbox_names)} if self.flat_bbox_names else {}),
            "geo.hilbert.bits": str(self.clustering.hilbert_bits),
            "geo.hilbert.extent": ",".join(repr(v) for v in self.clustering.extent),
            **({EVENT_TIME_PROPERTY: self.event_time} if self.event_time else {}),
            **{f"{CELL_PROPERTY_PREFIX}{c.name}": c.field.cell_meaning for c in self.cell_columns},
            "geoingest.contract": json.dumps(self.source, sort_keys=True, separators=(",", ":")),
        }


def flat_bbox_names(bbox_name: str) -> tuple[str, ...]:
    return tuple(f"{bbox_name}_{name}" for name in BBOX_FIELDS)


def load_contract(path: str | Path) -> Contract:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ContractError(f"{path}: no such contract file") from None
    except json.JSONDecodeError as exc:
        raise ContractError(f"{path}: not valid JSON ({exc})") from None
    try:
        return parse_contract(raw)
    except ContractError as exc:
        raise ContractError(f"{path}: {exc}") from None


def parse_contract(raw: Any) -> Contract:
    if not isinstance(raw, dict):
        raise ContractError("the contract must be a JSON object")
    known_keys_only(raw, "", "")
    table = require(raw, "table", str)
    if table.count(".") < 1 or not all(table.split(".")):
        raise ContractError(f"table: {table!r} must be 'namespace.name'")
    formats = tuple(require(raw, "formats", list))
    for i, fmt in enumerate(formats):
        if fmt not in FORMATS:
            raise ContractError(f"formats[{i}]: {fmt!r} is not one of {list(FORMATS)}")
    if not formats:
        raise ContractError("formats: at least one event format is needed")
    if "geojson" in formats and "json" in formats:
        raise ContractError(
            "formats: 'geojson' and 'json' both read JSON objects; a table takes one of them "
            "(GeoJSON geometries in a field of plain JSON events: json.geometry.encoding 'geojson')"
        )
    if "stac" in formats and len([f for f in formats if f in JSON_OBJECT_FORMATS]) > 1:
        raise ContractError(
            "formats: 'stac' reads JSON objects as rasters; a table of rasters takes no other JSON format"
        )

    raw_columns = require(raw, "columns", list)
    unassigned = placeholders()
    columns = tuple(parse_column(c, f"columns[{i}]", unassigned) for i, c in enumerate(raw_columns))
    geometry = _parse_geometry(require(raw, "geometry", dict))
    raw_bbox = require(raw, "bbox", dict)
    known_keys_only(raw_bbox, "bbox", "bbox.")
    bbox_stored = raw_bbox.get("stored", True)
    if not isinstance(bbox_stored, bool):
        raise ContractError(f"bbox.stored: expected true or false, got {bbox_stored!r}")
    # A covering the table does not store still has a name: the rows carry it to the writer.
    bbox_name = require(raw_bbox, "name", str, "bbox.") if bbox_stored or "name" in raw_bbox else "bbox"
    bbox_flat_columns = raw_bbox.get("flat_columns", False)
    if not isinstance(bbox_flat_columns, bool):
        raise ContractError(f"bbox.flat_columns: expected true or false, got {bbox_flat_columns!r}")
    if bbox_stored:
        bbox_id = require(raw_bbox, "id", int, "bbox.")
    else:
        _check_unstored_covering(raw_bbox, geometry, bbox_flat_columns)
        bbox_id = geometry.id + 1

    names = [c.name for c in columns] + [geometry.name, bbox_name]
    for name in names:
        if names.count(name) > 1:
            raise ContractError(f"columns: the name {name!r} is used twice")
    if bbox_flat_columns:
        for flat_name in flat_bbox_names(bbox_name):
            if flat_name in names:
                raise ContractError(
                    f"bbox.flat_columns: the flat column {flat_name!r} would take the name of another column; "
                    "rename that column or the bbox column"
                )
    seen: dict[int, str] = {}
    for where, fid in declared_ids(columns, geometry.id, bbox_id if bbox_stored else None):
        if fid < 1:
            raise ContractError(f"{where}: id {fid} must be a positive whole number")
        if fid in seen:
            raise ContractError(f"{where}: id {fid} is already the id of {seen[fid]}")
        seen[fid] = where

    clustering = _parse_clustering(raw.get("clustering", {}), geometry.epsg)
    mode = raw.get("mode", "append")
    if mode not in WRITE_MODES:
        raise ContractError(f"mode: {mode!r} is not one of {list(WRITE_MODES)}")
    primary_key = parse_primary_key(raw, columns, mode)
    schema_evolution = _parse_schema_evolution(raw.get("schema_evolution", "off"))
    json_fields = parse_json_fields(raw, formats, columns)
    registry = parse_registry(raw, formats)
    debezium = parse_debezium(raw, formats, mode, columns)
    event_time = parse_event_time(raw, columns)
    partition = parse_partition(raw, columns, geometry, event_time, clustering, names)
    retention_s = parse_contract_retention(
        raw, columns, [(f.transform, f.source) for f in partition if f.transform in TIME_TRANSFORMS]
    )
    raster = parse_raster(raw, formats, geometry)
    if raster is not None:
        if raster.id in seen or raster.id < 1:
            raise ContractError(f"raster.id: id {raster.id} is already the id of {seen.get(raster.id)} or not positive")
        if raster.name in (*names, geometry.name, bbox_name, *flat_bbox_names(bbox_name)):
            raise ContractError(f"raster.name: {raster.name!r} is already the name of another column")
    _check_asset_rows(columns, raster, primary_key, mode)
    top_level = (
        len(columns)
        + (2 if bbox_stored else 1)
        + len(flat_bbox_names(bbox_name) if bbox_flat_columns else ())
        + len([f for f in partition if f.is_cell])
    )
    columns = number_nested_fields(columns, top_level + (1 if raster is not None else 0))
    contract = Contract(
        table=table,
        description=str(raw.get("description", "")),
        formats=formats,
        columns=columns,
        geometry=geometry,
        bbox_name=bbox_name,
        bbox_id=bbox_id,
        clustering=clustering,
        source=raw,
        bbox_flat_columns=bbox_flat_columns,
        bbox_stored=bbox_stored,
        primary_key=primary_key,
        mode=mode,
        schema_evolution=schema_evolution,
        json=json_fields,
        registry=registry,
        debezium=debezium,
        partition=partition,
        event_time=event_time,
        retention_s=retention_s,
        raster=raster,
    )
    check_unique_ids(contract.columns, contract.geometry.id, contract.stored_bbox_id)
    return contract


def _check_unstored_covering(raw_bbox: dict, geometry: GeometrySpec, flat_columns: bool) -> None:
    """A covering left out of the table: only where the manifests bound the geometry itself."""
    if not geometry.native:
        raise ContractError(
            "bbox.stored: false needs geometry.native: true; a WKB column has no bounds of its own, "
            "so the covering is what prunes"
        )
    if flat_columns:
        raise ContractError("bbox.flat_columns: copies of a covering that is not stored (bbox.stored: false)")
    if "id" in raw_bbox:
        raise ContractError(
            f"bbox.id: {raw_bbox['id']!r}, but a covering that is not stored (bbox.stored: false) takes no id"
        )


def _check_asset_rows(
    columns: tuple[Column, ...], raster: RasterSpec | None, primary_key: tuple[str, ...], mode: str
) -> None:
    """`asset.key` is only a source where a row is an asset; and there, the asset's rows of one
    Item share its id and Kafka key, so an upsert key without the asset would keep one asset."""
    per_asset = raster is not None and raster.rows == "asset"
    from_asset = [c.name for c in columns if ASSET_KEY_SOURCE in c.sources]
    for i, c in enumerate(columns):
        if ASSET_KEY_SOURCE in c.sources and not per_asset:
            raise ContractError(
                f"columns[{i}].from: {ASSET_KEY_SOURCE!r} is the asset a row stands for; "
                "only a table of rasters with raster.rows 'asset' has one"
            )
    if per_asset and mode == "upsert" and not set(from_asset) & set(primary_key):
        raise ContractError(
            "primary_key: with raster.rows 'asset' the rows of an Item share its id and Kafka key; "
            f"include a column from {ASSET_KEY_SOURCE!r} in the key, or every version would keep one asset"
        )


def _fresh_raster_id(contract: Contract) -> None:
    """The raster column comes after the bbox column, its flat copies and the cell columns."""
    if contract.raster is None:
        return
    expected = contract.bbox_id + contract.covering_columns + len(contract.cell_fields)
    if contract.raster.id != expected:
        raise ContractError(
            f"raster.id: id {contract.raster.id} breaks the sequence; a new table's raster column comes after "
            f"the bbox column (its flat columns and cell columns): expected {expected}"
        )


def check_fresh_ids(contract: Contract) -> None:
    """A new table's ids: Iceberg assigns 1..n to top-level fields in order on create, so the
    contract must state those (a table's later contracts keep the ids it has, gaps and all)."""
    declared = declared_ids(contract.columns, contract.geometry.id, contract.stored_bbox_id)
    for expected, (where, fid) in enumerate(declared, start=1):
        if fid != expected:
            raise ContractError(
                f"{where}: id {fid} breaks the sequence; a new table's top-level ids run 1..{len(declared)} "
                f"in declaration order (expected {expected})"
            )
    _fresh_raster_id(contract)
    fresh = assign_fresh_schema_ids(contract.iceberg_schema)
    for i, (column, fresh_field) in enumerate(zip(contract.columns, fresh.fields, strict=False)):
        pairs = zip(nested_fields(column.iceberg_type), nested_fields(fresh_field.field_type), strict=True)
        for (fid, path), (expected_id, _) in pairs:
            if fid != expected_id:
                raise ContractError(
                    f"columns[{i}].type ({column.name}.{path}): id {fid} is not the id Iceberg gives it in a "
                    f"new table ({expected_id}); leave nested ids out to have them assigned"
                )


def _parse_schema_evolution(raw: Any) -> SchemaEvolution:
    if isinstance(raw, str):
        raw = {"mode": raw}
    if not isinstance(raw, dict):
        raise ContractError(f"schema_evolution: expected 'off', 'add-columns' or an object, got {raw!r}")
    known_keys_only(raw, "schema_evolution", "schema_evolution.")
    defaults = SchemaEvolution()
    mode = raw.get("mode", defaults.mode)
    if mode not in SCHEMA_EVOLUTION_MODES:
        raise ContractError(f"schema_evolution.mode: {mode!r} is not one of {list(SCHEMA_EVOLUTION_MODES)}")
    limits = {}
    for key in ("max_new_columns_per_batch", "max_columns"):
        value = raw.get(key, getattr(defaults, key))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ContractError(f"schema_evolution.{key}: {value!r} must be a positive whole number")
        limits[key] = value
    pattern = raw.get("name_pattern", defaults.name_pattern)
    try:
        re.compile(pattern)
    except (re.error, TypeError) as exc:
        raise ContractError(f"schema_evolution.name_pattern: {pattern!r} is not a regular expression: {exc}") from None
    return SchemaEvolution(mode=mode, name_pattern=pattern, **limits)


def _parse_geometry(raw: dict) -> GeometrySpec:
    known_keys_only(raw, "geometry", "geometry.")
    types = tuple(require(raw, "types", list, "geometry."))
    for i, t in enumerate(types):
        if t not in GEOMETRY_TYPES:
            raise ContractError(f"geometry.types[{i}]: {t!r} is not one of {list(GEOMETRY_TYPES)}")
    dims = tuple(require(raw, "dimensions", list, "geometry."))
    for i, d in enumerate(dims):
        if d not in DIMENSIONS:
            raise ContractError(f"geometry.dimensions[{i}]: {d!r} is not one of {list(DIMENSIONS)}")
    crs_text = require(raw, "crs", str, "geometry.")
    epsg = epsg_code(crs_text, "geometry.crs")
    encoding = raw.get("encoding", "WKB")
    if encoding != "WKB":
        raise ContractError(f"geometry.encoding: {encoding!r} is not supported; tables store WKB")
    invalid = raw.get("invalid_polygons", "reject")
    if invalid not in ("reject", "repair"):
        raise ContractError(f"geometry.invalid_polygons: {invalid!r} is not 'reject' or 'repair'")
    if not types or not dims:
        raise ContractError("geometry: types and dimensions must not be empty")
    geographic = CRS.from_epsg(epsg).is_geographic
    antimeridian = raw.get("antimeridian", "short" if geographic else "planar")
    if antimeridian not in ANTIMERIDIAN_READINGS:
        raise ContractError(f"geometry.antimeridian: {antimeridian!r} is not one of {list(ANTIMERIDIAN_READINGS)}")
    if antimeridian == "short" and not geographic:
        raise ContractError(
            f"geometry.antimeridian: 'short' needs a geographic CRS; {crs_text} is projected, its x is a plane"
        )
    native = raw.get("native", False)
    if not isinstance(native, bool):
        raise ContractError(f"geometry.native: expected true or false, got {native!r}")
    return GeometrySpec(
        native=native,
        id=require(raw, "id", int, "geometry."),
        name=require(raw, "name", str, "geometry."),
        types=types,
        dimensions=dims,
        epsg=epsg,
        encoding=encoding,
        invalid_polygons=invalid,
        antimeridian=antimeridian,
    )


def crs_area_of_use(epsg: int) -> tuple[float, float, float, float]:
    """The CRS's area of use, in its own coordinates (the default Hilbert extent)."""
    crs = CRS.from_epsg(epsg)
    area = crs.area_of_use
    if area is None:
        raise ContractError(f"geometry.crs: EPSG:{epsg} has no area of use; set clustering.extent")
    if crs.is_geographic:
        return (area.west, area.south, area.east, area.north)
    from pyproj import Transformer

    to_crs = Transformer.from_crs("EPSG:4326", crs, always_xy=True)
    xmin, ymin, xmax, ymax = to_crs.transform_bounds(area.west, area.south, area.east, area.north)
    return (xmin, ymin, xmax, ymax)


def _parse_clustering(raw: Any, epsg: int) -> Clustering:
    if not isinstance(raw, dict):
        raise ContractError("clustering: expected an object")
    known_keys_only(raw, "clustering", "clustering.")
    bits = raw.get("hilbert_bits", DEFAULT_HILBERT_BITS)
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 31:
        raise ContractError(f"clustering.hilbert_bits: {bits!r} must be a whole number 1..31")
    extent = raw.get("extent")
    if extent is None:
        extent = crs_area_of_use(epsg)
    if (
        not isinstance(extent, list | tuple)
        or len(extent) != 4
        or not all(isinstance(v, int | float) and math.isfinite(v) for v in extent)
        or not (extent[0] < extent[2] and extent[1] < extent[3])
    ):
        raise ContractError(
            f"clustering.extent: {extent!r} must be [xmin, ymin, xmax, ymax] with xmin < xmax, ymin < ymax"
        )
    file_bytes = raw.get("target_file_bytes", DEFAULT_TARGET_FILE_BYTES)
    rg_rows = raw.get("row_group_rows", DEFAULT_ROW_GROUP_ROWS)
    for key, value in (("target_file_bytes", file_bytes), ("row_group_rows", rg_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ContractError(f"clustering.{key}: {value!r} must be a positive whole number")
    xmin, ymin, xmax, ymax = (float(v) for v in extent)
    return Clustering(
        hilbert_bits=bits,
        extent=(xmin, ymin, xmax, ymax),
        target_file_bytes=file_bytes,
        row_group_rows=rg_rows,
    )
