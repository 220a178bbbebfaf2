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
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)
from pyproj import CRS

COLUMN_TYPES: dict[str, IcebergType] = {
    "string": StringType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
    "timestamptz": TimestamptzType(),
}
GEOMETRY_TYPES = (
    "Point",
    "LineString",
    "Polygon",
    "MultiPoint",
    "MultiLineString",
    "MultiPolygon",
    "GeometryCollection",
)
DIMENSIONS = ("XY", "XYZ", "XYM", "XYZM")
FORMATS = ("geojson", "wkb", "ewkb", "gpkg", "json", "wkt", "ewkt", "avro", "protobuf", "stac")
# Formats that read a JSON object; a table takes one of them.
JSON_OBJECT_FORMATS = ("geojson", "json", "stac")
# What one row of a raster table is (`raster.rows`): a STAC Item (its assets the bands).
RASTER_ROWS = ("item",)
# How the one JSON field that holds a whole geometry spells it (`json.geometry.encoding`).
JSON_GEOMETRY_ENCODINGS = ("wkt", "geojson", "wkb_hex", "wkb_base64")
JSON_SOURCE_PREFIX = "json."
_JSON_PATH = re.compile(r"^[^.\s]+(\.[^.\s]+)*$")
# Formats whose values are in the Confluent wire format (0x00, a 4-byte schema id, the record):
# their first byte is that of big-endian WKB too, so a topic is either registry-encoded or not.
REGISTRY_FORMATS = ("avro", "protobuf")
KAFKA_SOURCES = ("kafka.key", "kafka.timestamp", "kafka.topic", "kafka.partition", "kafka.offset")
BBOX_FIELDS = ("xmin", "ymin", "xmax", "ymax")
DEFAULT_HILBERT_BITS = 16
# Defaults measured by bench/layout.py (see docs/settings.md, "Layout defaults").
DEFAULT_TARGET_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_ROW_GROUP_ROWS = 16_384


WRITE_MODES = ("append", "upsert")
# Partition transforms a contract may name: Iceberg's, and the spatial cell of the geometry.
TIME_TRANSFORMS = ("year", "month", "day", "hour")
PARTITION_TRANSFORMS = (*TIME_TRANSFORMS, "bucket", "truncate", "identity", "geohash")
# A spec whose fields could make more partitions than this in one batch is refused (each
# partition a batch touches is at least one file of its own).
MAX_PARTITIONS_PER_BATCH = 100_000
# Partitions of a time transform one batch may span, for that estimate (a batch spans a few hours
# of events at most unless it drains a backlog).
_TIME_PARTITIONS_PER_BATCH = {"year": 1, "month": 1, "day": 2, "hour": 24}
GEOHASH_MAX_PRECISION = 12
EVENT_TIME_PROPERTY = "geoingest.event-time"
CELL_PROPERTY_PREFIX = "geoingest.partition.cell."
_RETENTION_UNITS = {"day": 86400, "days": 86400, "hour": 3600, "hours": 3600}
SCHEMA_EVOLUTION_MODES = ("off", "add-columns")
# Every key a contract may hold, per object: any other is a typo or a feature this version lacks,
# and either way an error that names it rather than a setting silently ignored.
KNOWN_KEYS = {
    "": (
        "table",
        "description",
        "formats",
        "columns",
        "geometry",
        "bbox",
        "clustering",
        "primary_key",
        "mode",
        "schema_evolution",
        "json",
        "registry",
        "partition",
        "event_time",
        "retention",
        "raster",
    ),
    "raster": ("id", "name", "rows"),
    "json": ("lon", "lat", "z", "geometry", "crs"),
    "json.geometry": ("path", "encoding"),
    "registry": ("geometry_field", "lon_field", "lat_field", "srid_field"),
    "columns[]": ("id", "name", "type", "required", "from", "description"),
    "geometry": ("id", "name", "types", "dimensions", "crs", "encoding", "invalid_polygons", "antimeridian"),
    "bbox": ("id", "name", "flat_columns"),
    "clustering": ("hilbert_bits", "extent", "target_file_bytes", "row_group_rows"),
    "schema_evolution": ("mode", "max_new_columns_per_batch", "max_columns", "name_pattern"),
}


ANTIMERIDIAN_READINGS = ("short", "planar")


class ContractError(ValueError):
    """A contract that cannot be used; the message starts with the offending field."""


def _known_keys_only(raw: dict, kind: str, where: str) -> None:
    for key in raw:
        if key not in KNOWN_KEYS[kind]:
            raise ContractError(f"{where}{key}: not a contract key; expected one of {', '.join(KNOWN_KEYS[kind])}")


@dataclass(frozen=True)
class Column:
    id: int
    name: str
    type: str
    required: bool
    sources: tuple[str, ...]

    @property
    def iceberg_type(self) -> IcebergType:
        return COLUMN_TYPES[self.type]


