"""Plain JSON events with the geometry in fields (contract format "json").

`{"vehicle": "v1", "position": {"lon": 2.35, "lat": 48.85}, "ts": "..."}`: the contract's `json`
section names where the geometry is, a lon / lat (/ z) triple of number fields or one field
holding WKT, a GeoJSON geometry, hex or base64 WKB; columns read other fields as `json.<path>`
(the column mapping, streaming/decode/columns.py, takes them from `Decoded.fields`).

A block of documents is read at once by pyarrow's JSON reader, with the fields the contract
reads, each at its path and with its type, as the explicit schema; numbers are parsed to the
nearest double, so coordinates come back exactly as sent. The reader refuses a whole block over
one document whose field has another JSON type (a coordinate sent as a string); only then is the
block split, and the refused documents read one by one (json.loads) so that each reject names
its field. Coordinates are checked over the whole batch with numpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import shapely

from streaming.contract import Contract, JsonFields
from streaming.decode.columns import json_field_types
from streaming.decode.crs import valid_area
from streaming.decode.formats.base import Decoded, InputFormat
from streaming.decode.formats.geojson import (
    GEOMETRY_MEMBER,
    _geojson_nesting_problem,
    _invalid_utf8,
    _load_json,
    _raw_control_characters,
    _still_ok,
    store_read,
)
from streaming.decode.formats.geojson_geometry import ndjson, read_geometries
from streaming.decode.formats.json_blocks import ROW_IN_ERROR, one_per_line, read_in_blocks
from streaming.decode.formats.wkb import EWKB_SRID_FLAG, read_wkb
from streaming.decode.formats.wkt import read_wkt, store_points
from streaming.decode.json_values import (
    ValueProblem,
    coerce,
    convert,
    has_map,
    holds_decimal,
    needs_conversion,
    read_type,
)
from streaming.decode.rejects import Reason, Rejects, shown
from streaming.kernels.buffers import scatter
from streaming.kernels.text_encodings import base64_decode, hex_decode


class JsonFieldsFormat(InputFormat):
    names: ClassVar[tuple[str, ...]] = ("json",)
    first_bytes: ClassVar[tuple[int, ...]] = (ord("{"),)
    described: ClassVar[str] = "a JSON object"
    first_bytes_shown: ClassVar[tuple[str, ...]] = ("'{'",)
    refused_first_bytes: ClassVar[dict[int, tuple[Reason, str]]] = {
        ord("["): (Reason.NOT_A_JSON_OBJECT, "a JSON array is not a JSON event (an object)")
    }

    @classmethod
    def active(cls, contract: Contract) -> bool:
        return "json" in contract.formats

    def __init__(self, contract: Contract, max_nesting: int, property_types: dict[str, pa.DataType]):
        super().__init__(contract, max_nesting, property_types)
        assert contract.json is not None  # the contract requires the section with the format
        self.spec: JsonFields = contract.json
        self.columns = json_field_types(contract)
        # What the reader reads: the geometry's fields first (their rejects come first), then the columns'.
        leaves: dict[str, pa.DataType] = {p: pa.float64() for p in self.spec.coordinate_paths}
        if self.spec.geometry_path is not None:
            geojson = self.spec.geometry_encoding == "geojson"
            leaves[self.spec.geometry_path] = GEOMETRY_MEMBER if geojson else pa.string()
        leaves.update(self.columns)
        self.leaves = leaves
        self.parser = _BlockParser(leaves, self._kind_of)

    def _kind_of(self, path: str) -> str:
        if path in self.spec.coordinate_paths:
            return "coordinate"
        if path == self.spec.geometry_path:
            return "geojson" if self.spec.geometry_encoding == "geojson" else "text"
        return "column"

    def decode(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        n = len(values)
        rejects = out.rejects
        docs = values.take(pa.array(rows))
        not_utf8 = _invalid_utf8(docs)
        rejects.add(rows[not_utf8], Reason.MALFORMED_JSON, "value is not valid UTF-8 JSON")
        rows, docs = _still_ok(rows, docs, rejects)
        for local, detail in _raw_control_characters(docs):
            rejects.add(rows[[local]], Reason.MALFORMED_JSON, detail)
        rows, docs = _still_ok(rows, docs, rejects)
        if rows.size == 0:
            return
        flat = one_per_line(docs)
        table, errors = self.parser.parse(flat)
        for local, (reason, detail) in errors.items():
            rejects.add(rows[[local]], reason, detail)
        read = {path: _leaf(table, path) for path in self.leaves}
        for path, kind in self.columns.items():
            if needs_conversion(kind):
                read[path], problems = convert(read[path], kind, f"json.{path}", rows)
                for row, detail in problems:
                    rejects.add(np.array([row]), Reason.PROPERTY_TYPE_MISMATCH, detail)
        out.fields = {path: scatter(read[path], rows, n) for path in self.columns}
        if self.spec.geometry_path is None:
            self._points(read, rows, out)
        else:
            self._geometry_field(read[self.spec.geometry_path], flat, rows, out)

    # -- lon / lat (/ z) ----------------------------------------------------------------------------
    def _points(self, read: dict[str, pa.Array], rows: np.ndarray, out: Decoded) -> None:
        spec, rejects = self.spec, out.rejects
        assert spec.lon is not None and spec.lat is not None
        live = rejects.ok[rows]
        for path in (spec.lon, spec.lat):
            missing = live & pc.is_null(read[path]).to_numpy(zero_copy_only=False)
            rejects.add(rows[missing], Reason.MISSING_COORDINATES, f"{path}: missing or null")
            live &= ~missing
        lon = read[spec.lon].to_numpy(zero_copy_only=False)
        lat = read[spec.lat].to_numpy(zero_copy_only=False)
        z = read[spec.z].to_numpy(zero_copy_only=False) if spec.z is not None else np.full(rows.size, np.nan)
        has_z = (
            pc.is_valid(read[spec.z]).to_numpy(zero_copy_only=False)
            if spec.z is not None
            else np.zeros(rows.size, dtype=bool)
        )
        with np.errstate(invalid="ignore"):
            odd = live & ~(np.isfinite(lon) & np.isfinite(lat) & (np.isfinite(z) | ~has_z))
        rejects.add(
            rows[odd],
            Reason.NON_FINITE_COORDINATES,
            [
                f"{', '.join(spec.coordinate_paths)}: {', '.join(str(v) for v in values)}: "
                "a coordinate is not a finite number"
                for values in zip(lon[odd], lat[odd], *([z[odd]] if spec.z is not None else []))
            ],
        )
        live &= ~odd
        self._check_ranges(lon, lat, rows, live, rejects)
        live &= rejects.ok[rows]
        flat2d = live & ~has_z
        xy = np.column_stack([lon, lat])
        store_points(out, rows[flat2d], xy[flat2d], np.full(int(flat2d.sum()), spec.epsg), self.contract.geometry.epsg)
        with_z = live & has_z
        if with_z.any():
            out.geoms[rows[with_z]] = shapely.points(lon[with_z], lat[with_z], z[with_z])
            out.srids[rows[with_z]] = spec.epsg

    def _check_ranges(
        self, lon: np.ndarray, lat: np.ndarray, rows: np.ndarray, live: np.ndarray, rejects: Rejects
    ) -> None:
        """Axes swapped (the point lies outside the CRS's area of use, and inside it the other way
        round), then latitudes and longitudes out of range."""
        spec = self.spec
        assert spec.lon is not None and spec.lat is not None
        west, south, east, north = valid_area(spec.epsg)
        if west > east:  # an area across the antimeridian: any longitude may be in it
            west, east = -180.0, 180.0

        def inside(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return (x >= west) & (x <= east) & (y >= south) & (y <= north)

        swapped = live & ~inside(lon, lat) & inside(lat, lon)
        rejects.add(
            rows[swapped],
            Reason.SWAPPED_AXES,
            [
                f"{spec.lon}, {spec.lat}: ({x:.9g}, {y:.9g}) lies outside the area of EPSG:{spec.epsg} "
                f"({west:.6g}, {south:.6g}, {east:.6g}, {north:.6g}) and ({y:.9g}, {x:.9g}) inside it: "
                "longitude and latitude look swapped"
                for x, y in zip(lon[swapped], lat[swapped])
            ],
        )
        bad_lat = live & (np.abs(lat) > 90)
        rejects.add(
            rows[bad_lat],
            Reason.LATITUDE_OUT_OF_RANGE,
            [f"{spec.lat}: {float(y)!r} is not within -90..90" for y in lat[bad_lat]],
        )
        bad_lon = live & (np.abs(lon) > 180)
        rejects.add(
            rows[bad_lon],
            Reason.LONGITUDE_OUT_OF_RANGE,
            [f"{spec.lon}: {float(x)!r} is not within -180..180" for x in lon[bad_lon]],
        )

    # -- one field holding the geometry ---------------------------------------------------------------
    def _geometry_field(self, field: pa.Array, flat: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        spec, rejects = self.spec, out.rejects
        path = spec.geometry_path
        where = f"json.{path}"
        missing = rejects.ok[rows] & pc.is_null(field).to_numpy(zero_copy_only=False)
        rejects.add(rows[missing], Reason.MISSING_GEOMETRY, f"{path}: missing or null")
        live = rejects.ok[rows]
        rows, field, flat = rows[live], field.filter(pa.array(live)), flat.filter(pa.array(live))
        if rows.size == 0:
            return
        if spec.geometry_encoding == "wkt":
            read_wkt(field, rows, out, self.contract, self.max_nesting, spec.epsg, where)
            return
        if spec.geometry_encoding == "geojson":
            self._geojson(field, flat, rows, out)
            return
        decode = hex_decode if spec.geometry_encoding == "wkb_hex" else base64_decode
        blobs, ok = decode(field)
        what = "hexadecimal" if spec.geometry_encoding == "wkb_hex" else "base64"
        rejects.add(
            rows[~ok],
            Reason.BAD_GEOMETRY_ENCODING,
            [f"{path}: {shown(v)} is not {what} text" for v in field.filter(pa.array(~ok)).to_pylist()],
        )
        rows, blobs = rows[ok], blobs.filter(pa.array(ok))
        read_rows, codes, geoms = read_wkb(blobs, rows, out, self.contract, self.max_nesting, where)
        has_srid = (codes & EWKB_SRID_FLAG) != 0
        out.srids[read_rows] = np.where(has_srid, shapely.get_srid(geoms), spec.epsg)
        if spec.epsg != self.contract.geometry.epsg:
            # Plain WKB points are read as if in the table CRS: these are in the events' CRS.
            plain = read_rows[~np.isnan(out.points_xy[read_rows, 0]) & ~has_srid]
            out.geoms[plain] = shapely.points(out.points_xy[plain])
            out.points_xy[plain] = np.nan
            out.wkb[plain] = None

    def _geojson(self, field: pa.Array, flat: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        """GeoJSON geometry objects at the path: plainly well-formed ones from the block reader,
        the rest by GEOS, one by one."""
        spec, rejects = self.spec, out.rejects
        assert spec.geometry_path is not None
        member = tuple(spec.geometry_path.split("."))
        types = pc.struct_field(field, "type").to_numpy(zero_copy_only=False)
        fast = read_geometries(flat, types, member)
        store_read(out, rows, fast, spec.epsg, self.contract.geometry.epsg)
        for local in np.flatnonzero(~fast.read):
            doc, _ = _load_json(flat[int(local)].as_py())
            value = _at_path(doc, spec.geometry_path)
            geometry = None
            if isinstance(value, dict):
                too_deep = _geojson_nesting_problem(json.dumps({"geometry": value}).encode(), self.max_nesting)
                if too_deep is not None:
                    rejects.add(rows[[local]], too_deep[0], f"{spec.geometry_path}: {too_deep[1]}")
                    continue
                with np.errstate(all="ignore"):
                    geometry = shapely.from_geojson(json.dumps(value), on_invalid="ignore")
            if geometry is None or shapely.get_type_id(geometry) not in range(8):
                rejects.add(
                    rows[[local]],
                    Reason.INVALID_GEOJSON_GEOMETRY,
                    f"{spec.geometry_path}: not a readable GeoJSON geometry: {shown(value)}",
                )
                continue
            out.geoms[rows[local]] = geometry
        out.srids[rows] = spec.epsg


def _leaf(table: pa.Table, path: str) -> pa.Array:
    """The values at a dotted path (null where a member on the way is missing or null)."""
    first, *rest = path.split(".")
    values = table.column(first).combine_chunks()
    for name in rest:
        values = pc.struct_field(values, name)
    return values


def _at_path(doc: Any, path: str) -> Any:
    for name in path.split("."):
        if not isinstance(doc, dict):
            return None
        doc = doc.get(name)
    return doc


def _schema(leaves: dict[str, pa.DataType]) -> pa.Schema:
    """The nested schema that holds each leaf at its dotted path."""
    tree: dict[str, Any] = {}
    for path, leaf_type in leaves.items():
        node = tree
        *parents, name = path.split(".")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = leaf_type

    def typed(node: Any) -> pa.DataType:
        if isinstance(node, dict):
            return pa.struct([pa.field(k, typed(v)) for k, v in node.items()])
        return node

    return pa.schema([pa.field(k, typed(v)) for k, v in tree.items()])


# -- block reading -------------------------------------------------------------------------------
# The kind of a double leaf that also takes NaN and the infinities as Kafka Connect's JSON converter
# writes them: as strings (Jackson quotes non-finite numbers), which pyarrow's reader refuses for a
# double, so only the rows holding one are read one by one.
QUOTED_NON_FINITE = "quoted_non_finite"
_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


@dataclass
class _BlockParser:
    """Reads the leaves from a block of JSON documents (one per element, no raw line breaks).

    pyarrow's reader refuses a whole block over one document (a field of another JSON type), naming
    the row it stopped at: the rows before it are read again as a block, the refused one alone
    with json.loads, which says what is wrong with it. Refusals close together would cost a block
    read each, so a run of rows after one is read one by one, a longer run while they keep coming."""

    leaves: dict[str, pa.DataType]
    kind_of: Any

    _MIN_BLOCK = 64
    _MAX_RUN = 4096

    def __post_init__(self) -> None:
        self.schema = _schema({path: read_type(kind) for path, kind in self.leaves.items()})
        # A map is an object of any members, which the block reader cannot read as one.
        self.one_by_one_only = any(has_map(kind) for kind in self.leaves.values())
        self.exact_fractions = any(holds_decimal(kind) for kind in self.leaves.values())

    def parse(self, flat: pa.Array) -> tuple[pa.Table, dict[int, tuple[Reason, str]]]:
        errors: dict[int, tuple[Reason, str]] = {}
        pieces: list[pa.Table] = []
        singles: list[dict] = []

        def add_block(table: pa.Table) -> None:
            if singles:
                pieces.append(pa.Table.from_pylist(singles, schema=self.schema))
                singles.clear()
            pieces.append(table)

        def one_by_one(lo: int, hi: int) -> None:
            singles.extend(self._parse_one(flat, i, errors) for i in range(lo, hi))

        read_in_blocks(
            len(flat),
            lambda lo, hi: self._read_block(flat.slice(lo, hi - lo)),
            add_block,
            one_by_one,
            self._MIN_BLOCK,
            self._MAX_RUN,
            readable=not self.one_by_one_only,
        )
        add_block(pa.Table.from_pylist([], schema=self.schema))
        return pa.concat_tables(pieces), errors

    def _read_block(self, block: pa.Array) -> tuple[pa.Table | None, int | None]:
        data = ndjson(block)
        try:
            table = pa_json.read_json(
                pa.BufferReader(data),
                parse_options=pa_json.ParseOptions(explicit_schema=self.schema, unexpected_field_behavior="ignore"),
                read_options=pa_json.ReadOptions(use_threads=False, block_size=max(data.size + 1, 1 << 20)),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            where = ROW_IN_ERROR.search(str(exc))
            row = int(where.group(1)) if where else None
            return None, row if row is not None and 0 <= row < len(block) else None
        if table.num_rows != len(block):  # a value holding several documents
            return None, None
        return table, None

    def _parse_one(self, docs: pa.Array, position: int, errors: dict) -> dict:
        """One document as the block reader would read it, or an empty row with its reject in `errors`."""
        doc, problem = _load_json(docs[position].as_py(), self.exact_fractions)
        if problem is not None and problem[0] is Reason.NESTING_TOO_DEEP:
            table, _ = self._read_block(docs.slice(position, 1))
            if table is not None:
                return table.to_pylist()[0]
        if problem is not None:
            errors[position] = problem
            return {}
        if not isinstance(doc, dict):
            errors[position] = (Reason.NOT_A_JSON_OBJECT, f"value is a JSON {type(doc).__name__}, not an object")
            return {}
        row: dict[str, Any] = {}
        for path, leaf_type in self.leaves.items():
            value, trouble = self._leaf_value(doc, path, leaf_type)
            if trouble is not None:
                errors[position] = trouble
                return {}
            if value is None:
                continue
            node = row
            *parents, name = path.split(".")
            for parent in parents:
                node = node.setdefault(parent, {})
            node[name] = value
        return row

    def _leaf_value(self, doc: dict, path: str, leaf_type: pa.DataType) -> tuple[Any, tuple[Reason, str] | None]:
        kind = self.kind_of(path)
        names = path.split(".")
        node: Any = doc
        for depth, name in enumerate(names):
            if node is None:
                return None, None
            if not isinstance(node, dict):
                on_the_way = ".".join(names[:depth])
                return None, (_type_reason(kind), f"{on_the_way}: {shown(node)} is not an object, so has no {path}")
            node = node.get(name)
        if node is None:
            return None, None
        if kind == "coordinate":
            if isinstance(node, str):
                return None, (Reason.COORDINATE_AS_STRING, f"{path}: {shown(node)} is a string, not a JSON number")
            if isinstance(node, bool) or not isinstance(node, int | float):
                return None, (Reason.COORDINATE_NOT_A_NUMBER, f"{path}: {shown(node)} is not a number")
            return float(node), None
        if kind == "text":
            if not isinstance(node, str):
                return None, (Reason.BAD_GEOMETRY_ENCODING, f"{path}: {shown(node)} is not a string")
            return node, None
        if kind == QUOTED_NON_FINITE and isinstance(node, str) and node in _NON_FINITE:
            return _NON_FINITE[node], None
        if kind == "geojson":
            if not isinstance(node, dict):
                return None, (
                    Reason.INVALID_GEOJSON_GEOMETRY,
                    f"{path}: {shown(node)} is not a GeoJSON geometry object",
                )
            kind_name = node.get("type")
            return {"type": kind_name if isinstance(kind_name, str) else None}, None
        try:
            return coerce(node, leaf_type, f"json.{path}"), None
        except ValueProblem as problem:
            return None, (Reason.PROPERTY_TYPE_MISMATCH, str(problem))


def _type_reason(kind: str) -> Reason:
    return {
        "coordinate": Reason.COORDINATE_NOT_A_NUMBER,
        "text": Reason.BAD_GEOMETRY_ENCODING,
        "geojson": Reason.INVALID_GEOJSON_GEOMETRY,
    }.get(kind, Reason.PROPERTY_TYPE_MISMATCH)
