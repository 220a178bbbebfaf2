"""GeoJSON Feature events (contract format "geojson"; RFC 7946: lon/lat in WGS 84, UTF-8).

A block of documents is read at once: pyarrow's JSON reader takes the Feature members (type, id,
properties), geojson_geometry.py the coordinates of plainly well-formed geometries, and GEOS the
rest. Only a block the reader refuses is split in halves until the offending records are
isolated; those few are diagnosed one by one (json.loads), so each reject names its culprit.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import shapely

from streaming.contract import Contract
from streaming.decode.formats.base import Decoded, InputFormat
from streaming.decode.formats.geojson_geometry import (
    KnownCoordinates,
    ReadGeometries,
    coordinates_type,
    ndjson,
    read_geometries,
)
from streaming.decode.formats.json_blocks import ROW_IN_ERROR, has_line_break, one_per_line, read_in_blocks
from streaming.decode.formats.wkt import store_points
from streaming.decode.json_values import (
    JsonNumber,
    ValueProblem,
    coerce,
    convert,
    has_map,
    holds_decimal,
    needs_conversion,
    read_type,
)
from streaming.decode.rejects import Reason, Rejects, shown
from streaming.kernels.buffers import NONE, scatter

GEOJSON_SRID = 4326  # RFC 7946: GeoJSON coordinates are always WGS 84 lon/lat
GEOJSON_GEOMETRY_TYPES = (
    "Point",
    "LineString",
    "Polygon",
    "MultiPoint",
    "MultiLineString",
    "MultiPolygon",
    "GeometryCollection",
)
GEOMETRY_MEMBER = pa.struct([("type", pa.string())])


class GeoJsonFormat(InputFormat):
    names: ClassVar[tuple[str, ...]] = ("geojson",)
    first_bytes: ClassVar[tuple[int, ...]] = (ord("{"),)
    described: ClassVar[str] = "a JSON object"
    first_bytes_shown: ClassVar[tuple[str, ...]] = ("'{'",)
    refused_first_bytes: ClassVar[dict[int, tuple[Reason, str]]] = {
        ord("["): (Reason.NOT_A_FEATURE, "a JSON array is not a GeoJSON Feature")
    }

    @classmethod
    def active(cls, contract: Contract) -> bool:
        # A table that reads plain JSON events (format "json"), rasters (format "stac") or change
        # events (format "debezium") reads every JSON object so.
        return not {"json", "stac", "debezium"} & set(contract.formats)

    def decode(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        if "geojson" not in self.contract.formats:
            out.rejects.add(rows, Reason.FORMAT_NOT_ACCEPTED, "GeoJSON events are not accepted by this table")
            return
        out.feature_ids, out.properties = self._read(values, rows, out)
        out.srids[rows] = GEOJSON_SRID

    def _read(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> tuple[pa.Array, dict[str, pa.Array]]:
        """Geometries (and plain points) into `out`, and the Feature ids and properties of its
        rows (null where a row is not one of `rows` or is rejected)."""
        geoms, rejects, n = out.geoms, out.rejects, len(values)
        no_ids = pa.nulls(n, pa.string())
        no_properties = {k: pa.nulls(n, t) for k, t in self.property_types.items()}
        docs = values.take(pa.array(rows))
        # Every object GEOS recurses into has a "type" member, so a document with few of them
        # cannot nest deeply; the rare one with many is checked exactly before GEOS sees it.
        # Only a document long enough to hold that many is searched for them.
        long_enough = np.flatnonzero(
            pc.greater(pc.binary_length(docs), len('"type"') * self.max_nesting).to_numpy(zero_copy_only=False)
        )
        many_types = pc.greater(
            pc.count_substring(docs.take(pa.array(long_enough)).cast(pa.binary()), '"type"'), self.max_nesting
        ).to_numpy(zero_copy_only=False)
        for local in long_enough[many_types].tolist():
            problem = _geojson_nesting_problem(docs[int(local)].as_py(), self.max_nesting)
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
        flat = one_per_line(docs)
        parsed = _FeatureParser(self.property_types).parse(flat)
        for local, (reason, detail) in parsed.errors.items():
            rejects.add(rows[[local]], reason, detail)
        bad_rows = np.zeros(rows.size, dtype=bool)
        bad_rows[list(parsed.errors)] = True
        not_feature = pc.fill_null(pc.not_equal(parsed.types, "Feature"), True).to_numpy(zero_copy_only=False)
        not_feature &= ~bad_rows
        rejects.add(
            rows[not_feature],
            Reason.NOT_A_FEATURE,
            [f"type is {shown(t)}, expected 'Feature'" for t in parsed.types.filter(pa.array(not_feature)).to_pylist()],
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
                f"geometry: type {shown(t)} is not a GeoJSON geometry type"
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
        usable = pa.array(local_usable)
        known = parsed.known
        fast = read_geometries(
            flat.take(usable),
            geometry_types.take(usable).to_numpy(zero_copy_only=False),
            known=None if known is None else KnownCoordinates(known.geometry_type, known.coordinates.take(usable)),
        )
        store_read(out, rows[local_usable], fast, GEOJSON_SRID, self.contract.geometry.epsg)
        # What the fast reader leaves (other shapes, anything not plainly well formed) GEOS reads.
        rest = local_usable[~fast.read]
        text = pc.cast(docs.take(pa.array(rest)), pa.string()).to_numpy(zero_copy_only=False)
        with np.errstate(all="ignore"):  # a number beyond the double range is reported below, not warned of
            decoded = shapely.from_geojson(text, on_invalid="ignore") if rest.size else np.zeros(0, dtype=object)
        geoms[rows[rest]] = decoded
        failed = rest[np.equal(decoded, NONE)]
        for local in failed:
            diagnosis = _diagnose_geojson_geometry(docs[int(local)].as_py(), self.property_types)
            if diagnosis[1] is None:  # a geometry: the refusal was about something else
                geoms[rows[local]] = diagnosis[0]
            else:
                _, reason, detail = diagnosis
                rejects.add(rows[[local]], reason, detail)

        feature_ids = scatter(parsed.ids, rows, n)
        properties = {name: scatter(arr, rows, n) for name, arr in parsed.properties.items()}
        return feature_ids, properties


# -- Feature members ------------------------------------------------------------------------------
@dataclass
class _ParsedFeatures:
    types: pa.Array
    geometry_types: pa.Array
    ids: pa.Array
    properties: dict[str, pa.Array]
    errors: dict[int, tuple[Reason, str]]
    # Coordinates read in the same pass as the members, for one geometry type (None: none were)
    known: KnownCoordinates | None


class _FeatureParser:
    """Reads Feature members (type, id, properties) from a block of JSON documents.

    pyarrow's reader does a whole block at once, but refuses the whole block over one bad
    document or one id that is a number where the others are strings, naming the row it stopped
    at. The rows before it are read again as a block, the refused one alone with json.loads
    (which agrees with the reader on every document the reader takes, and says what is wrong
    with the others). Refusals close together would cost a block read each, so a run of rows
    after them is read one by one instead, a longer run while they keep coming: a batch of bad
    records costs about what json.loads costs, never a block read per record.

    The coordinates of one geometry type, the first document's, are read in the same pass: a
    stream of one type (points, most often) is then read once, not twice. A block holding
    another type makes the reader refuse that schema; the block is read again without it, and
    so is the rest of the batch (the coordinates are read by type afterwards, as for any batch).
    """

    _BLOCK_ID_TYPES = (pa.string(), pa.int64())
    # A block read costs about as much as reading this many rows one by one.
    _MIN_BLOCK = 64
    _MAX_RUN = 4096

    def __init__(self, property_types: dict[str, pa.DataType]):
        self.property_types = property_types
        self._props = pa.struct([pa.field(k, read_type(v)) for k, v in property_types.items()])
        self._converted = {k: v for k, v in property_types.items() if needs_conversion(v)}
        # A map is an object of any members, which the block reader cannot read as one.
        self._one_by_one = any(has_map(v) for v in property_types.values())
        self._exact_fractions = any(holds_decimal(v) for v in property_types.values())
        self._coordinates: pa.DataType | None = None  # the type of the coordinates read with the members
        self._with_coordinates = False  # whether the next block is read with them

    def parse(self, flat: pa.Array) -> _ParsedFeatures:
        """Documents without raw line breaks, one per element."""
        expected = _first_geometry_type(flat)
        self._coordinates = None if expected is None else coordinates_type(expected)
        self._with_coordinates = self._coordinates is not None
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

        read_in_blocks(
            len(flat),
            lambda lo, hi: self._read_block(flat.slice(lo, hi - lo)),
            add_block,
            one_by_one,
            self._MIN_BLOCK,
            self._MAX_RUN,
            readable=not self._one_by_one,
        )
        add_block(self._empty(0))
        table = pa.concat_tables(pieces)
        geometry = table.column("geometry").combine_chunks()
        read = table.column("properties").combine_chunks()
        properties = {k: read.field(k) for k in self.property_types}
        for name, kind in self._converted.items():
            properties[name], problems = convert(properties[name], kind, f"properties.{name}", np.arange(len(read)))
            for row, detail in problems:
                errors.setdefault(row, (Reason.PROPERTY_TYPE_MISMATCH, detail))
        return _ParsedFeatures(
            types=table.column("type").combine_chunks(),
            geometry_types=pc.struct_field(geometry, "type"),
            ids=table.column("id").combine_chunks(),
            properties=properties,
            errors=errors,
            known=None
            if expected is None or self._coordinates is None
            else KnownCoordinates(expected, pc.struct_field(geometry, "coordinates")),
        )

    def _schema(self, id_type: pa.DataType, with_coordinates: bool = True) -> pa.Schema:
        """The members read; the geometry's coordinates too if this batch reads them (see parse)."""
        geometry = GEOMETRY_MEMBER
        if with_coordinates and self._coordinates is not None:
            geometry = pa.struct([("type", pa.string()), ("coordinates", self._coordinates)])
        return pa.schema([("type", pa.string()), ("id", id_type), ("properties", self._props), ("geometry", geometry)])

    def _empty(self, n: int) -> pa.Table:
        schema = self._schema(pa.string())
        return pa.Table.from_arrays([pa.nulls(n, f.type) for f in schema], schema=schema)

    def _read_block(self, block: pa.Array) -> tuple[pa.Table | None, int | None]:
        """The block as a table, or (None, the row the reader refused if it says which)."""
        if self._with_coordinates:
            table, _ = self._read_block_as(block, with_coordinates=True)
            if table is not None:
                return table, None
        table, bad_row = self._read_block_as(block, with_coordinates=False)
        if table is None or self._coordinates is None:
            return table, bad_row
        # Read without them, so the block holds another geometry type: so may the rest.
        self._with_coordinates = False
        return _with_null_coordinates(table, self._coordinates), None

    def _read_block_as(self, block: pa.Array, with_coordinates: bool) -> tuple[pa.Table | None, int | None]:
        data = ndjson(block)
        read_options = pa_json.ReadOptions(use_threads=False, block_size=max(data.size + 1, 1 << 20))
        bad_row = None
        for id_type in self._BLOCK_ID_TYPES:
            options = pa_json.ParseOptions(
                explicit_schema=self._schema(id_type, with_coordinates), unexpected_field_behavior="ignore"
            )
            try:
                table = pa_json.read_json(pa.BufferReader(data), parse_options=options, read_options=read_options)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                where = ROW_IN_ERROR.search(str(exc))
                if where:
                    # Rows before the furthest refusal all read under that pass's id type.
                    bad_row = max(bad_row or 0, int(where.group(1)))
                continue
            if table.num_rows != len(block):
                # A value that holds several documents: no row to blame, so split the block.
                return None, None
            return table.cast(self._schema(pa.string(), with_coordinates)), None
        if bad_row is not None and not 0 <= bad_row < len(block):
            bad_row = None
        return None, bad_row

    def _parse_one(self, docs: pa.Array, position: int, errors: dict) -> dict:
        """One document as the block reader would read it, or an empty row with its reject in `errors`."""
        empty = {"type": None, "id": None, "properties": None, "geometry": None}
        raw = docs[position].as_py()
        doc, problem = _load_json(raw, self._exact_fractions)
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
            errors[position] = (Reason.NOT_A_FEATURE, f"type is {shown(doc.get('type'))}, expected 'Feature'")
            return empty
        fid = doc.get("id")
        if fid is not None and (isinstance(fid, bool) or not isinstance(fid, str | int | float)):
            errors[position] = (Reason.PROPERTY_TYPE_MISMATCH, f"id: {shown(fid)} is neither a string nor a number")
            return empty
        if isinstance(fid, float) and not math.isfinite(fid):
            errors[position] = (Reason.PROPERTY_TYPE_MISMATCH, f"id: {fid} is not a finite number")
            return empty
        geometry = doc.get("geometry")
        if geometry is not None and not (isinstance(geometry, dict) and geometry.get("type") in GEOJSON_GEOMETRY_TYPES):
            what = (
                f"type {shown(geometry.get('type'))}"
                if isinstance(geometry, dict)
                else f"a JSON {type(geometry).__name__}"
            )
            errors[position] = (Reason.INVALID_GEOJSON_GEOMETRY, f"geometry: {what} is not a GeoJSON geometry object")
            return empty
        props = doc.get("properties")
        if props is not None and not isinstance(props, dict):
            errors[position] = (Reason.PROPERTY_TYPE_MISMATCH, f"properties: expected an object, got {shown(props)}")
            return empty
        values = {}
        for name, arrow_type in self.property_types.items():
            try:
                values[name] = coerce((props or {}).get(name), arrow_type, f"properties.{name}")
            except ValueProblem as problem:
                errors[position] = (Reason.PROPERTY_TYPE_MISMATCH, str(problem))
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