@dataclass(frozen=True)
class GeometrySpec:
    id: int
    name: str
    types: tuple[str, ...]
    dimensions: tuple[str, ...]
    epsg: int
    encoding: str
    invalid_polygons: str  # "reject" or "repair"
    # "short": in a geographic CRS, an edge whose longitudes are more than 180 degrees apart goes
    # the short way across ±180 and its bbox is wrapped (xmin > xmax), see docs/antimeridian.md;
    # "planar": coordinates are a plane (the only reading of a projected CRS).
    antimeridian: str = "planar"

    @property
    def crs(self) -> str:
        return f"EPSG:{self.epsg}"


# Havasu's raster data model with out-db bands (docs/rasters.md): the grid's size, its CRS (WKT),
# the affine geotransform anchored at the centre of the upper-left cell, and the files of its bands.
RASTER_FIELDS = (
    ("width", IntegerType()),
    ("height", IntegerType()),
    ("crs", StringType()),
    ("scale_x", DoubleType()),
    ("scale_y", DoubleType()),
    ("skew_x", DoubleType()),
    ("skew_y", DoubleType()),
    ("upper_left_x", DoubleType()),
    ("upper_left_y", DoubleType()),
    ("bands", None),
)
RASTER_BAND_FIELDS = (("uri", StringType()), ("band_number", IntegerType()))


@dataclass(frozen=True)
class RasterSpec:
    """The raster column: one raster per row, its footprint in the geometry column."""

    id: int
    name: str
    rows: str = "item"

    def iceberg_type(self, first_id: int) -> StructType:
        """The struct, its nested ids from `first_id` in the order Iceberg assigns them on create:
        the struct's fields, then the list's element, then the element's fields."""
        n = len(RASTER_FIELDS)
        band = StructType(
            *(
                NestedField(first_id + n + 1 + i, name, t, required=False)
                for i, (name, t) in enumerate(RASTER_BAND_FIELDS)
            )
        )
        fields = [
            NestedField(
                first_id + i,
                name,
                t if t is not None else ListType(first_id + n, band, element_required=True),
                required=name != "crs" and name != "bands",
            )
            for i, (name, t) in enumerate(RASTER_FIELDS)
        ]
        return StructType(*fields)


@dataclass(frozen=True)
class Clustering:
    hilbert_bits: int
    extent: tuple[float, float, float, float]
    target_file_bytes: int
    row_group_rows: int


@dataclass(frozen=True)
class SchemaEvolution:
    """What happens to a property no column maps: "off" ignores it (counted and logged), "add-columns"
    makes it an optional column of the type its values have, within these limits."""

    mode: str = "off"
    max_new_columns_per_batch: int = 20
    max_columns: int = 500
    # A new column's name: what every reader (Spark, DuckDB, Trino) takes unquoted.
    name_pattern: str = r"^[a-z_][a-z0-9_]{0,62}$"


@dataclass(frozen=True)
class JsonFields:
    """Where a plain JSON event (format "json") holds its geometry: a lon / lat (/ z) triple of
    number fields, or one field holding a whole geometry in `encoding`; paths are dotted member
    names from the document's root (`position.lon`). `epsg` is the CRS of the coordinates (for
    lon / lat, a geographic one); an EWKT / EWKB SRID in the geometry field overrides it."""

    lon: str | None = None
    lat: str | None = None
    z: str | None = None
    geometry_path: str | None = None
    geometry_encoding: str | None = None
    epsg: int = 4326

    @property
    def coordinate_paths(self) -> tuple[str, ...]:
        return tuple(p for p in (self.lon, self.lat, self.z) if p is not None)


@dataclass(frozen=True)
class RegistrySpec:
    """Where a registry-encoded record holds its geometry: one field (bytes: WKB or EWKB; a string:
    WKT), or a longitude and a latitude field (numbers); and optionally a field with its EPSG code."""

    geometry_field: str = ""
    lon_field: str = ""
    lat_field: str = ""
    srid_field: str = ""


