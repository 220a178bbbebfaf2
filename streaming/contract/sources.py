"""Where events that are not GeoJSON Features hold their geometry: JSON fields (`json`), records of
a schema registry (`registry`), rasters (`raster`: Havasu's model, read from STAC Items)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyiceberg.types import DoubleType, IntegerType, ListType, NestedField, StringType, StructType
from pyproj import CRS

from streaming.contract.terms import (
    DEBEZIUM_SOURCES,
    DEBEZIUM_UNAVAILABLE_VALUE,
    JSON_GEOMETRY_ENCODINGS,
    JSON_PATH,
    JSON_SOURCE_PREFIX,
    RASTER_ROWS,
    REGISTRY_FORMATS,
    ContractError,
    epsg_code,
    known_keys_only,
    require,
)

if TYPE_CHECKING:
    from streaming.contract.parts import Column, GeometrySpec


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
class DebeziumSpec:
    """Where a Debezium change event's row holds its geometry: the source table's column (a
    PostGIS geometry or geography, which Debezium sends as a {wkb, srid} struct); `epsg` is the CRS
    of a geometry that carries no SRID (0 or none); `unavailable_value` the connector's
    `unavailable.value.placeholder`, what it sends for a value the source's log did not hold (a
    TOASTed value an update left unchanged)."""

    geometry: str
    epsg: int = 4326
    unavailable_value: str = DEBEZIUM_UNAVAILABLE_VALUE

    @property
    def unavailable_bytes(self) -> bytes:
        """The placeholder of a binary column: Debezium reads a "hex:" prefix as hexadecimal octets."""
        if self.unavailable_value.startswith("hex:"):
            return bytes.fromhex(self.unavailable_value.removeprefix("hex:"))
        return self.unavailable_value.encode()

    @property
    def unavailable_text(self) -> str:
        """The placeholder of a text column: the placeholder's bytes as text, as Debezium makes it."""
        return self.unavailable_bytes.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class RegistrySpec:
    """Where a registry-encoded record holds its geometry: one field (bytes: WKB or EWKB; a string:
    WKT), or a longitude and a latitude field (numbers); and optionally a field with its EPSG code."""

    geometry_field: str = ""
    lon_field: str = ""
    lat_field: str = ""
    srid_field: str = ""


def parse_raster(raw: dict, formats: tuple[str, ...], geometry: GeometrySpec) -> RasterSpec | None:
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
    known_keys_only(section, "raster", "raster.")
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
        id=require(section, "id", int, "raster."), name=require(section, "name", str, "raster."), rows=rows
    )


def _json_path(value: Any, where: str) -> str:
    if not isinstance(value, str) or not JSON_PATH.match(value):
        raise ContractError(f"{where}: {value!r} is not a JSON path (member names joined by dots, e.g. 'position.lon')")
    return value


def parse_json_fields(raw: dict, formats: tuple[str, ...], columns: tuple[Column, ...]) -> JsonFields | None:
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
    known_keys_only(section, "json", "json.")
    crs_text = section.get("crs", "EPSG:4326")
    if not isinstance(crs_text, str):
        raise ContractError(f"json.crs: expected a string, got {crs_text!r}")
    epsg = epsg_code(crs_text, "json.crs")
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
        known_keys_only(geometry, "json.geometry", "json.geometry.")
        path = _json_path(require(geometry, "path", str, "json.geometry."), "json.geometry.path")
        encoding = require(geometry, "encoding", str, "json.geometry.")
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


def parse_registry(raw: dict, formats: tuple[str, ...]) -> RegistrySpec | None:
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
    known_keys_only(section, "registry", "registry.")
    for key, value in section.items():
        if not isinstance(value, str) or not value:
            raise ContractError(f"registry.{key}: expected a field name, got {value!r}")
    spec = RegistrySpec(**section)
    if bool(spec.geometry_field) == bool(spec.lon_field or spec.lat_field):
        raise ContractError("registry: name either geometry_field, or lon_field and lat_field")
    if bool(spec.lon_field) != bool(spec.lat_field):
        raise ContractError("registry: lon_field and lat_field go together")
    return spec


def parse_debezium(raw: dict, formats: tuple[str, ...], mode: str, columns: tuple[Column, ...]) -> DebeziumSpec | None:
    """The `debezium` section: required with format "debezium", which reads nothing else; the
    table is an upsert table (a change event addresses its row by the source's primary key), and
    its columns read the row's columns as `properties.<column>`."""
    if "debezium" not in formats:
        if "debezium" in raw:
            raise ContractError("debezium: given, but 'debezium' is not in formats")
        for i, col in enumerate(columns):
            for j, src in enumerate(col.sources):
                if src in DEBEZIUM_SOURCES:
                    raise ContractError(
                        f"columns[{i}].from[{j}]: {src!r} reads a Debezium change event, but 'debezium' is not in formats"
                    )
        return None
    if formats != ("debezium",):
        raise ContractError(f"formats: a topic of Debezium change events holds nothing else, got {list(formats)}")
    if mode != "upsert":
        raise ContractError(
            "mode: format 'debezium' mirrors a table: its changes need mode 'upsert' "
            "(and primary_key, the source table's primary key)"
        )
    section = raw.get("debezium")
    if not isinstance(section, dict):
        raise ContractError(
            'debezium: missing or not an object; name the source column that holds the geometry ({"geometry": "geom"})'
        )
    known_keys_only(section, "debezium", "debezium.")
    geometry = require(section, "geometry", str, "debezium.")
    crs_text = section.get("crs", "EPSG:4326")
    if not isinstance(crs_text, str):
        raise ContractError(f"debezium.crs: expected a string, got {crs_text!r}")
    for i, col in enumerate(columns):
        for j, src in enumerate(col.sources):
            if src == f"properties.{geometry}":
                raise ContractError(f"columns[{i}].from[{j}]: {src!r} holds the geometry; a column cannot read it too")
            if src == "id" or src.startswith(JSON_SOURCE_PREFIX):
                raise ContractError(
                    f"columns[{i}].from[{j}]: {src!r} is not in a Debezium change event; "
                    "its row's columns are properties.<column>"
                )
    placeholder = section.get("unavailable_value", DEBEZIUM_UNAVAILABLE_VALUE)
    if not isinstance(placeholder, str) or not placeholder:
        raise ContractError(
            f"debezium.unavailable_value: expected the connector's unavailable.value.placeholder (a non-empty "
            f"string), got {placeholder!r}"
        )
    if placeholder.startswith("hex:") and not _is_hex(placeholder.removeprefix("hex:")):
        raise ContractError(f"debezium.unavailable_value: {placeholder!r} is not 'hex:' and hexadecimal octets")
    return DebeziumSpec(geometry=geometry, epsg=epsg_code(crs_text, "debezium.crs"), unavailable_value=placeholder)


def _is_hex(text: str) -> bool:
    try:
        return bool(bytes.fromhex(text))
    except ValueError:
        return False
