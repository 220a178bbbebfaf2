"""Why a record was not taken into the table: the stable reason codes, and the per-batch record of
which rows were rejected, for what and why (first reason wins)."""

from __future__ import annotations

import reprlib
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Any

import numpy as np


class Reason(StrEnum):
    """Why a record was not taken into the table. Values are stable: they label metrics and DLQ records."""

    NULL_VALUE = "null_value"
    MESSAGE_TOO_LARGE = "message_too_large"
    UNKNOWN_FORMAT = "unknown_format"
    FORMAT_NOT_ACCEPTED = "format_not_accepted"
    MALFORMED_JSON = "malformed_json"
    NESTING_TOO_DEEP = "nesting_too_deep"
    NOT_A_FEATURE = "not_a_feature"
    MISSING_GEOMETRY = "missing_geometry"
    INVALID_GEOJSON_GEOMETRY = "invalid_geojson_geometry"
    BAD_WKB = "bad_wkb"
    BAD_WKT = "bad_wkt"
    # JSON events with the geometry in fields (format "json")
    NOT_A_JSON_OBJECT = "not_a_json_object"
    MISSING_COORDINATES = "missing_coordinates"
    COORDINATE_AS_STRING = "coordinate_as_string"
    COORDINATE_NOT_A_NUMBER = "coordinate_not_a_number"
    LATITUDE_OUT_OF_RANGE = "latitude_out_of_range"
    LONGITUDE_OUT_OF_RANGE = "longitude_out_of_range"
    SWAPPED_AXES = "swapped_axes"
    BAD_GEOMETRY_ENCODING = "bad_geometry_encoding"
    GPKG_TOO_SHORT = "gpkg_too_short"
    GPKG_BAD_MAGIC = "gpkg_bad_magic"
    GPKG_UNKNOWN_VERSION = "gpkg_unknown_version"
    GPKG_BAD_FLAGS = "gpkg_bad_flags"
    GPKG_ENVELOPE_TRUNCATED = "gpkg_envelope_truncated"
    GPKG_EXTENDED_TYPE = "gpkg_extended_type"
    GPKG_ENVELOPE_MISMATCH = "gpkg_envelope_mismatch"
    EMPTY_GEOMETRY = "empty_geometry"
    GEOMETRY_TYPE_NOT_ALLOWED = "geometry_type_not_allowed"
    DIMENSION_NOT_ALLOWED = "dimension_not_allowed"
    NON_FINITE_COORDINATES = "non_finite_coordinates"
    UNKNOWN_SRID = "unknown_srid"
    REPROJECTION_FAILED = "reprojection_failed"
    OUTSIDE_CRS_AREA = "outside_crs_area"
    INVALID_POLYGON = "invalid_polygon"
    TOO_MANY_VERTICES = "too_many_vertices"
    TIME_BUDGET_EXCEEDED = "time_budget_exceeded"
    MISSING_REQUIRED_FIELD = "missing_required_field"
    PROPERTY_TYPE_MISMATCH = "property_type_mismatch"
    # Registry-encoded formats (Confluent wire format: 0x00, a 4-byte schema id, the record).
    BAD_WIRE_FORMAT = "bad_wire_format"
    UNKNOWN_SCHEMA_ID = "unknown_schema_id"
    SCHEMA_NOT_SUPPORTED = "schema_not_supported"
    SCHEMA_MISMATCH = "schema_mismatch"
    # Debezium change events (format "debezium"): no envelope, an operation other than c/r/u/d,
    # an upsert without its row ('after') or a delete without its key ('before').
    NOT_A_CHANGE_EVENT = "not_a_change_event"
    UNKNOWN_OPERATION = "unknown_operation"
    MISSING_ROW = "missing_row"
    # An update without a value it left unchanged (a TOASTed geometry under REPLICA IDENTITY
    # DEFAULT) for a table that keeps no current row to take it from (not an upsert table).
    UNAVAILABLE_VALUE = "unavailable_value"
    # Rasters (format "stac"): no usable geotransform, a CRS PROJ does not know, a shape that is
    # not [height, width] in whole pixels (or no asset on the raster's grid).
    RASTER_WITHOUT_TRANSFORM = "raster_without_transform"
    UNKNOWN_RASTER_CRS = "unknown_raster_crs"
    BAD_RASTER_SHAPE = "bad_raster_shape"
    # The decoder itself failed on the record (a defect, logged with its cause); the record is
    # dead-lettered rather than stopping the stream behind it.
    DECODE_FAILED = "decode_failed"
    # A record of a topic split over tables by a field route (docs/routing.md) whose value names no
    # table the route may write: none at all, not UTF-8 text, an invalid name, another route's table.
    NO_ROUTE = "no_route"


class Rejects:
    """First reason wins: a record is reported for the first check it fails."""

    @contextmanager
    def set_aside(self, rows: np.ndarray) -> Iterator[None]:
        """Leaves these rows (a boolean mask) out of the checks run meanwhile: no reason can be
        given to them, and `ok` is false for them until the block ends (the geometry rules skip the
        deletes of a change stream, which carry no geometry)."""
        held = rows & self._ok
        self._ok[held] = False
        try:
            yield
        finally:
            self._ok[held] = True

    def __init__(self, n: int):
        self.reason = np.full(n, None, dtype=object)
        self.detail = np.full(n, None, dtype=object)
        self._ok = np.ones(n, dtype=bool)

    @property
    def ok(self) -> np.ndarray:
        """Rows without a reason yet."""
        return self._ok.copy()

    def add(self, rows: np.ndarray, reason: Reason, detail: str | list[str]) -> None:
        """Mark rows (indices or a boolean mask) that have no reason yet."""
        idx = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows, dtype=np.int64)
        if idx.size == 0:
            return
        fresh = self._ok[idx]
        if isinstance(detail, str):
            details = np.full(idx.size, detail, dtype=object)
        else:
            details = np.asarray(detail, dtype=object)
        self.reason[idx[fresh]] = reason.value
        self.detail[idx[fresh]] = details[fresh]
        self._ok[idx[fresh]] = False

    def take(self, rows: np.ndarray) -> Rejects:
        """The reasons of the records at `rows`, one per row (a record repeated over its rows)."""
        out = Rejects(len(rows))
        out.reason, out.detail, out._ok = self.reason[rows], self.detail[rows], self._ok[rows]
        return out


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxstring, _SHORT_REPR.maxother, _SHORT_REPR.maxlong = 3, 80, 80, 40


def shown(value: Any) -> str:
    """A value of the input as a reject detail names it: short, whatever its size or depth."""
    return _SHORT_REPR.repr(value)