@dataclass(frozen=True)
class PartitionField:
    """One field of the contract's partition spec, as written (`day(event_time)`, `geohash(geometry, 3)`)."""

    text: str
    transform: str  # one of PARTITION_TRANSFORMS
    source: str  # the column it reads
    param: int | None = None  # bucket N, truncate W, geohash precision

    @property
    def name(self) -> str:
        """The partition field's name (Iceberg's defaults), or for a cell the column that holds it."""
        if self.transform == "identity":
            return self.source
        if self.transform == "geohash":
            return f"{self.source}_geohash{self.param}"
        if self.transform == "bucket":
            return f"{self.source}_bucket_{self.param}"
        if self.transform == "truncate":
            return f"{self.source}_trunc_{self.param}"
        return f"{self.source}_{self.transform}"

    @property
    def is_cell(self) -> bool:
        return self.transform == "geohash"

    @property
    def cell_meaning(self) -> str:
        """What a cell column holds, as its table property says: `geohash:<precision>:<geometry column>`."""
        return f"{self.transform}:{self.param}:{self.source}"


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
    # The partition spec of a new table (an existing table keeps the spec it has), and the column
    # that holds an event's time (None: the contract has none).
    partition: tuple[PartitionField, ...] = ()
    event_time: str | None = None

    @property
    def cell_fields(self) -> tuple[PartitionField, ...]:
        """The spatial cells of the spec: each a string column the writer fills."""
        return tuple(f for f in self.partition if f.is_cell)

    @property
    def cell_field_ids(self) -> dict[str, int]:
        """Ids of the cell columns, by name: after the flat bbox columns, before the bbox's fields."""
        first = self.bbox_id + 1 + len(self.flat_bbox_names)
        return {f.name: first + i for i, f in enumerate(self.cell_fields)}

    # How long rows are kept (`"retention": "30 days"`), in seconds; None: for ever. Maintenance
    # drops whole partitions of the time partition column once past it (streaming/maintenance/retention.py).
    retention_s: int | None = None
    # The raster column of a table of rasters (format "stac"); None for tables of geometries.
    raster: RasterSpec | None = None

    @property
    def all_columns(self) -> tuple[Column, ...]:
        """The contract's columns, then the ones the table gained."""
        return self.columns + self.added_columns

    def with_added_columns(self, added: tuple[Column, ...]) -> Contract:
        return replace(self, added_columns=added)

    @property
    def namespace(self) -> str:
        return self.table.rsplit(".", 1)[0]

    @property
    def bbox_field_ids(self) -> dict[str, int]:
        """Ids of bbox.xmin .. bbox.ymax: Iceberg numbers nested fields after all top-level ones."""
        first = (
            self.bbox_id + 1 + len(self.flat_bbox_names) + len(self.cell_fields) + (1 if self.raster is not None else 0)
        )
        return {name: first + i for i, name in enumerate(BBOX_FIELDS)}

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
        fields.append(NestedField(self.geometry.id, self.geometry.name, BinaryType(), required=True))
        bbox = StructType(
            *(NestedField(fid, name, DoubleType(), required=True) for name, fid in self.bbox_field_ids.items())
        )
        fields.append(NestedField(self.bbox_id, self.bbox_name, bbox, required=True))
        for name, fid in self.flat_bbox_field_ids.items():
            fields.append(NestedField(fid, name, DoubleType(), required=True))
        for name, fid in self.cell_field_ids.items():
            fields.append(NestedField(fid, name, StringType(), required=True))
        if self.raster is not None:
            first = max(self.bbox_field_ids.values()) + 1
            fields.append(NestedField(self.raster.id, self.raster.name, self.raster.iceberg_type(first), required=True))
        # Iceberg appends the columns a table gains after all others.
        fields += [NestedField(c.id, c.name, c.iceberg_type, required=False) for c in self.added_columns]
        return Schema(*fields)

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
        but the flat bbox columns and the cell columns, which the writer derives from the covering)."""
        schema = self.data_file_schema
        flat = set(self.flat_bbox_names) | set(self.cell_field_ids)
        return pa.schema([f for f in schema if f.name not in flat], metadata=schema.metadata)

    def table_properties(self) -> dict[str, str]:
        """How the geometry is stored, recorded on the table in the spirit of Havasu."""
        g = self.geometry
        prefix = f"geo.column.{g.name}"
        return {
            "format-version": "2",
            "write.parquet.compression-codec": "zstd",
            # Truncated WKB bytes bound nothing; the bbox.* columns carry the spatial bounds.
            f"write.metadata.metrics.column.{g.name}": "counts",
            "geo.primary-column": g.name,
            f"{prefix}.encoding": g.encoding.lower(),
            f"{prefix}.types": ",".join(g.types),
            f"{prefix}.dimensions": ",".join(g.dimensions),
            f"{prefix}.crs": g.crs,
            f"{prefix}.covering": self.bbox_name,
            # Only with the option, so that the properties of tables without it stay as they were.
            **({f"{prefix}.covering-flat-columns": ",".join(self.flat_bbox_names)} if self.flat_bbox_names else {}),
            "geo.hilbert.bits": str(self.clustering.hilbert_bits),
            "geo.hilbert.extent": ",".join(repr(v) for v in self.clustering.extent),
            **({EVENT_TIME_PROPERTY: self.event_time} if self.event_time else {}),
            **{f"{CELL_PROPERTY_PREFIX}{f.name}": f.cell_meaning for f in self.cell_fields},
            "geoingest.contract": json.dumps(self.source, sort_keys=True, separators=(",", ":")),
        }


def _regular_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_regular_type(f.type)) for f in t])
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_regular_type(t.value_type)))
    return t


def flat_bbox_names(bbox_name: str) -> tuple[str, ...]:
    return tuple(f"{bbox_name}_{name}" for name in BBOX_FIELDS)


def regular_types(schema: pa.Schema) -> pa.Schema:
    """The schema with Arrow's regular string and binary types where it has the large ones."""
    return pa.schema([f.with_type(_regular_type(f.type)) for f in schema], metadata=schema.metadata)


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
    _known_keys_only(raw, "", "")
    table = _require(raw, "table", str)
    if table.count(".") < 1 or not all(table.split(".")):
        raise ContractError(f"table: {table!r} must be 'namespace.name'")
    formats = tuple(_require(raw, "formats", list))
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

    raw_columns = _require(raw, "columns", list)
    columns = tuple(_parse_column(c, f"columns[{i}]") for i, c in enumerate(raw_columns))
    geometry = _parse_geometry(_require(raw, "geometry", dict))
    raw_bbox = _require(raw, "bbox", dict)
    _known_keys_only(raw_bbox, "bbox", "bbox.")
    bbox_name = _require(raw_bbox, "name", str, "bbox.")
    bbox_id = _require(raw_bbox, "id", int, "bbox.")
    bbox_flat_columns = raw_bbox.get("flat_columns", False)
    if not isinstance(bbox_flat_columns, bool):
        raise ContractError(f"bbox.flat_columns: expected true or false, got {bbox_flat_columns!r}")

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
    for where, fid in _declared_ids(columns, geometry.id, bbox_id):
        if fid < 1:
            raise ContractError(f"{where}: id {fid} must be a positive whole number")
        if fid in seen:
            raise ContractError(f"{where}: id {fid} is already the id of {seen[fid]}")
        seen[fid] = where

    clustering = _parse_clustering(raw.get("clustering", {}), geometry.epsg)
    mode = raw.get("mode", "append")
    if mode not in WRITE_MODES:
        raise ContractError(f"mode: {mode!r} is not one of {list(WRITE_MODES)}")
    primary_key = _parse_primary_key(raw, columns, mode)
    schema_evolution = _parse_schema_evolution(raw.get("schema_evolution", "off"))
    json_fields = _parse_json_fields(raw, formats, columns)
    registry = _parse_registry(raw, formats)
    event_time = _parse_event_time(raw, columns)
    partition = _parse_partition(raw, columns, geometry, event_time, clustering, names)
    retention_s = _parse_contract_retention(
        raw, columns, [(f.transform, f.source) for f in partition if f.transform in TIME_TRANSFORMS]
    )
    raster = _parse_raster(raw, formats, geometry)
    if raster is not None:
        if raster.id in seen or raster.id < 1:
            raise ContractError(f"raster.id: id {raster.id} is already the id of {seen.get(raster.id)} or not positive")
        if raster.name in (*names, geometry.name, bbox_name, *flat_bbox_names(bbox_name)):
            raise ContractError(f"raster.name: {raster.name!r} is already the name of another column")
    return Contract(
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
        primary_key=primary_key,
        mode=mode,
        schema_evolution=schema_evolution,
        json=json_fields,
        registry=registry,
        partition=partition,
        event_time=event_time,
        retention_s=retention_s,
        raster=raster,
    )


