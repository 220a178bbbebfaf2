"""Decode, validate and reproject a batch of Kafka records: Arrow in, Arrow out.

Input is the Kafka source's batch (key, value, topic, partition, offset, timestamp, headers);
headers come as a list of (key, value) structs, or as the JSON text Spark's to_json makes of them
(values base64), which is how the streaming job hands them over (see `headers_from_json`).
Output has one row per input row: the contract's columns, the WKB geometry in the table CRS,
its bbox, its Hilbert key and the record's source coordinates. A record that cannot be used
keeps its row, with a stable reason code and a message naming the offending field or value,
so nothing is dropped silently: the caller routes rejects to the dead-letter topic.

The work is vectorised: GeoJSON documents are parsed a block at a time by pyarrow's JSON reader
(properties) and by GEOS (geometry); WKB by GEOS. Only a block the reader refuses is split in
halves until the offending records are isolated; those few are diagnosed one by one.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import reprlib
import struct
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import shapely
from pyproj.exceptions import CRSError, ProjError

from streaming.contract import Column, Contract
from streaming.crs import UnknownSrid, known_crs, reproject, transformer, valid_area
from streaming.geojson import ndjson, read_geometries
from streaming.hilbert import hilbert_keys_of_bounds

log = logging.getLogger("geoingest.decode")


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
    EMPTY_GEOMETRY = "empty_geometry"
    GEOMETRY_TYPE_NOT_ALLOWED = "geometry_type_not_allowed"
    DIMENSION_NOT_ALLOWED = "dimension_not_allowed"
    NON_FINITE_COORDINATES = "non_finite_coordinates"
    UNKNOWN_SRID = "unknown_srid"
    REPROJECTION_FAILED = "reprojection_failed"
    OUTSIDE_CRS_AREA = "outside_crs_area"
    INVALID_POLYGON = "invalid_polygon"
    TOO_MANY_VERTICES = "too_many_vertices"
    MISSING_REQUIRED_FIELD = "missing_required_field"
    PROPERTY_TYPE_MISMATCH = "property_type_mismatch"
    # The decoder itself failed on the record (a defect, logged with its cause); the record is
    # dead-lettered rather than stopping the stream behind it.
    DECODE_FAILED = "decode_failed"


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

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_GEOJSON_SRID = 4326  # RFC 7946: GeoJSON coordinates are always WGS 84 lon/lat
_TYPE_NAMES = {
    0: "Point",
    1: "LineString",
    2: "LinearRing",
    3: "Polygon",
    4: "MultiPoint",
    5: "MultiLineString",
    6: "MultiPolygon",
    7: "GeometryCollection",
}
_TYPE_NAME_BY_ID = np.array([*_TYPE_NAMES.values(), "Unknown"], dtype=object)
_JSON_WHITESPACE = (0x20, 0x09, 0x0D, 0x0A)
GEOJSON_GEOMETRY_TYPES = (
    "Point",
    "LineString",
    "Polygon",
    "MultiPoint",
    "MultiLineString",
    "MultiPolygon",
    "GeometryCollection",
)
# WKB types made of other geometries: Multi*, GeometryCollection, CompoundCurve, CurvePolygon,
# MultiCurve, MultiSurface, PolyhedralSurface, TIN.
_WKB_CONTAINER_TYPES = (4, 5, 6, 7, 9, 10, 11, 12, 15, 16)
_WKB_CURVE_TYPES = (8, 9, 10, 11, 12)  # CircularString, CompoundCurve, CurvePolygon, MultiCurve, MultiSurface
_EWKB_Z_FLAG, _EWKB_M_FLAG, _EWKB_SRID_FLAG = 0x80000000, 0x40000000, 0x20000000
_EWKB_FLAGS = _EWKB_Z_FLAG | _EWKB_M_FLAG | _EWKB_SRID_FLAG
_UNLIMITED = 1 << 62  # a walk's depth limit that is never reached
# GEOS reads, writes and walks nested geometries recursively: this deep is far from the end of an
# 8 MiB stack (50,000 levels overflow it).
_GEOS_SAFE_NESTING = 1000
_ROW_IN_ERROR = re.compile(r"in row (\d+)")
_GEOMETRY_MEMBER = pa.struct([("type", pa.string())])
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxstring, _SHORT_REPR.maxother, _SHORT_REPR.maxlong = 3, 80, 80, 40
# None as numpy reads it in np.equal(a, None) or np.where(c, a, None); numpy's stubs do not take a
# bare None where they expect an array.
_NONE = np.array(None, dtype=object)
_NONE.flags.writeable = False


@dataclass(frozen=True)
class DecodeOptions:
    max_message_bytes: int = 1024 * 1024
    max_vertices: int = 100_000
    # Geometries nested in geometries (GeometryCollection, Multi*, Feature in a geometry member):
    # GEOS reads and walks them recursively, and a few thousand levels overflow its stack.
    max_nesting: int = 32


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
    ]
    return pa.schema(fields)


class _Rejects:
    """First reason wins: a record is reported for the first check it fails."""

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


class Decoder:
    def __init__(self, contract: Contract, options: DecodeOptions | None = None):
        self.contract = contract
        self.options = options or DecodeOptions()
        self.schema = decoded_schema(contract)
        self._data_schema = contract.arrow_schema
        self._table_epsg = contract.geometry.epsg
        self._area = valid_area(self._table_epsg)
        prop_types: dict[str, pa.DataType] = {}
        for col in contract.columns:
            for src in col.sources:
                if src.startswith("properties."):
                    prop_types[src.removeprefix("properties.")] = self._data_schema.field(col.name).type
        self._property_types = prop_types

    # -- entry point ---------------------------------------------------------------------------
    def decode(self, batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        """Every input row comes out, valid or with a reason: no input bytes make this raise."""
        batch = _normalized(batch)
        try:
            return self._decode(batch)
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
            except Exception as part_exc:  # noqa: BLE001
                parts.append(self._decode_isolating(part, part_exc))
        return pa.Table.from_batches(parts, schema=self.schema).combine_chunks().to_batches()[0]

    def failed(self, batch: pa.RecordBatch, detail: str) -> pa.RecordBatch:
        """One record the decoder itself could not handle, as a decode_failed reject."""
        batch = _normalized(batch)
        rejects = _Rejects(1)
        rejects.add(np.array([0]), Reason.DECODE_FAILED, detail)
        columns = {col.name: pa.nulls(1, self._data_schema.field(col.name).type) for col in self.contract.columns}
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
        rejects = _Rejects(n)

        lengths = pc.fill_null(pc.binary_length(values), -1).to_numpy(zero_copy_only=False)
        rejects.add(lengths < 0, Reason.NULL_VALUE, "the Kafka record has a null value")
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

        first = _first_significant_byte(values, rejects.ok)
        is_json = first == ord("{")
        is_wkb = (first == 0) | (first == 1)
        unknown = rejects.ok & ~is_json & ~is_wkb
        rejects.add(unknown & (first == ord("[")), Reason.NOT_A_FEATURE, "a JSON array is not a GeoJSON Feature")
        rejects.add(
            unknown,
            Reason.UNKNOWN_FORMAT,
            "value is neither a JSON object nor WKB (first byte is not '{', 0x00 or 0x01)",
        )

        geoms = np.full(n, None, dtype=object)
        # The stored WKB of a geometry already written out (a WKB input read as it is), else None.
        wkb = np.full(n, None, dtype=object)
        srids = np.full(n, self._table_epsg, dtype=np.int64)
        # x, y of each plain point (_plain_points), which gets no geometry object; NaN elsewhere.
        points_xy = np.full((n, 2), np.nan)
        feature_ids = pa.nulls(n, pa.string())
        properties = {name: pa.nulls(n, t) for name, t in self._property_types.items()}

        json_rows = np.flatnonzero(is_json & rejects.ok)
        if json_rows.size:
            if "geojson" not in self.contract.formats:
                rejects.add(json_rows, Reason.FORMAT_NOT_ACCEPTED, "GeoJSON events are not accepted by this table")
            else:
                feature_ids, properties = self._decode_geojson(values, json_rows, geoms, rejects, n)
                srids[json_rows] = _GEOJSON_SRID

        wkb_rows = np.flatnonzero(is_wkb & rejects.ok)
        if wkb_rows.size:
            self._decode_wkb(values, wkb_rows, geoms, srids, rejects, wkb, points_xy)

        self._validate_geometry(geoms, srids, rejects, points_xy)
        geoms = self._to_table_crs(geoms, srids, rejects, wkb)
        self._check_area_and_shape(geoms, rejects, wkb, points_xy)

        columns = self._map_columns(batch, feature_ids, properties, rejects)
        return self._assemble(batch, columns, geoms, rejects, wkb, points_xy)

    # -- formats -------------------------------------------------------------------------------
    def _decode_geojson(
        self, values: pa.Array, rows: np.ndarray, geoms: np.ndarray, rejects: _Rejects, n: int
    ) -> tuple[pa.Array, dict[str, pa.Array]]:
        no_ids = pa.nulls(n, pa.string())
        no_properties = {k: pa.nulls(n, t) for k, t in self._property_types.items()}
        docs = values.take(pa.array(rows))
        # Every object GEOS recurses into has a "type" member, so a document with few of them
        # cannot nest deeply; the rare one with many is checked exactly before GEOS sees it.
        many_types = pc.greater(
            pc.count_substring(docs.cast(pa.binary()), '"type"'), self.options.max_nesting
        ).to_numpy(zero_copy_only=False)
        for local in np.flatnonzero(many_types).tolist():
            problem = _geojson_nesting_problem(docs[int(local)].as_py(), self.options.max_nesting)
            if problem is not None:
                rejects.add(rows[[local]], *problem)
        rows, docs = _still_ok(rows, docs, rejects)
        not_utf8 = _invalid_utf8(docs)
        rejects.add(rows[not_utf8], Reason.MALFORMED_JSON, "value is not valid UTF-8 JSON")
        rows, docs = _still_ok(rows, docs, rejects)
        for local, detail in _raw_control_characters(docs):
            rejects.add(rows[[local]], Reason.MALFORMED_JSON, detail)
        rows, docs = _still_ok(rows, docs, rejects)
        if rows.size == 0:
            return no_ids, no_properties
        # Line breaks left in a document now lie between tokens, where they are whitespace; the
        # block readers split documents on them.
        flat = pc.replace_substring(pc.replace_substring(docs, "\n", " "), "\r", " ")
        parsed = _FeatureParser(self._property_types).parse(flat)
        for local, (reason, detail) in parsed.errors.items():
            rejects.add(rows[[local]], reason, detail)
        bad_rows = np.zeros(rows.size, dtype=bool)
        bad_rows[list(parsed.errors)] = True
        not_feature = pc.fill_null(pc.not_equal(parsed.types, "Feature"), True).to_numpy(zero_copy_only=False)
        not_feature &= ~bad_rows
        rejects.add(
            rows[not_feature],
            Reason.NOT_A_FEATURE,
            [
                f"type is {_shown(t)}, expected 'Feature'"
                for t in parsed.types.filter(pa.array(not_feature)).to_pylist()
            ],
        )
        bad_rows |= not_feature
        # GEOS would read a Feature (or worse) in the geometry member as its inner geometry.
        geometry_types = parsed.geometry_types
        named_otherwise = pc.and_(
            pc.is_valid(geometry_types), pc.invert(pc.is_in(geometry_types, pa.array(GEOJSON_GEOMETRY_TYPES)))
        )
        not_geometry = named_otherwise.to_numpy(zero_copy_only=False) & ~bad_rows
        rejects.add(
            rows[not_geometry],
            Reason.INVALID_GEOJSON_GEOMETRY,
            [
                f"geometry: type {_shown(t)} is not a GeoJSON geometry type"
                for t in geometry_types.filter(pa.array(not_geometry)).to_pylist()
            ],
        )
        bad_rows |= not_geometry
        # pyarrow's reader takes NaN and Infinity, which are no JSON numbers (one by one they are refused too).
        for name, column in parsed.properties.items():
            if pa.types.is_floating(column.type):
                odd = ~pc.fill_null(pc.is_finite(column), True).to_numpy(zero_copy_only=False) & ~bad_rows
                rejects.add(
                    rows[odd],
                    Reason.PROPERTY_TYPE_MISMATCH,
                    [
                        f"properties.{name}: {v} is not a finite number"
                        for v in column.filter(pa.array(odd)).to_pylist()
                    ],
                )
                bad_rows |= odd

        local_usable = np.flatnonzero(~bad_rows)
        fast, read = read_geometries(
            flat.take(pa.array(local_usable)),
            geometry_types.take(pa.array(local_usable)).to_numpy(zero_copy_only=False),
        )
        geoms[rows[local_usable[read]]] = fast[read]
        # What the fast reader leaves (other shapes, anything not plainly well formed) GEOS reads.
        rest = local_usable[~read]
        text = pc.cast(docs.take(pa.array(rest)), pa.string()).to_numpy(zero_copy_only=False)
        with np.errstate(all="ignore"):  # a number beyond the double range is reported below, not warned of
            decoded = shapely.from_geojson(text, on_invalid="ignore") if rest.size else np.zeros(0, dtype=object)
        geoms[rows[rest]] = decoded
        failed = rest[np.equal(decoded, _NONE)]
        for local in failed:
            diagnosis = _diagnose_geojson_geometry(docs[int(local)].as_py(), self._property_types)
            if diagnosis[1] is None:  # a geometry: the refusal was about something else
                geoms[rows[local]] = diagnosis[0]
            else:
                _, reason, detail = diagnosis
                rejects.add(rows[[local]], reason, detail)

        feature_ids = _scatter(parsed.ids, rows, n)
        properties = {name: _scatter(arr, rows, n) for name, arr in parsed.properties.items()}
        return feature_ids, properties

    def _decode_wkb(
        self,
        values: pa.Array,
        rows: np.ndarray,
        geoms: np.ndarray,
        srids: np.ndarray,
        rejects: _Rejects,
        wkb: np.ndarray,
        points_xy: np.ndarray,
    ) -> None:
        taken = values.take(pa.array(rows)).cast(pa.binary())
        codes, little = _wkb_header_codes(taken)
        max_nesting = self.options.max_nesting
        too_deep = f"geometries nested more than max_nesting={max_nesting} levels deep"
        # GEOS recurses once per level of nesting as it reads a value. A value long enough to nest
        # deeper than GEOS safely goes (9 bytes a level) is walked first, without recursion; the
        # nesting of the others is checked on what GEOS read of them.
        unsafe = pc.greater(pc.binary_length(taken), 9 * (max(max_nesting, _GEOS_SAFE_NESTING) + 1)).to_numpy(
            zero_copy_only=False
        )
        for local in np.flatnonzero(np.isin(_wkb_base_type(codes), _WKB_CONTAINER_TYPES) & unsafe):
            deepest, _, _ = _walk_wkb(taken[int(local)].as_py(), max_nesting)
            if deepest > max_nesting:
                rejects.add(rows[[local]], Reason.NESTING_TOO_DEEP, too_deep)
        live = rejects.ok[rows]
        rows, taken, codes, little = rows[live], taken.filter(pa.array(live)), codes[live], little[live]
        if rows.size == 0:
            return
        blobs = taken.to_numpy(zero_copy_only=False)
        plain, xy = _plain_points(taken, codes, little)
        points_xy[rows[plain]] = xy
        decoded = np.full(rows.size, None, dtype=object)
        curved = np.zeros(rows.size, dtype=bool)
        decoded[~plain], curved[~plain] = _read_wkb(blobs[~plain])
        curves_not_allowed = (
            f"a curve (CircularString, CompoundCurve, CurvePolygon, MultiCurve or MultiSurface) "
            f"is not one of {list(self.contract.geometry.types)}"
        )
        rejects.add(rows[curved], Reason.GEOMETRY_TYPE_NOT_ALLOWED, curves_not_allowed)
        bad = np.equal(decoded, _NONE) & ~plain
        for local in np.flatnonzero(bad & ~curved):
            deepest, problem, _ = _walk_wkb(blobs[local], _UNLIMITED)
            if deepest > max_nesting:
                rejects.add(rows[[local]], Reason.NESTING_TOO_DEEP, too_deep)
            else:
                rejects.add(rows[[local]], Reason.BAD_WKB, _unreadable_wkb(blobs[local], problem))
        # Collections are the geometries GEOS read that can nest, and hold curves shapely cannot
        # (GEOS refuses a curve in any other container): they are walked.
        for local in np.flatnonzero(~bad)[shapely.get_type_id(decoded[~bad]) == 7]:
            deepest, _, curve = _walk_wkb(blobs[local], max_nesting)
            if curve:
                rejects.add(rows[[local]], Reason.GEOMETRY_TYPE_NOT_ALLOWED, curves_not_allowed)
            elif deepest > max_nesting:
                rejects.add(rows[[local]], Reason.NESTING_TOO_DEEP, too_deep)
            bad[local] = curve or deepest > max_nesting
        parsed = np.flatnonzero(~bad)
        # Plain points and polygons are their own stored form (what GEOS would write back of
        # them, byte for byte): the rest is written back.
        lengths = np.diff(_offsets_and_bytes(taken)[0])
        as_sent = plain[parsed] | _plain_polygons(lengths[parsed], codes[parsed], little[parsed], decoded[parsed])
        read = parsed[~as_sent]
        written = _to_wkb(decoded[read])
        wkb[rows[parsed[as_sent]]] = blobs[parsed[as_sent]]
        wkb[rows[read]] = written
        # GEOS stops reading where the geometry ends and overlooks type bits and byte order bytes
        # WKB does not define: the value must be exactly the WKB of the geometry read from it. A
        # value written back otherwise (parts in another byte order, an SRID of 0) is walked to
        # tell a different spelling of WKB from a value that is not WKB.
        exact = np.ones(parsed.size, dtype=bool)
        exact[~as_sent] = _written_back_exactly(
            taken.take(pa.array(read)), written, decoded[read], codes[read], little[read]
        )
        for local in parsed[~exact]:
            _, problem, _ = _walk_wkb(blobs[local], _UNLIMITED)
            if problem is not None:
                rejects.add(rows[[local]], Reason.BAD_WKB, f"value is not one well-formed WKB geometry: {problem}")
                bad[local] = True
        good = ~bad
        geoms[rows[good]] = decoded[good]
        has_srid = (codes[good] & _EWKB_SRID_FLAG) != 0
        if has_srid.any() and "ewkb" not in self.contract.formats:
            rejects.add(
                rows[good][has_srid],
                Reason.FORMAT_NOT_ACCEPTED,
                "EWKB (WKB with an SRID) is not accepted by this table",
            )
        if (~has_srid).any() and "wkb" not in self.contract.formats:
            rejects.add(
                rows[good][~has_srid], Reason.FORMAT_NOT_ACCEPTED, "WKB without an SRID is not accepted by this table"
            )
        # Plain WKB carries no CRS: it is taken to be in the table CRS. An EWKB SRID is honoured,
        # 0 too (PostGIS's "unknown", which no EPSG code is).
        srids[rows[good]] = np.where(has_srid, shapely.get_srid(decoded[good]), self._table_epsg)

    # -- geometry checks -----------------------------------------------------------------------
    def _validate_geometry(
        self, geoms: np.ndarray, srids: np.ndarray, rejects: _Rejects, points_xy: np.ndarray
    ) -> None:
        spec = self.contract.geometry
        plain = ~np.isnan(points_xy[:, 0])
        # A plain point is a finite XY Point in the table CRS: only the contract's types,
        # dimensions and vertex limit can refuse it.
        points = np.flatnonzero(rejects.ok & plain)
        if "Point" not in spec.types:
            rejects.add(
                points, Reason.GEOMETRY_TYPE_NOT_ALLOWED, f"geometry type Point is not one of {list(spec.types)}"
            )
        if "XY" not in spec.dimensions:
            rejects.add(points, Reason.DIMENSION_NOT_ALLOWED, f"dimensions XY are not one of {list(spec.dimensions)}")
        if self.options.max_vertices < 1:
            rejects.add(points, Reason.TOO_MANY_VERTICES, f"1 vertices exceed max_vertices={self.options.max_vertices}")
        live = np.flatnonzero(rejects.ok & ~plain)
        g = geoms[live]
        rejects.add(live[shapely.is_empty(g)], Reason.EMPTY_GEOMETRY, "the geometry is empty")

        type_names = _type_names(shapely.get_type_id(g))
        wrong_type = ~np.isin(type_names, spec.types)
        rejects.add(
            live[wrong_type],
            Reason.GEOMETRY_TYPE_NOT_ALLOWED,
            [f"geometry type {t} is not one of {list(spec.types)}" for t in type_names[wrong_type]],
        )

        dims = np.array(["XY", "XYZ", "XYM", "XYZM"], dtype=object)[
            shapely.has_z(g).astype(int) + 2 * shapely.has_m(g).astype(int)
        ]
        wrong_dims = ~np.isin(dims, spec.dimensions)
        rejects.add(
            live[wrong_dims],
            Reason.DIMENSION_NOT_ALLOWED,
            [f"dimensions {d} are not one of {list(spec.dimensions)}" for d in dims[wrong_dims]],
        )

        vertices = shapely.get_num_coordinates(g)
        too_many = vertices > self.options.max_vertices
        rejects.add(
            live[too_many],
            Reason.TOO_MANY_VERTICES,
            [f"{v} vertices exceed max_vertices={self.options.max_vertices}" for v in vertices[too_many]],
        )

        coords, index = shapely.get_coordinates(g, include_z=True, return_index=True)
        z_expected = shapely.has_z(g)[index]
        finite = np.isfinite(coords[:, 0]) & np.isfinite(coords[:, 1]) & (np.isfinite(coords[:, 2]) | ~z_expected)
        bad_geom = np.unique(index[~finite])
        rejects.add(live[bad_geom], Reason.NON_FINITE_COORDINATES, "a coordinate is NaN or infinite")

        live = np.flatnonzero(rejects.ok)
        for srid in np.unique(srids[live]):
            try:
                crs = known_crs(int(srid))
            except UnknownSrid as exc:
                rejects.add(live[srids[live] == srid], Reason.UNKNOWN_SRID, str(exc))
                continue
            if not (crs.is_geographic or crs.is_projected):
                rejects.add(
                    live[srids[live] == srid],
                    Reason.UNKNOWN_SRID,
                    f"SRID {srid} is EPSG:{srid} ({crs.name}), not a horizontal geographic or projected CRS",
                )

    def _to_table_crs(self, geoms: np.ndarray, srids: np.ndarray, rejects: _Rejects, wkb: np.ndarray) -> np.ndarray:
        out = geoms.copy()
        live = rejects.ok
        for srid in np.unique(srids[live]):
            if srid == self._table_epsg:
                continue
            rows = np.flatnonzero(live & (srids == srid))
            has_m = shapely.has_m(geoms[rows])
            rejects.add(
                rows[has_m],
                Reason.REPROJECTION_FAILED,
                f"geometries with M cannot be reprojected from EPSG:{srid}; send them in EPSG:{self._table_epsg}",
            )
            rows = rows[~has_m]
            try:
                area = valid_area(int(srid))
                transformer(int(srid), self._table_epsg)
            except (ValueError, ProjError, CRSError) as exc:
                rejects.add(
                    rows,
                    Reason.REPROJECTION_FAILED,
                    f"no transformation from EPSG:{srid} to EPSG:{self._table_epsg}: {exc}",
                )
                continue
            # PROJ extrapolates far outside a CRS's area and lands somewhere plausible but wrong.
            xmin, ymin, xmax, ymax = area
            if xmin > xmax:  # a geographic area across the antimeridian (NAD83, NZGD2000): longitudes wrap
                xmin, xmax = -180.0, 180.0
            slack_x, slack_y = (xmax - xmin) / 2, (ymax - ymin) / 2
            b = shapely.bounds(geoms[rows])
            far = (
                (b[:, 0] < xmin - slack_x)
                | (b[:, 2] > xmax + slack_x)
                | (b[:, 1] < ymin - slack_y)
                | (b[:, 3] > ymax + slack_y)
            )
            rejects.add(
                rows[far],
                Reason.OUTSIDE_CRS_AREA,
                [
                    f"bounds ({r[0]:.6g}, {r[1]:.6g}, {r[2]:.6g}, {r[3]:.6g}) lie far outside the area "
                    f"of EPSG:{srid} ({xmin:.6g}, {ymin:.6g}, {xmax:.6g}, {ymax:.6g})"
                    for r in b[far]
                ],
            )
            rows = rows[~far]
            moved = reproject(geoms[rows], int(srid), self._table_epsg)
            bounds = shapely.bounds(moved)
            failed = ~np.all(np.isfinite(bounds), axis=1)
            rejects.add(
                rows[failed],
                Reason.REPROJECTION_FAILED,
                f"PROJ could not transform the coordinates from EPSG:{srid} to EPSG:{self._table_epsg}",
            )
            out[rows] = moved
            wkb[rows] = None
        return out

    def _check_area_and_shape(
        self, geoms: np.ndarray, rejects: _Rejects, wkb: np.ndarray, points_xy: np.ndarray
    ) -> None:
        live = np.flatnonzero(rejects.ok)
        b = _bounds(geoms[live], points_xy[live])
        xmin, ymin, xmax, ymax = self._area
        if xmin > xmax:  # a geographic area across the antimeridian: any longitude may be in it
            xmin, xmax = -180.0, 180.0
        outside = (b[:, 0] < xmin) | (b[:, 1] < ymin) | (b[:, 2] > xmax) | (b[:, 3] > ymax)
        rejects.add(
            live[outside],
            Reason.OUTSIDE_CRS_AREA,
            [
                f"bounds ({r[0]:.6g}, {r[1]:.6g}, {r[2]:.6g}, {r[3]:.6g}) leave the valid area of "
                f"EPSG:{self._table_epsg} ({xmin:.6g}, {ymin:.6g}, {xmax:.6g}, {ymax:.6g})"
                for r in b[outside]
            ],
        )

        live = np.flatnonzero(rejects.ok)
        polygonal = np.isin(shapely.get_type_id(geoms[live]), (3, 6))
        candidates = live[polygonal]
        invalid = candidates[~shapely.is_valid(geoms[candidates])]
        if invalid.size == 0:
            return
        reasons = shapely.is_valid_reason(geoms[invalid])
        if self.contract.geometry.invalid_polygons == "reject":
            rejects.add(invalid, Reason.INVALID_POLYGON, [f"invalid polygon: {r}" for r in reasons])
            return
        # GEOS's "structure" repair (the rules of JTS's GeometryFixer): rings are shells and
        # holes, overlapping shells are unioned. Measured on invalid OSM building shapes, 8x
        # faster than the "linework" default, which keeps every edge of the input.
        repaired = shapely.make_valid(geoms[invalid], method="structure")
        repaired_types = _type_names(shapely.get_type_id(repaired))
        fits = np.isin(repaired_types, self.contract.geometry.types) & ~shapely.is_empty(repaired)
        geoms[invalid[fits]] = repaired[fits]
        wkb[invalid[fits]] = None
        rejects.add(
            invalid[~fits],
            Reason.INVALID_POLYGON,
            [
                f"invalid polygon ({r}); its repair is a {t}, which the table does not allow"
                for r, t in zip(reasons[~fits], repaired_types[~fits])
            ],
        )

    # -- columns -------------------------------------------------------------------------------
    def _map_columns(
        self, batch: pa.RecordBatch, feature_ids: pa.Array, properties: dict[str, pa.Array], rejects: _Rejects
    ) -> dict[str, pa.Array]:
        columns: dict[str, pa.Array] = {}
        for col in self.contract.columns:
            target = self._data_schema.field(col.name).type
            merged: pa.Array | None = None
            for src in col.sources:
                wanted = None if merged is None else pc.is_null(merged)
                candidate = self._source_array(batch, src, feature_ids, properties, col, target, rejects, wanted)
                merged = candidate if merged is None else pc.coalesce(merged, candidate)
            if col.required:
                missing = rejects.ok & pc.is_null(merged).to_numpy(zero_copy_only=False)
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
        col: Column,
        target: pa.DataType,
        rejects: _Rejects,
        wanted: pa.Array | None,
    ) -> pa.Array:
        """Values of one source as the column's type, for the rows in `wanted` (all if None)."""
        if src.startswith("properties."):
            return properties[src.removeprefix("properties.")]
        if src == "id":
            raw = feature_ids
        elif src == "kafka.key":
            raw = batch.column("key")
        elif src == "kafka.timestamp":
            raw = batch.column("timestamp")
        elif src in ("kafka.topic", "kafka.partition", "kafka.offset"):
            raw = batch.column(src.removeprefix("kafka."))
        else:
            raw = _header_values(batch, src.removeprefix("kafka.headers."))
        if wanted is not None:
            raw = pc.if_else(wanted, raw, pa.nulls(len(raw), raw.type))
        return _cast_or_reject(raw, target, f"{col.name} (from {src})", rejects)

    def _assemble(
        self,
        batch: pa.RecordBatch,
        columns: dict[str, pa.Array],
        geoms: np.ndarray,
        rejects: _Rejects,
        wkb: np.ndarray,
        points_xy: np.ndarray,
    ) -> pa.RecordBatch:
        ok = rejects.ok
        n = batch.num_rows
        keep = np.where(ok, geoms, _NONE)
        wkb = np.where(ok, wkb, _NONE)
        unwritten = ok & np.equal(wkb, _NONE)
        wkb[unwritten] = _to_wkb(geoms[unwritten])
        bounds = _bounds(keep, points_xy)
        extent = self.contract.clustering.extent
        keys = np.zeros(n, dtype=np.int64)
        if ok.any():
            b = bounds[ok]
            keys[ok] = hilbert_keys_of_bounds(
                b[:, 0], b[:, 1], b[:, 2], b[:, 3], extent, self.contract.clustering.hilbert_bits
            )
        valid_mask = pa.array(~ok)  # arrow masks mark nulls
        bbox = pa.StructArray.from_arrays(
            [pa.array(bounds[:, i], pa.float64(), mask=~ok) for i in range(4)],
            fields=list(self.schema.field(self.contract.bbox_name).type),
            mask=valid_mask,
        )
        out: dict[str, pa.Array] = dict(columns)
        out[self.contract.geometry.name] = pa.array(wkb, pa.binary())
        out[self.contract.bbox_name] = bbox
        out[HILBERT] = pa.array(keys, pa.int64(), mask=~ok)
        out[SOURCE_TOPIC] = batch.column("topic").cast(pa.string())
        out[SOURCE_PARTITION] = batch.column("partition").cast(pa.int32())
        out[SOURCE_OFFSET] = batch.column("offset").cast(pa.int64())
        out[SOURCE_TIMESTAMP] = batch.column("timestamp").cast(pa.timestamp("us", tz="UTC"))
        out[REJECT_REASON] = pa.array(rejects.reason, pa.string())
        out[REJECT_DETAIL] = pa.array(rejects.detail, pa.string())
        # The raw record is kept for rejects only (their dead letters).
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


