"""The contract's vocabulary: its formats, sources, transforms and limits, the keys each section
knows, and the error every check raises, naming the field."""

from __future__ import annotations

import re
from typing import Any

from pyproj import CRS

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


FORMATS = ("geojson", "wkb", "ewkb", "gpkg", "json", "wkt", "ewkt", "avro", "protobuf", "stac", "debezium")


# Formats that read a JSON object; a table takes one of them.
JSON_OBJECT_FORMATS = ("geojson", "json", "stac", "debezium")


# What one row of a raster table is (`raster.rows`): a STAC Item (its raster assets the bands),
# or one raster asset of an Item (the Item's properties repeated over its assets).
RASTER_ROWS = ("item", "asset")


# The column source of the key of the asset a row stands for (`raster.rows` "asset").
ASSET_KEY_SOURCE = "asset.key"


# How the one JSON field that holds a whole geometry spells it (`json.geometry.encoding`).
JSON_GEOMETRY_ENCODINGS = ("wkt", "geojson", "wkb_hex", "wkb_base64")


JSON_SOURCE_PREFIX = "json."


# What a column may read of a Debezium change event beside its row (format "debezium"): the
# operation (c, r, u, d), the source's log position and the time the source committed the change.
DEBEZIUM_SOURCES = ("debezium.op", "debezium.lsn", "debezium.commit_time")
# What Debezium sends for a value the source's log did not hold (its unavailable.value.placeholder).
DEBEZIUM_UNAVAILABLE_VALUE = "__debezium_unavailable_value"


JSON_PATH = re.compile(r"^[^.\s]+(\.[^.\s]+)*$")


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
TIME_PARTITIONS_PER_BATCH = {"year": 1, "month": 1, "day": 2, "hour": 24}


GEOHASH_MAX_PRECISION = 12


EVENT_TIME_PROPERTY = "geoingest.event-time"


CELL_PROPERTY_PREFIX = "geoingest.partition.cell."


RETENTION_UNITS = {"day": 86400, "days": 86400, "hour": 3600, "hours": 3600}


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
        "debezium",
    ),
    "raster": ("id", "name", "rows"),
    "debezium": ("geometry", "crs", "unavailable_value"),
    "json": ("lon", "lat", "z", "geometry", "crs"),
    "json.geometry": ("path", "encoding"),
    "registry": ("geometry_field", "lon_field", "lat_field", "srid_field"),
    "columns[]": ("id", "name", "type", "required", "from", "description"),
    "geometry": ("id", "name", "types", "dimensions", "crs", "encoding", "invalid_polygons", "antimeridian", "native"),
    "bbox": ("id", "name", "flat_columns", "stored"),
    "clustering": ("hilbert_bits", "extent", "target_file_bytes", "row_group_rows"),
    "schema_evolution": ("mode", "max_new_columns_per_batch", "max_columns", "name_pattern"),
}


ANTIMERIDIAN_READINGS = ("short", "planar")


class ContractError(ValueError):
    """A contract that cannot be used; the message starts with the offending field."""


def known_keys_only(raw: dict, kind: str, where: str) -> None:
    for key in raw:
        if key not in KNOWN_KEYS[kind]:
            raise ContractError(f"{where}{key}: not a contract key; expected one of {', '.join(KNOWN_KEYS[kind])}")


def require(obj: dict, key: str, kind: type, where: str = "") -> Any:
    if key not in obj:
        raise ContractError(f"{where}{key}: missing")
    value = obj[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ContractError(f"{where}{key}: expected {kind.__name__}, got {value!r}")
    return value


def epsg_code(text: str, where: str) -> int:
    prefix, _, code = text.partition(":")
    if prefix.upper() != "EPSG" or not code.isdigit():
        raise ContractError(f"{where}: {text!r} is not of the form 'EPSG:<code>'")
    try:
        CRS.from_epsg(int(code))
    except Exception:
        raise ContractError(f"{where}: {text!r} is not a CRS known to PROJ") from None
    return int(code)