def _parse_raster(raw: dict, formats: tuple[str, ...], geometry: GeometrySpec) -> RasterSpec | None:
    """The `raster` section: the column of a table of rasters, read from STAC Items (format "stac");
    the geometry column then holds each raster's footprint in WGS84."""
    if "raster" not in raw:
        if "stac" in formats:
            raise ContractError(
                'raster: missing; format \'stac\' needs the raster column ({"id": .., "name": "raster"})'
            )
        return None
    section = raw["raster"]
    if not isinstance(section, dict):
        raise ContractError(f"raster: expected an object, got {section!r}")
    _known_keys_only(section, "raster", "raster.")
    if formats != ("stac",):
        raise ContractError(f"formats: a table with a raster column reads format 'stac' only, got {list(formats)}")
    rows = section.get("rows", "item")
    if rows not in RASTER_ROWS:
        raise ContractError(f"raster.rows: {rows!r} is not one of {list(RASTER_ROWS)}")
    if geometry.epsg != 4326:
        raise ContractError(f"geometry.crs: a raster's footprint is stored in EPSG:4326, got {geometry.crs}")
    if "Polygon" not in geometry.types or "MultiPolygon" not in geometry.types:
        raise ContractError(
            "geometry.types: a raster's footprint is a Polygon, or a MultiPolygon cut at ±180; list both"
        )
    return RasterSpec(
        id=_require(section, "id", int, "raster."), name=_require(section, "name", str, "raster."), rows=rows
    )