# -- GeoJSON parsing ------------------------------------------------------------------------------
@dataclass
class _ParsedFeatures:
    types: pa.Array
    geometry_types: pa.Array
    ids: pa.Array
    properties: dict[str, pa.Array]
    errors: dict[int, tuple[Reason, str]]


class _FeatureParser:
    """Reads Feature members (type, id, properties) from a block of JSON documents.

    pyarrow's reader does a whole block at once, but refuses the whole block over one bad
    document or one id that is a number where the others are strings, naming the row it stopped
    at. The rows before it are read again as a block, the refused one alone with json.loads
    (which agrees with the reader on every document the reader takes, and says what is wrong
    with the others). Refusals close together would cost a block read each, so a run of rows
    after them is read one by one instead, a longer run while they keep coming: a batch of bad
    records costs about what json.loads costs, never a block read per record.
    """

    _BLOCK_ID_TYPES = (pa.string(), pa.int64())
    # A block read costs about as much as reading this many rows one by one.
    _MIN_BLOCK = 64
    _MAX_RUN = 4096

    def __init__(self, property_types: dict[str, pa.DataType]):
        self.property_types = property_types
        self._props = pa.struct([pa.field(k, v) for k, v in property_types.items()])

    def parse(self, flat: pa.Array) -> _ParsedFeatures:
        """Documents without raw line breaks, one per element."""
        errors: dict[int, tuple[Reason, str]] = {}
        pieces: list[pa.Table] = []
        singles: list[dict] = []  # rows read one by one since the last block

        def add_block(table: pa.Table) -> None:
            if singles:
                pieces.append(pa.Table.from_pylist(singles, schema=self._schema(pa.string())))
                singles.clear()
            pieces.append(table)

        def one_by_one(lo: int, hi: int) -> None:
            singles.extend(self._parse_one(flat, i, errors) for i in range(lo, hi))

        n = len(flat)
        lo, window, run = 0, n, 0
        while lo < n:
            hi = min(n, lo + window)
            table, refused = self._read_block(flat.slice(lo, hi - lo))
            if table is not None:
                add_block(table)
                lo, window, run = hi, 2 * window, 0
            elif refused is None:  # no row named (a value holding several documents): smaller blocks
                if hi - lo > self._MIN_BLOCK:
                    window = (hi - lo) // 2
                else:
                    one_by_one(lo, hi)
                    lo = hi
            elif refused >= self._MIN_BLOCK:
                prefix, _ = self._read_block(flat.slice(lo, refused))
                if prefix is not None:
                    add_block(prefix)
                else:
                    one_by_one(lo, lo + refused)
                one_by_one(lo + refused, lo + refused + 1)
                lo, window, run = lo + refused + 1, 2 * refused, 0
            else:
                run = min(2 * run or self._MIN_BLOCK, self._MAX_RUN)
                stop = min(n, lo + refused + 1 + run)
                one_by_one(lo, stop)
                lo, window = stop, self._MIN_BLOCK
        add_block(self._empty(0))
        table = pa.concat_tables(pieces)
        return _ParsedFeatures(
            types=table.column("type").combine_chunks(),
            geometry_types=pc.struct_field(table.column("geometry").combine_chunks(), "type"),
            ids=table.column("id").combine_chunks(),
            properties={k: table.column("properties").combine_chunks().field(k) for k in self.property_types},
            errors=errors,
        )

    def _schema(self, id_type: pa.DataType) -> pa.Schema:
        return pa.schema(
            [("type", pa.string()), ("id", id_type), ("properties", self._props), ("geometry", _GEOMETRY_MEMBER)]
        )

    def _empty(self, n: int) -> pa.Table:
        schema = self._schema(pa.string())
        return pa.Table.from_arrays([pa.nulls(n, f.type) for f in schema], schema=schema)

    def _read_block(self, block: pa.Array) -> tuple[pa.Table | None, int | None]:
        """The block as a table, or (None, the row the reader refused if it says which)."""
        data = ndjson(block)
        read_options = pa_json.ReadOptions(use_threads=False, block_size=max(data.size + 1, 1 << 20))
        bad_row = None
        for id_type in self._BLOCK_ID_TYPES:
            options = pa_json.ParseOptions(explicit_schema=self._schema(id_type), unexpected_field_behavior="ignore")
            try:
                table = pa_json.read_json(pa.BufferReader(data), parse_options=options, read_options=read_options)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                where = _ROW_IN_ERROR.search(str(exc))
                if where:
                    # Rows before the furthest refusal all read under that pass's id type.
                    bad_row = max(bad_row or 0, int(where.group(1)))
                continue
            if table.num_rows != len(block):
                # A value that holds several documents: no row to blame, so split the block.
                return None, None
            return table.cast(self._schema(pa.string())), None
        if bad_row is not None and not 0 <= bad_row < len(block):
            bad_row = None
        return None, bad_row

    def _parse_one(self, docs: pa.Array, position: int, errors: dict) -> dict:
        """One document as the block reader would read it, or an empty row with its reject in `errors`."""
        empty = {"type": None, "id": None, "properties": None, "geometry": None}
        raw = docs[position].as_py()
        doc, problem = _load_json(raw)
        if problem is not None and problem[0] is Reason.NESTING_TOO_DEEP:
            # Deeper than json.loads goes, yet the block reader may take it (a deep member no column reads).
            table, _ = self._read_block(docs.slice(position, 1))
            if table is not None:
                return table.to_pylist()[0]
        if problem is not None:
            errors[position] = problem
            return empty
        if not isinstance(doc, dict):
            errors[position] = (Reason.NOT_A_FEATURE, f"value is a JSON {type(doc).__name__}, not a Feature object")
            return empty
        if doc.get("type") != "Feature":
            errors[position] = (Reason.NOT_A_FEATURE, f"type is {_shown(doc.get('type'))}, expected 'Feature'")
            return empty
        fid = doc.get("id")
        if fid is not None and (isinstance(fid, bool) or not isinstance(fid, str | int | float)):
            errors[position] = (Reason.PROPERTY_TYPE_MISMATCH, f"id: {_shown(fid)} is neither a string nor a number")
            return empty
        if isinstance(fid, float) and not math.isfinite(fid):
            errors[position] = (Reason.PROPERTY_TYPE_MISMATCH, f"id: {fid} is not a finite number")
            return empty
        geometry = doc.get("geometry")
        if geometry is not None and not (isinstance(geometry, dict) and geometry.get("type") in GEOJSON_GEOMETRY_TYPES):
            what = (
                f"type {_shown(geometry.get('type'))}"
                if isinstance(geometry, dict)
                else f"a JSON {type(geometry).__name__}"
            )
            errors[position] = (Reason.INVALID_GEOJSON_GEOMETRY, f"geometry: {what} is not a GeoJSON geometry object")
            return empty
        props = doc.get("properties")
        if props is not None and not isinstance(props, dict):
            errors[position] = (Reason.PROPERTY_TYPE_MISMATCH, f"properties: expected an object, got {_shown(props)}")
            return empty
        values = {}
        for name, arrow_type in self.property_types.items():
            value = (props or {}).get(name)
            try:
                values[name] = _coerce_property(value, arrow_type)
            except (TypeError, ValueError, OverflowError, pa.ArrowInvalid):
                errors[position] = (
                    Reason.PROPERTY_TYPE_MISMATCH,
                    f"properties.{name}: {_shown(value)} is not a {arrow_type}",
                )
                return empty
        if isinstance(fid, int):
            fid = str(fid)
        elif isinstance(fid, float):
            fid = str(int(fid)) if fid.is_integer() else repr(fid)
        if not all(_is_unicode(v) for v in (fid, *values.values())):
            errors[position] = (
                Reason.MALFORMED_JSON,
                "value holds a string that is not valid Unicode (an escaped lone surrogate)",
            )
            return empty
        return {
            "type": "Feature",
            "id": fid,
            "properties": values,
            "geometry": None if geometry is None else {"type": geometry["type"]},
        }