def store_read(out: Decoded, rows: np.ndarray, fast: ReadGeometries, srid: int, table_epsg: int) -> None:
    """What read_geometries read of the documents at `rows` (in `srid`) into `out`: its
    geometries, and its 2D points as plain points (store_points)."""
    plain = fast.plain
    out.geoms[rows[fast.read & ~plain]] = fast.geoms[fast.read & ~plain]
    xy = fast.points_xy[plain]
    store_points(out, rows[plain], xy, np.full(len(xy), srid), table_epsg)


def _first_geometry_type(flat: pa.Array) -> str | None:
    """The geometry type named by the first document, if it is a Feature with one."""
    if len(flat) == 0:
        return None
    doc, problem = _load_json(flat[0].as_py())
    geometry = doc.get("geometry") if problem is None and isinstance(doc, dict) else None
    kind = geometry.get("type") if isinstance(geometry, dict) else None
    return kind if isinstance(kind, str) else None


def _with_null_coordinates(table: pa.Table, coordinates: pa.DataType) -> pa.Table:
    """A block read without the geometry's coordinates, in the schema of one read with them."""
    geometry = table.column("geometry").combine_chunks()
    widened = pa.StructArray.from_arrays(
        [pc.struct_field(geometry, "type"), pa.nulls(len(geometry), coordinates)],
        names=["type", "coordinates"],
        mask=pc.is_null(geometry),
    )
    return table.set_column(table.schema.get_field_index("geometry"), "geometry", widened)