def _json_path(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _JSON_PATH.match(value):
        raise ContractError(f"{where}: {value!r} is not a JSON path (member names joined by dots, e.g. 'position.lon')")
    return value


def _parse_json_fields(raw: dict, formats: tuple[str, ...], columns: tuple[Column, ...]) -> JsonFields | None:
    """The `json` section: required with format "json", refused without it; and columns read
    `json.<path>` only from JSON events."""
    if "json" not in formats:
        if "json" in raw:
            raise ContractError("json: given, but 'json' is not in formats")
        for i, col in enumerate(columns):
            for j, src in enumerate(col.sources):
                if src.startswith(JSON_SOURCE_PREFIX):
                    raise ContractError(
                        f"columns[{i}].from[{j}]: {src!r} reads a field of JSON events, but 'json' is not in formats"
                    )
        return None
    section = raw.get("json")
    if not isinstance(section, dict):
        raise ContractError(
            "json: missing or not an object; format 'json' needs where the geometry is "
            '({"lon": "<path>", "lat": "<path>"} or {"geometry": {"path": "<path>", "encoding": "wkt"}})'
        )
    _known_keys_only(section, "json", "json.")
    crs_text = section.get("crs", "EPSG:4326")
    if not isinstance(crs_text, str):
        raise ContractError(f"json.crs: expected a string, got {crs_text!r}")
    epsg = _epsg_code(crs_text, "json.crs")
    has_coordinates = any(k in section for k in ("lon", "lat", "z"))
    if has_coordinates == ("geometry" in section):
        raise ContractError("json: name either lon and lat (and optionally z) or geometry, not both and not neither")
    if has_coordinates:
        for key in ("lon", "lat"):
            if key not in section:
                raise ContractError(f"json.{key}: missing; lon and lat come together")
        if not CRS.from_epsg(epsg).is_geographic:
            raise ContractError(f"json.crs: {crs_text!r} is not a geographic CRS; lon and lat are degrees")
        paths = {k: _json_path(section[k], f"json.{k}") for k in ("lon", "lat", "z") if k in section}
        if len(set(paths.values())) != len(paths):
            raise ContractError(f"json: lon, lat and z must be different fields, got {paths}")
        fields = JsonFields(lon=paths["lon"], lat=paths["lat"], z=paths.get("z"), epsg=epsg)
    else:
        geometry = section["geometry"]
        if not isinstance(geometry, dict):
            raise ContractError(f"json.geometry: expected an object, got {geometry!r}")
        _known_keys_only(geometry, "json.geometry", "json.geometry.")
        path = _json_path(_require(geometry, "path", str, "json.geometry."), "json.geometry.path")
        encoding = _require(geometry, "encoding", str, "json.geometry.")
        if encoding not in JSON_GEOMETRY_ENCODINGS:
            raise ContractError(f"json.geometry.encoding: {encoding!r} is not one of {list(JSON_GEOMETRY_ENCODINGS)}")
        fields = JsonFields(geometry_path=path, geometry_encoding=encoding, epsg=epsg)
    # A member is a value or an object of members, never both.
    read = [(f"json.{k}", p) for k, p in (("lon", fields.lon), ("lat", fields.lat), ("z", fields.z))] + [
        ("json.geometry.path", fields.geometry_path)
    ]
    read += [
        (f"columns[{i}].from[{j}]", src.removeprefix(JSON_SOURCE_PREFIX))
        for i, col in enumerate(columns)
        for j, src in enumerate(col.sources)
        if src.startswith(JSON_SOURCE_PREFIX)
    ]
    named = [(where, p) for where, p in read if p is not None]
    for where, path in named:
        for other_where, other in named:
            if other.startswith(path + "."):
                raise ContractError(
                    f"{where}: {path!r} is a value there, but {other_where} reads {other!r} inside it as an object"
                )
    coordinate_or_geometry = {p for w, p in named if not w.startswith("columns")}
    for where, path in named:
        if where.startswith("columns") and path in coordinate_or_geometry:
            raise ContractError(f"{where}: {path!r} holds the geometry; a column cannot read it too")
    return fields


def _parse_registry(raw: dict, formats: tuple[str, ...]) -> RegistrySpec | None:
    registered = [f for f in formats if f in REGISTRY_FORMATS]
    if not registered:
        if "registry" in raw:
            raise ContractError(f"registry: only for the registry-encoded formats {list(REGISTRY_FORMATS)}")
        return None
    if len(registered) != len(formats):
        raise ContractError(
            f"formats: {registered} (Confluent wire format, first byte 0x00) cannot share a topic with "
            f"{[f for f in formats if f not in REGISTRY_FORMATS]}: big-endian WKB starts with 0x00 as well"
        )
    if len(registered) > 1:
        raise ContractError(f"formats: {registered}: a registry-encoded topic holds one of them")
    section = raw.get("registry")
    if not isinstance(section, dict):
        raise ContractError("registry: missing; name the record field(s) that hold the geometry")
    _known_keys_only(section, "registry", "registry.")
    for key, value in section.items():
        if not isinstance(value, str) or not value:
            raise ContractError(f"registry.{key}: expected a field name, got {value!r}")
    spec = RegistrySpec(**section)
    if bool(spec.geometry_field) == bool(spec.lon_field or spec.lat_field):
        raise ContractError("registry: name either geometry_field, or lon_field and lat_field")
    if bool(spec.lon_field) != bool(spec.lat_field):
        raise ContractError("registry: lon_field and lat_field go together")
    return spec


def _parse_event_time(raw: dict, columns: tuple[Column, ...]) -> str | None:
    """The event-time column: as named, else the first timestamptz column fed by kafka.timestamp."""
    if "event_time" not in raw:
        fed = [c.name for c in columns if c.type == "timestamptz" and "kafka.timestamp" in c.sources]
        return fed[0] if fed else None
    name = raw["event_time"]
    by_name = {c.name: c for c in columns}
    if not isinstance(name, str) or name not in by_name:
        raise ContractError(f"event_time: {name!r} is not one of the columns {list(by_name)}")
    if by_name[name].type != "timestamptz":
        raise ContractError(f"event_time: column {name!r} is a {by_name[name].type}, not a timestamptz")
    return name


_PARTITION_TEXT = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?:\((.*)\))?\s*$")