def _shown(value: Any) -> str:
    """A value of the input as a reject detail names it: short, whatever its size or depth."""
    return _SHORT_REPR.repr(value)


def _is_unicode(value: Any) -> bool:
    """Whether a value, if a string, can be stored (a JSON escape can make a lone surrogate)."""
    if not isinstance(value, str):
        return True
    try:
        value.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _coerce_property(value: Any, arrow_type: pa.DataType) -> Any:
    """The same conversions pyarrow's JSON reader makes, for one value."""
    if value is None:
        return None
    if pa.types.is_string(arrow_type):
        if not isinstance(value, str):
            raise TypeError
        return value
    if pa.types.is_boolean(arrow_type):
        if not isinstance(value, bool):
            raise TypeError
        return value
    if pa.types.is_integer(arrow_type):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError
        pa.scalar(value, arrow_type)  # range check
        return value
    if pa.types.is_floating(arrow_type):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        if not math.isfinite(float(value)):
            raise ValueError("out of the double range")
        return float(value)
    if pa.types.is_timestamp(arrow_type):
        if not isinstance(value, str):
            raise TypeError
        # pyarrow's reader takes other spellings than datetime.fromisoformat and casts: ask it.
        line = pa.py_buffer(json.dumps({"v": value}).encode() + b"\n")
        read = pa_json.read_json(
            pa.BufferReader(line),
            parse_options=pa_json.ParseOptions(explicit_schema=pa.schema([("v", arrow_type)])),
            read_options=pa_json.ReadOptions(use_threads=False),
        )
        return read.column("v")[0].as_py()
    raise TypeError