def _is_unicode(value: Any) -> bool:
    """Whether a value, if a string, can be stored (a JSON escape can make a lone surrogate); a
    nested value's strings each."""
    if isinstance(value, dict):
        return all(_is_unicode(v) for v in value.values())
    if isinstance(value, list):
        return all(_is_unicode(v) for v in value)
    if not isinstance(value, str):
        return True
    try:
        value.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


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


def _load_json(raw: bytes, exact_fractions: bool = False) -> tuple[Any, tuple[Reason, str] | None]:
    """The document, or why it cannot be read: whatever the bytes, this does not raise.

    The bytes are decoded as UTF-8 first (json.loads would take UTF-16 and UTF-32 bytes too), and
    integers too long for int() (over 4300 digits) become floats, infinite ones, as pyarrow's reader
    makes of them. With `exact_fractions` (a decimal column reads the document) fractions keep their
    text (JsonNumber): Python's callback per number costs a third more on documents of coordinates."""
    try:
        text = raw.decode("utf-8")
        if exact_fractions:
            return json.loads(text, parse_int=_json_int, parse_float=JsonNumber), None
        return json.loads(text, parse_int=_json_int), None
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


def _still_ok(rows: np.ndarray, docs: pa.Array, rejects: Rejects) -> tuple[np.ndarray, pa.Array]:
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
    if not has_line_break(docs):
        return []
    breaks = np.flatnonzero(pc.match_substring_regex(docs, "[\r\n]").to_numpy(zero_copy_only=False))
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