def _parse_partition(
    raw: dict,
    columns: tuple[Column, ...],
    geometry: GeometrySpec,
    event_time: str | None,
    clustering: Clustering,
    names: list[str],
) -> tuple[PartitionField, ...]:
    """The partition spec: as the contract writes it, else `day(<event time column>)` (none without one)."""
    if "partition" not in raw:
        return (PartitionField(f"day({event_time})", "day", event_time),) if event_time else ()
    texts = raw["partition"]
    if not isinstance(texts, list):
        raise ContractError(f"partition: expected a list of transforms like ['day(event_time)'], got {texts!r}")
    by_name = {c.name: c for c in columns}
    fields: list[PartitionField] = []
    estimate = 1
    for i, text in enumerate(texts):
        where = f"partition[{i}]"
        field = _parse_partition_field(text, where, by_name, geometry)
        if field.name in names and field.is_cell:
            raise ContractError(f"{where}: {text}: its cell column {field.name!r} would take the name of a column")
        if any(f.name == field.name for f in fields):
            raise ContractError(f"{where}: {text} is already in the spec")
        if field.transform in TIME_TRANSFORMS:
            clash = next((f for f in fields if f.transform in TIME_TRANSFORMS and f.source == field.source), None)
            if clash is not None:
                raise ContractError(f"{where}: {text}: {field.source} is already partitioned by {clash.text}")
        if field.is_cell:
            estimate *= _cell_count(clustering.extent, field.param or 1)
        elif field.transform == "bucket":
            estimate *= field.param or 1
        elif field.transform in _TIME_PARTITIONS_PER_BATCH:
            estimate *= _TIME_PARTITIONS_PER_BATCH[field.transform]
        if estimate > MAX_PARTITIONS_PER_BATCH:
            raise ContractError(
                f"{where}: {text} would let one batch write up to {estimate:,} partitions "
                f"(over the clustering extent), more than {MAX_PARTITIONS_PER_BATCH:,}; use a coarser transform"
            )
        fields.append(field)
    return tuple(fields)


def _cell_count(extent: tuple[float, float, float, float], precision: int) -> int:
    lon_bits, lat_bits = (5 * precision + 1) // 2, 5 * precision // 2
    xmin, ymin, xmax, ymax = extent
    w = 360.0 / (1 << lon_bits)
    h = 180.0 / (1 << lat_bits)
    nx = math.floor((min(xmax, 180.0) + 180.0) / w) - math.floor((max(xmin, -180.0) + 180.0) / w) + 1
    ny = math.floor((min(ymax, 90.0) + 90.0) / h) - math.floor((max(ymin, -90.0) + 90.0) / h) + 1
    return max(1, min(nx, 1 << lon_bits)) * max(1, min(ny, 1 << lat_bits))