# A geometry GEOS read after all, or why there is none.
_Diagnosis = tuple[shapely.Geometry, None, None] | tuple[None, Reason, str]


def _diagnose_geojson_geometry(raw: bytes, property_types: dict[str, pa.DataType]) -> _Diagnosis:
    """Why GEOS refused a Feature; or its geometry, when the refusal was about something else."""
    doc, problem = _load_json(raw)
    if problem is not None:
        return None, *problem
    if not isinstance(doc, dict):
        return None, Reason.NOT_A_FEATURE, f"value is a JSON {type(doc).__name__}, not a Feature object"
    try:
        return _diagnose_feature(doc, property_types)
    except RecursionError:
        return None, Reason.NESTING_TOO_DEEP, "geometry: nested too deeply to read"


def _diagnose_feature(doc: dict, property_types: dict[str, pa.DataType]) -> _Diagnosis:
    if "geometry" not in doc or doc["geometry"] is None:
        return None, Reason.MISSING_GEOMETRY, "geometry: missing or null"
    properties = doc.get("properties")
    if not isinstance(properties, dict):
        properties = {}
    for name in property_types:
        value = properties.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            return None, Reason.PROPERTY_TYPE_MISMATCH, f"properties.{name}: a number out of the double range"
    geometry = doc["geometry"]
    if isinstance(geometry, dict):
        coords = geometry.get("coordinates")
        if coords == [] or (geometry.get("type") == "GeometryCollection" and not geometry.get("geometries")):
            return None, Reason.EMPTY_GEOMETRY, "geometry: has no coordinates"
        if _has_non_finite(coords):
            return None, Reason.NON_FINITE_COORDINATES, "geometry.coordinates: a coordinate is not a finite number"
        depth = _position_size(coords)
        if depth is not None and depth > 3:
            return (
                None,
                Reason.DIMENSION_NOT_ALLOWED,
                f"geometry.coordinates: positions of {depth} values; GeoJSON allows 2 or 3",
            )
    text = json.dumps(geometry)
    with np.errstate(all="ignore"):
        alone = shapely.from_geojson(text, on_invalid="ignore")
    if alone is not None:
        return alone, None, None
    return None, Reason.INVALID_GEOJSON_GEOMETRY, f"geometry: not a readable GeoJSON geometry: {text[:200]}"