def _parse_partition_field(text: Any, where: str, by_name: dict[str, Column], geometry: GeometrySpec) -> PartitionField:
    if not isinstance(text, str):
        raise ContractError(f"{where}: expected a transform like 'day(event_time)', got {text!r}")
    match = _PARTITION_TEXT.match(text)
    if match is None:
        raise ContractError(f"{where}: {text!r} is not a column or a transform like 'day(event_time)'")
    head, inner = match.group(1), match.group(2)
    if inner is None:  # identity
        transform, args = "identity", [head]
    else:
        transform, args = head.lower(), [a.strip() for a in inner.split(",")]
    if transform == "h3":
        raise ContractError(f"{where}: {text}: h3 cells are not offered; use geohash({geometry.name}, <precision>)")
    if transform not in PARTITION_TRANSFORMS:
        raise ContractError(
            f"{where}: {text}: unknown transform {head!r}; expected one of {list(PARTITION_TRANSFORMS)}"
        )
    arity = {"bucket": 2, "truncate": 2, "geohash": 2}.get(transform, 1)
    if len(args) != arity or not all(args):
        usage = {"bucket": "bucket(N, column)", "truncate": "truncate(W, column)"}.get(
            transform, f"geohash({geometry.name}, precision)" if transform == "geohash" else f"{transform}(column)"
        )
        raise ContractError(f"{where}: {text}: expected {usage}")
    if transform == "geohash":
        source, param_text = args
        if source != geometry.name:
            kind = f"a {by_name[source].type} column" if source in by_name else "not a column"
            raise ContractError(
                f"{where}: {text}: geohash takes the geometry column {geometry.name!r}; {source!r} is {kind}"
            )
        param = _whole(param_text, where, text, "precision", 1, GEOHASH_MAX_PRECISION)
        if not CRS.from_epsg(geometry.epsg).is_geographic:
            raise ContractError(
                f"{where}: {text}: geohash cells are of longitude/latitude; the table CRS {geometry.crs} is projected"
            )
        return PartitionField(text, transform, source, param)
    width: int | None = None
    if transform in ("bucket", "truncate"):
        width = _whole(args[0], where, text, "N" if transform == "bucket" else "W", 1, 2**31 - 1)
        args = args[1:]
    source = args[0]
    if source == geometry.name:
        raise ContractError(
            f"{where}: {text}: {transform} cannot take the geometry; use geohash({source}, <precision>)"
        )
    if source not in by_name:
        raise ContractError(f"{where}: {text}: {source!r} is not one of the columns {list(by_name)}")
    ctype = by_name[source].type
    allowed = {
        "bucket": ("int", "long", "string", "timestamptz"),
        "truncate": ("int", "long", "string"),
        "identity": tuple(COLUMN_TYPES),
    }.get(transform, ("timestamptz",))
    if ctype not in allowed:
        raise ContractError(
            f"{where}: {text}: column {source!r} is a {ctype}; {transform} takes {' or '.join(allowed)}"
        )
    return PartitionField(text, transform, source, width)


def _whole(value: str, where: str, text: str, what: str, lo: int, hi: int) -> int:
    if not re.fullmatch(r"\d+", value) or not lo <= int(value) <= hi:
        raise ContractError(f"{where}: {text}: {what} {value!r} must be a whole number {lo}..{hi}")
    return int(value)


def parse_retention(text: Any, where: str = "retention") -> int:
    """'30 days' or '12 hours' -> seconds; an error that names `where` otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]+)\s*", text) if isinstance(text, str) else None
    if match is None or match.group(2) not in _RETENTION_UNITS or int(match.group(1)) < 1:
        raise ContractError(f"{where}: {text!r} is not a retention; expected 'N days' or 'N hours', N at least 1")
    return int(match.group(1)) * _RETENTION_UNITS[match.group(2)]


def _parse_contract_retention(raw: dict, columns: tuple[Column, ...], terms: list[tuple[str, str]]) -> int | None:
    """The contract's retention in seconds, which needs a time partition (`terms`: the (transform,
    column) of the spec's time fields) of a timestamptz column: whole partitions are what retention
    drops."""
    if "retention" not in raw:
        return None
    seconds = parse_retention(raw["retention"])
    if not terms:
        raise ContractError(
            f"retention: {raw['retention']!r} needs a time partition to drop, and partition "
            f"({raw.get('partition', 'missing')!r}) has none; add e.g. 'day(<timestamptz column>)'"
        )
    types = {c.name: c.type for c in columns}
    for transform, column in terms:
        if types.get(column) != "timestamptz":
            raise ContractError(
                f"retention: the time partition {transform}({column}) is not of a timestamptz column "
                f"({column!r} is {types.get(column, 'not a column')})"
            )
    return seconds


def _declared_ids(columns: tuple[Column, ...], geometry_id: int, bbox_id: int) -> list[tuple[str, int]]:
    declared = [(f"columns[{i}].id", c.id) for i, c in enumerate(columns)]
    return declared + [("geometry.id", geometry_id), ("bbox.id", bbox_id)]


def _fresh_raster_id(contract: Contract) -> None:
    """The raster column comes after the bbox column, its flat copies and the cell columns."""
    if contract.raster is None:
        return
    expected = contract.bbox_id + 1 + len(contract.flat_bbox_names) + len(contract.cell_fields)
    if contract.raster.id != expected:
        raise ContractError(
            f"raster.id: id {contract.raster.id} breaks the sequence; a new table's raster column comes after "
            f"the bbox column (its flat columns and cell columns): expected {expected}"
        )


def check_fresh_ids(contract: Contract) -> None:
    """A new table's ids: Iceberg assigns 1..n to top-level fields in order on create, so the
    contract must state those (a table's later contracts keep the ids it has, gaps and all)."""
    declared = _declared_ids(contract.columns, contract.geometry.id, contract.bbox_id)
    for expected, (where, fid) in enumerate(declared, start=1):
        if fid != expected:
            raise ContractError(
                f"{where}: id {fid} breaks the sequence; a new table's top-level ids run 1..{len(declared)} "
                f"in declaration order (expected {expected})"
            )
    _fresh_raster_id(contract)


def _parse_primary_key(raw: dict, columns: tuple[Column, ...], mode: str) -> tuple[str, ...]:
    """The primary key's columns: as named, or in upsert mode by default the columns the Kafka key feeds."""
    if "primary_key" not in raw:
        if mode != "upsert":
            return ()
        from_key = tuple(c.name for c in columns if "kafka.key" in c.sources)
        if not from_key:
            raise ContractError(
                "primary_key: missing, and no column comes from kafka.key to stand for it; "
                "name the columns that address a feature, or map one from kafka.key"
            )
        return from_key[:1]
    names = raw["primary_key"]
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ContractError(f"primary_key: expected a column name or a list of them, got {raw['primary_key']!r}")
    by_name = {c.name: c for c in columns}
    for i, name in enumerate(names):
        column = by_name.get(name)
        if column is None:
            raise ContractError(f"primary_key[{i}]: {name!r} is not one of the columns {list(by_name)}")
        if not column.required:
            raise ContractError(f"primary_key[{i}]: column {name!r} must be required (a key is never null)")
        if column.type not in ("string", "int", "long", "date", "timestamp", "timestamptz", "binary"):
            raise ContractError(f"primary_key[{i}]: column {name!r} is a {column.type}, which cannot address a feature")
    if len(set(names)) != len(names):
        raise ContractError(f"primary_key: a column is named twice in {names}")
    return tuple(names)


def _parse_schema_evolution(raw: Any) -> SchemaEvolution:
    if isinstance(raw, str):
        raw = {"mode": raw}
    if not isinstance(raw, dict):
        raise ContractError(f"schema_evolution: expected 'off', 'add-columns' or an object, got {raw!r}")
    _known_keys_only(raw, "schema_evolution", "schema_evolution.")
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


def _require(obj: dict, key: str, kind: type, where: str = "") -> Any:
    if key not in obj:
        raise ContractError(f"{where}{key}: missing")
    value = obj[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ContractError(f"{where}{key}: expected {kind.__name__}, got {value!r}")
    return value


def _parse_column(raw: Any, where: str) -> Column:
    if not isinstance(raw, dict):
        raise ContractError(f"{where}: expected an object")
    _known_keys_only(raw, "columns[]", f"{where}.")
    name = _require(raw, "name", str, f"{where}.")
    ctype = _require(raw, "type", str, f"{where}.")
    if ctype not in COLUMN_TYPES:
        raise ContractError(f"{where}.type: {ctype!r} is not one of {sorted(COLUMN_TYPES)}")
    required = raw.get("required", False)
    if not isinstance(required, bool):
        raise ContractError(f"{where}.required: expected true or false, got {required!r}")
    sources = tuple(_require(raw, "from", list, f"{where}."))
    if not sources:
        raise ContractError(f"{where}.from: name at least one event field")
    for j, src in enumerate(sources):
        if not isinstance(src, str) or not _is_source(src):
            raise ContractError(
                f"{where}.from[{j}]: {src!r} is not an event field "
                "(id, properties.<name>, json.<path>, kafka.key|timestamp|topic|partition|offset, "
                "kafka.headers.<name>)"
            )
    return Column(id=_require(raw, "id", int, f"{where}."), name=name, type=ctype, required=required, sources=sources)


def _is_source(src: str) -> bool:
    if src == "id" or src in KAFKA_SOURCES:
        return True
    for prefix in ("properties.", "kafka.headers."):
        if src.startswith(prefix) and len(src) > len(prefix):
            return True
    return src.startswith(JSON_SOURCE_PREFIX) and bool(_JSON_PATH.match(src.removeprefix(JSON_SOURCE_PREFIX)))


def _parse_geometry(raw: dict) -> GeometrySpec:
    _known_keys_only(raw, "geometry", "geometry.")
    types = tuple(_require(raw, "types", list, "geometry."))
    for i, t in enumerate(types):
        if t not in GEOMETRY_TYPES:
            raise ContractError(f"geometry.types[{i}]: {t!r} is not one of {list(GEOMETRY_TYPES)}")
    dims = tuple(_require(raw, "dimensions", list, "geometry."))
    for i, d in enumerate(dims):
        if d not in DIMENSIONS:
            raise ContractError(f"geometry.dimensions[{i}]: {d!r} is not one of {list(DIMENSIONS)}")
    crs_text = _require(raw, "crs", str, "geometry.")
    epsg = _epsg_code(crs_text, "geometry.crs")
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
    return GeometrySpec(
        id=_require(raw, "id", int, "geometry."),
        name=_require(raw, "name", str, "geometry."),
        types=types,
        dimensions=dims,
        epsg=epsg,
        encoding=encoding,
        invalid_polygons=invalid,
        antimeridian=antimeridian,
    )


def _epsg_code(text: str, where: str) -> int:
    prefix, _, code = text.partition(":")
    if prefix.upper() != "EPSG" or not code.isdigit():
        raise ContractError(f"{where}: {text!r} is not of the form 'EPSG:<code>'")
    try:
        CRS.from_epsg(int(code))
    except Exception:
        raise ContractError(f"{where}: {text!r} is not a CRS known to PROJ") from None
    return int(code)


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
    _known_keys_only(raw, "clustering", "clustering.")
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