def _load_json(raw: bytes) -> tuple[Any, tuple[Reason, str] | None]:
    """The document, or why it cannot be read: whatever the bytes, this does not raise.

    The bytes are decoded as UTF-8 first (json.loads would take UTF-16 and UTF-32 bytes too), and
    integers too long for int() (over 4300 digits) become floats, infinite ones, as pyarrow's reader
    makes of them."""
    try:
        return json.loads(raw.decode("utf-8"), parse_int=_json_int), None
    except RecursionError:
        return None, (Reason.NESTING_TOO_DEEP, "value nests arrays or objects too deeply to read")
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        return None, (Reason.MALFORMED_JSON, f"value is not valid JSON: {str(exc)[:200]}")


def _json_int(digits: str) -> int | float:
    return int(digits) if len(digits) <= 4000 else float(digits)


def _geojson_nesting_problem(raw: bytes, max_nesting: int) -> tuple[Reason, str] | None:
    """Whether the geometry member nests objects deeper than max_nesting (walked without recursion)."""
    doc, problem = _load_json(raw)
    if problem is not None:
        return problem
    if not isinstance(doc, dict):
        return None
    stack = [(doc.get("geometry"), 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict):
            continue
        if depth > max_nesting:
            return (
                Reason.NESTING_TOO_DEEP,
                f"geometry: objects nested more than max_nesting={max_nesting} levels deep",
            )
        children = node.get("geometries")
        stack.extend((child, depth + 1) for child in (children if isinstance(children, list) else ()))
        stack.append((node.get("geometry"), depth + 1))
    return None


def _has_non_finite(coords: Any) -> bool:
    if isinstance(coords, list):
        return any(_has_non_finite(c) for c in coords)
    if isinstance(coords, float):
        return not math.isfinite(coords)
    return False


def _position_size(coords: Any) -> int | None:
    while isinstance(coords, list) and coords and isinstance(coords[0], list):
        coords = coords[0]
    return len(coords) if isinstance(coords, list) else None


# -- WKB structure -------------------------------------------------------------------------------
def _wkb_header_codes(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The geometry type word of each value (ISO code and EWKB flags; 0 where there is none), and
    whether the value is little-endian."""
    n = len(values)
    offsets, data = _offsets_and_bytes(values)
    starts = offsets[:-1]
    has_header = (
        (np.diff(offsets) >= 5) & np.isin(data[np.minimum(starts, max(data.size - 1, 0))], (0, 1))
        if data.size
        else np.zeros(n, dtype=bool)
    )
    codes = np.zeros(n, dtype=np.int64)
    at = starts[has_header]
    word = (
        np.stack([data[at + 1 + i] for i in range(4)], axis=1).astype(np.int64)
        if at.size
        else np.zeros((0, 4), np.int64)
    )
    little = np.zeros(n, dtype=bool)
    little[has_header] = data[at] == 1
    weights = np.array([1, 1 << 8, 1 << 16, 1 << 24], dtype=np.int64)
    codes[has_header] = np.where(little[has_header], word @ weights, word @ weights[::-1])
    return codes, little


def _bounds(geoms: np.ndarray, points_xy: np.ndarray) -> np.ndarray:
    """xmin, ymin, xmax, ymax of each geometry, or of each plain point (NaN where neither)."""
    bounds = shapely.bounds(geoms)
    plain = ~np.isnan(points_xy[:, 0])
    bounds[plain] = np.tile(points_xy[plain], 2)
    return bounds


def _plain_polygons(lengths: np.ndarray, codes: np.ndarray, little: np.ndarray, geoms: np.ndarray) -> np.ndarray:
    """Which values (of these byte lengths) GEOS read as a polygon are byte for byte what GEOS
    writes of it: little-endian 2D ISO WKB (type word 3), exactly as long as the rings and points
    GEOS read (so nothing follows them). GEOS reads and writes each double bit for bit; only a
    NaN's bits may differ, and a polygon with one is rejected. Writing each polygon back to
    compare cost 0.9 us an event."""
    # (an empty polygon has no ring at all: left to the comparison)
    polygon = little & (codes == 3) & (shapely.get_type_id(geoms) == 3) & ~shapely.is_empty(geoms)
    rings = shapely.get_num_interior_rings(geoms[polygon]) + 1
    points = shapely.get_num_coordinates(geoms[polygon])
    exact = np.zeros(len(lengths), dtype=bool)
    exact[polygon] = lengths[polygon] == 9 + 4 * rings + 16 * points
    return exact


def _plain_points(values: pa.Array, codes: np.ndarray, little: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which values are a 2D point in little-endian ISO WKB with finite coordinates (exactly 21
    bytes), and their coordinates. Most point events are spelt so; their coordinates are read
    straight from the bytes, as GEOS would read them, the value is stored as sent, and no
    geometry object is made (the checks and bounds of such a point need only its x and y):
    shapely.from_wkb and writing the point back cost 1.2 us an event, making the object alone 0.4. NaN and infinite
    coordinates (an empty point is spelt with NaN) are left to GEOS."""
    n = len(values)
    offsets, data = _offsets_and_bytes(values)
    candidates = np.flatnonzero((np.diff(offsets) == 21) & little & (codes == 1))
    plain = np.zeros(n, dtype=bool)
    if candidates.size == 0:
        return plain, np.zeros((0, 2))
    # the 16 bytes after each candidate's 5-byte header, as two little-endian doubles
    at = offsets[candidates][:, None] + 5 + np.arange(16)
    xy = data[at].view("<f8").reshape(-1, 2)
    finite = np.isfinite(xy).all(axis=1)
    plain[candidates[finite]] = True
    return plain, xy[finite]


def _written_back_exactly(
    sent: pa.Array, written: np.ndarray, geoms: np.ndarray, codes: np.ndarray, little: np.ndarray
) -> np.ndarray:
    """Whether each value is byte for byte what GEOS writes of its geometry in the value's own byte
    order and flavour. `written` is the stored form (ISO, little-endian), which most values are."""
    exact = np.zeros(len(sent), dtype=bool)
    extended = (codes & _EWKB_FLAGS) != 0
    with_srid = (codes & _EWKB_SRID_FLAG) != 0
    for is_little in (True, False):
        for is_extended in (False, True):
            for has_srid in (False, True) if is_extended else (False,):
                group = np.flatnonzero((little == is_little) & (extended == is_extended) & (with_srid == has_srid))
                if group.size == 0:
                    continue
                if is_little and not is_extended:
                    expected = written[group]
                else:
                    expected = shapely.to_wkb(
                        geoms[group],
                        output_dimension=4,
                        byte_order=int(is_little),
                        flavor="extended" if is_extended else "iso",
                        include_srid=has_srid,
                    )
                exact[group] = pc.fill_null(
                    pc.equal(sent.take(pa.array(group)), pa.array(expected, pa.binary())), False
                ).to_numpy(zero_copy_only=False)
    return exact


def _type_names(type_ids: np.ndarray) -> np.ndarray:
    """GeoJSON type name of each shapely type id ("Unknown" for none or a type GeoJSON lacks)."""
    known = (type_ids >= 0) & (type_ids < len(_TYPE_NAMES))
    return _TYPE_NAME_BY_ID[np.where(known, type_ids, len(_TYPE_NAMES))]


def _read_wkb(blobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Geometries of WKB values (None where GEOS cannot read one) and which values are curves.

    GEOS reads curves (CircularString ... MultiSurface, also nested in a collection) but shapely
    cannot hold them, and raises for the whole array: then each value is read alone."""
    curved = np.zeros(len(blobs), dtype=bool)
    with np.errstate(all="ignore"):  # a value GEOS refuses is reported as bad_wkb, not warned of
        try:
            return shapely.from_wkb(blobs, on_invalid="ignore"), curved
        except NotImplementedError:
            pass
        geoms = np.full(len(blobs), None, dtype=object)
        for i, blob in enumerate(blobs):
            try:
                geoms[i] = shapely.from_wkb(blob, on_invalid="ignore")
            except NotImplementedError:
                curved[i] = True
    return geoms, curved


def _wkb_base_type(code):
    """The geometry type GEOS reads from a WKB type word, whatever the flavour: ISO (1000s for Z, M,
    ZM) and EWKB (high flag bits) alike, and bits GEOS ignores ignored too. The nesting check must
    see the structure exactly as GEOS will walk it."""
    return (code & 0xFFFF) % 1000


def _to_wkb(geoms: np.ndarray) -> np.ndarray:
    """The stored form: ISO WKB with every dimension the geometry has, no SRID (the table's CRS)."""
    if geoms.size == 0:
        return np.zeros(0, dtype=object)
    return shapely.to_wkb(geoms, output_dimension=4, flavor="iso", include_srid=False)


def _walk_wkb(blob: bytes, max_depth: int) -> tuple[int, str | None, bool]:
    """Walks a WKB value as GEOS reads it, without recursion. Returns how deep geometries nest
    (the walk stops once deeper than max_depth), the first way the value departs from exactly one
    well-formed WKB geometry (or None), and whether it holds a curve. GEOS itself overlooks some
    departures (type bits WKB does not define, a byte order byte other than 0 or 1, an SRID on a
    part, bytes after the geometry), so the walk goes on past them as GEOS would: the depth is
    what GEOS will recurse to."""
    pos, depth, deepest = 0, 0, 0
    curve = False
    order = "<"
    problem: str | None = None
    whole_dims: tuple[bool, bool] | None = None
    remaining = [1]  # geometries still to read at each open level
    try:
        while remaining:
            if remaining[-1] == 0:
                remaining.pop()
                depth -= 1
                continue
            remaining[-1] -= 1
            start = pos
            if blob[pos] in (0, 1):
                order = "<" if blob[pos] == 1 else ">"
            elif problem is None:  # GEOS keeps the byte order it had
                problem = f"byte {pos}: byte order {blob[pos]} is neither 0 nor 1"
            (code,) = struct.unpack_from(order + "I", blob, pos + 1)
            pos += 5 + (4 if code & _EWKB_SRID_FLAG else 0)
            base = _wkb_base_type(code)
            iso_range = (code & 0xFFFF) // 1000
            has_z = iso_range in (1, 3) or bool(code & _EWKB_Z_FLAG)
            has_m = iso_range in (2, 3) or bool(code & _EWKB_M_FLAG)
            dims = 2 + has_z + has_m
            if problem is None:
                problem = _type_word_problem(code, start)
            curve = curve or base in _WKB_CURVE_TYPES
            if whole_dims is None:
                whole_dims = (has_z, has_m)
            elif problem is None and (has_z, has_m) != whole_dims:
                problem = f"byte {start}: a part has other dimensions than the geometry it belongs to"
            if base == 1:
                pos += 8 * dims
            elif base in (2, 8):
                (count,) = struct.unpack_from(order + "I", blob, pos)
                pos += 4 + 8 * dims * count
            elif base in (3, 17):
                (rings,) = struct.unpack_from(order + "I", blob, pos)
                pos += 4
                for _ in range(rings):
                    (count,) = struct.unpack_from(order + "I", blob, pos)
                    pos += 4 + 8 * dims * count
            elif base in _WKB_CONTAINER_TYPES:
                (count,) = struct.unpack_from(order + "I", blob, pos)
                pos += 4
                depth += 1
                deepest = max(deepest, depth)
                if deepest > max_depth:
                    return deepest, problem, curve
                remaining.append(count)
            else:
                return deepest, problem or f"byte {start}: type word 0x{code:08x} names no geometry type", curve
    except (IndexError, struct.error):
        return deepest, problem or f"value ends inside its geometry ({len(blob)} bytes)", curve
    if pos > len(blob):
        return deepest, problem or f"value ends inside its geometry ({len(blob)} bytes, {pos} claimed)", curve
    if problem is None and pos < len(blob):
        problem = f"value has {len(blob) - pos} bytes after its {pos}-byte geometry"
    return deepest, problem, curve


def _unreadable_wkb(blob: bytes, problem: str | None) -> str:
    return f"value is not readable WKB ({len(blob)} bytes, starting {blob[:9].hex()})" + (
        f": {problem}" if problem else ""
    )


def _type_word_problem(code: int, at: int) -> str | None:
    """Why a type word is neither ISO WKB (type + 1000 x Z/M/ZM) nor EWKB (type | Z, M, SRID flags),
    or None. Only the first geometry of a value may carry an SRID."""
    flags, rest = code & _EWKB_FLAGS, code & ~_EWKB_FLAGS
    if flags:
        if not 1 <= rest <= 17:
            return f"byte {at}: type word 0x{code:08x} mixes EWKB flags with a type that is not EWKB"
        if code & _EWKB_SRID_FLAG and at != 0:
            return f"byte {at}: a part of a geometry carries an SRID"
        return None
    if rest >= 4000 or not 1 <= rest % 1000 <= 17:
        return f"byte {at}: type word 0x{code:08x} is neither an ISO nor an EWKB geometry type"
    return None


# -- Arrow helpers -------------------------------------------------------------------------------
def _offsets_and_bytes(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary array's n + 1 value offsets and its data bytes, as numpy views (no copy)."""
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset : values.offset + len(values) + 1]
    data_buffer = values.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return offsets, data


def _first_significant_byte(values: pa.Array, live: np.ndarray) -> np.ndarray:
    """First byte of each value after leading JSON whitespace; -1 where there is none."""
    values = values.cast(pa.binary())
    n = len(values)
    offsets, data = _offsets_and_bytes(values)
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


def _still_ok(rows: np.ndarray, docs: pa.Array, rejects: _Rejects) -> tuple[np.ndarray, pa.Array]:
    """The rows (and their documents) that have no reject reason yet."""
    keep = rejects.ok[rows]
    if keep.all():
        return rows, docs
    return rows[keep], docs.filter(pa.array(keep))


# From the start of a document: text outside strings or whole strings, then a string that holds a
# raw CR or LF before it closes (an escaped one, backslash and letter, is fine).
_LINE_BREAK_IN_STRING = r'(?s)^(?:[^"]|"(?:[^"\\]|\\.)*")*"(?:[^"\\\r\n]|\\.)*[\r\n]'


def _raw_control_characters(docs: pa.Array) -> list[tuple[int, str]]:
    """Documents with a raw line break inside a string, which JSON forbids. The block readers see
    line breaks replaced by spaces, so they would take the string with a space in it: these are
    found first, with RE2 over the documents that have a line break at all (few do)."""
    breaks = np.flatnonzero(pc.match_substring_regex(docs, "[\r\n]").to_numpy(zero_copy_only=False))
    if breaks.size == 0:
        return []
    inside = pc.match_substring_regex(docs.take(pa.array(breaks)), _LINE_BREAK_IN_STRING).to_numpy(zero_copy_only=False)
    return [
        (int(local), "value has a raw line break inside a JSON string (JSON escapes it as \\n or \\r)")
        for local in breaks[inside]
    ]


def _invalid_utf8(values: pa.Array) -> np.ndarray:
    """Rows that are not valid UTF-8 (checked as a whole first; row by row only if it fails)."""
    try:
        values.cast(pa.string()).validate(full=True)
        return np.zeros(len(values), dtype=bool)
    except pa.ArrowInvalid:
        return np.array([not _is_utf8(v) for v in values.to_pylist()], dtype=bool)


def _is_utf8(value: bytes | None) -> bool:
    if value is None:
        return False
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _scatter(partial: pa.Array, rows: np.ndarray, n: int) -> pa.Array:
    """A length-n array holding partial[i] at rows[i] and null elsewhere."""
    positions = np.full(n, len(partial), dtype=np.int64)
    positions[rows] = np.arange(len(rows))
    padded = pa.concat_arrays([partial, pa.nulls(1, partial.type)])
    return padded.take(pa.array(positions))


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
    return _scatter_into(empty, decoded, rows)


def _scatter_into(base: pa.Array, partial: pa.Array, rows: np.ndarray) -> pa.Array:
    """`base` with partial[i] at rows[i]."""
    positions = np.arange(len(base), dtype=np.int64)
    positions[rows] = len(base) + np.arange(len(rows))
    return pa.concat_arrays([base, partial.cast(base.type)]).take(pa.array(positions))


def _header_values(batch: pa.RecordBatch, name: str) -> pa.Array:
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


def _cast_or_reject(raw: pa.Array, target: pa.DataType, label: str, rejects: _Rejects) -> pa.Array:
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


def _cast_each(values: list, target: pa.DataType, label: str, rejects: _Rejects, convert) -> pa.Array:
    out: list[object] = []
    for i, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        try:
            out.append(convert(value))
        except (ValueError, TypeError, UnicodeDecodeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            rejects.add(np.array([i]), Reason.PROPERTY_TYPE_MISMATCH, f"{label}: {_shown(value)} is not a {target}")
            out.append(None)
    return pa.array(out, target)
