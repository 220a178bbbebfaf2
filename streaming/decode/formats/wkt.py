"""WKT and EWKT values (contract formats "wkt" and "ewkt"), and the WKT reader JSON events share.

A value is claimed by its leading keyword (`POINT`, `MULTIPOLYGON`, `SRID=4326;...`, any case), not
by its first byte alone: 'G' also opens GeoPackage binary. The plainest and most common value, a
2D point (`POINT (2.35 48.85)`), is read by RE2 and Arrow's number parser, both over the whole
batch, and gets no geometry object (25x faster than GEOS here); every other value goes through
shapely's vectorised reader (shapely.from_wkt). Both parse a decimal number to the nearest double,
so coordinates written with enough digits come back exactly.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import shapely

from streaming.contract import Contract
from streaming.decode.formats.base import Decoded, InputFormat
from streaming.decode.rejects import Reason, shown
from streaming.kernels.buffers import NONE

_KEYWORDS = (
    "POINT|LINESTRING|POLYGON|MULTIPOINT|MULTILINESTRING|MULTIPOLYGON|GEOMETRYCOLLECTION|"
    "CIRCULARSTRING|COMPOUNDCURVE|CURVEPOLYGON|MULTICURVE|MULTISURFACE|TRIANGLE|TIN|POLYHEDRALSURFACE"
)
# A value that is WKT or EWKT by its look: an optional SRID, then a geometry keyword.
_WKT_LOOK = rf"(?i)^\s*(SRID\s*=|({_KEYWORDS})\b)"
_EWKT = r"(?i)^\s*SRID\s*=\s*(?P<srid>[-+]?\d{1,9})\s*;(?P<wkt>.*)$"
_SRID_PREFIX = r"(?i)^\s*SRID\s*="
_EWKT_PREFIX = r"(?i)^\s*SRID\s*=\s*[-+]?\d{1,9}\s*;"
# Types GEOS does not read (curves, surfaces): shapely refuses a whole array over one of them.
_UNREAD_TYPES = (
    r"(?i)\b(CIRCULARSTRING|COMPOUNDCURVE|CURVEPOLYGON|MULTICURVE|MULTISURFACE|TRIANGLE|TIN|POLYHEDRALSURFACE)\b"
)
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d{1,3})?"
_PLAIN_POINT = rf"(?i)^\s*POINT\s*\(\s*(?P<x>{_NUMBER})\s+(?P<y>{_NUMBER})\s*\)\s*$"
_LETTERS = tuple(range(ord("A"), ord("Z") + 1)) + tuple(range(ord("a"), ord("z") + 1))


class WktFormat(InputFormat):
    """WKT (taken to be in the table CRS) and EWKT (`SRID=<code>;<WKT>`, its SRID honoured)."""

    names: ClassVar[tuple[str, ...]] = ("wkt", "ewkt")
    first_bytes: ClassVar[tuple[int, ...]] = _LETTERS
    described: ClassVar[str] = "WKT"
    first_bytes_shown: ClassVar[tuple[str, ...]] = ("a WKT keyword",)
    precedence: ClassVar[int] = 1

    def claims(self, values: pa.Array, first: np.ndarray) -> np.ndarray:
        lettered = np.flatnonzero(np.isin(first, _LETTERS))
        mine = np.zeros(len(values), dtype=bool)
        if lettered.size:
            looks = pc.match_substring_regex(values.take(pa.array(lettered)).cast(pa.binary()), _WKT_LOOK)
            mine[lettered] = pc.fill_null(looks, False).to_numpy(zero_copy_only=False)
        return mine

    def decode(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        texts = values.take(pa.array(rows)).cast(pa.binary())
        with_srid = pc.match_substring_regex(texts, _SRID_PREFIX).to_numpy(zero_copy_only=False)
        if with_srid.any() and "ewkt" not in self.contract.formats:
            out.rejects.add(
                rows[with_srid], Reason.FORMAT_NOT_ACCEPTED, "EWKT (WKT with an SRID) is not accepted by this table"
            )
        if (~with_srid).any() and "wkt" not in self.contract.formats:
            out.rejects.add(
                rows[~with_srid], Reason.FORMAT_NOT_ACCEPTED, "WKT without an SRID is not accepted by this table"
            )
        read_wkt(texts, rows, out, self.contract, self.max_nesting, self.contract.geometry.epsg, "value")


def read_wkt(
    texts: pa.Array,
    rows: np.ndarray,
    out: Decoded,
    contract: Contract,
    max_nesting: int,
    default_epsg: int,
    where: str,
) -> None:
    """Reads one WKT or EWKT geometry from each of `texts` (the values of `rows`) into `out`, its
    CRS the EWKT SRID or `default_epsg`. Rejects what is not one readable WKT geometry (bad_wkt),
    a type GEOS does not read, and collections nested deeper than `max_nesting`. `where` names
    the text in details ("value", "json.geom")."""
    rejects = out.rejects
    keep = rejects.ok[rows]
    rows, texts = rows[keep], texts.filter(pa.array(keep))
    if rows.size == 0:
        return
    try:
        texts = texts.cast(pa.binary()).cast(pa.string())
    except pa.ArrowInvalid:
        utf8 = np.array([_is_utf8(v) for v in texts.cast(pa.binary()).to_pylist()], dtype=bool)
        rejects.add(rows[~utf8], Reason.BAD_WKT, f"{where} is not UTF-8 text")
        rows, texts = rows[utf8], texts.filter(pa.array(utf8)).cast(pa.binary()).cast(pa.string())
    srids = np.full(rows.size, default_epsg, dtype=np.int64)
    ewkt = pc.fill_null(pc.match_substring_regex(texts, _SRID_PREFIX), False).to_numpy(zero_copy_only=False)
    if ewkt.any():
        parts = pc.extract_regex(texts.filter(pa.array(ewkt)), _EWKT)
        spelt = pc.is_valid(parts).to_numpy(zero_copy_only=False)
        at = np.flatnonzero(ewkt)
        rejects.add(
            rows[at[~spelt]],
            Reason.BAD_WKT,
            f"{where}: an EWKT SRID is spelt 'SRID=<code>;' with a code of at most 9 digits",
        )
        codes = pc.struct_field(parts, "srid").filter(pc.is_valid(parts))
        # Arrow's cast to an integer refuses a leading "+", which the spelling allows.
        srids[at[spelt]] = pc.utf8_ltrim(codes, characters="+").cast(pa.int64()).to_numpy()
        texts = pc.replace_substring_regex(texts, _EWKT_PREFIX, "", max_replacements=1)
    unread = pc.fill_null(pc.match_substring_regex(texts, _UNREAD_TYPES), False).to_numpy(zero_copy_only=False)
    rejects.add(
        rows[unread],
        Reason.GEOMETRY_TYPE_NOT_ALLOWED,
        f"a curve or surface (CircularString, CompoundCurve, CurvePolygon, MultiCurve, MultiSurface, Triangle, "
        f"TIN, PolyhedralSurface) is not one of {list(contract.geometry.types)}",
    )
    collections = pc.count_substring_regex(texts, "(?i)GEOMETRYCOLLECTION").to_numpy(zero_copy_only=False)
    for local in np.flatnonzero(collections > max_nesting):
        if _collection_depth(texts[int(local)].as_py()) > max_nesting:
            rejects.add(
                rows[[local]],
                Reason.NESTING_TOO_DEEP,
                f"{where}: geometries nested more than max_nesting={max_nesting} levels deep",
            )
    live = rejects.ok[rows]

    # Plain 2D points: their numbers straight from the text, no geometry object.
    matched = pc.extract_regex(texts, _PLAIN_POINT)
    plain = live & pc.is_valid(matched).to_numpy(zero_copy_only=False)
    if plain.any():
        found = matched.filter(pa.array(plain))
        xy = np.column_stack(
            [pc.struct_field(found, axis).cast(pa.float64()).to_numpy(zero_copy_only=False) for axis in ("x", "y")]
        )
        finite = np.isfinite(xy).all(axis=1)
        at = np.flatnonzero(plain)
        plain[at[~finite]] = False
        store_points(out, rows[at[finite]], xy[finite], srids[at[finite]], contract.geometry.epsg)
    rest = np.flatnonzero(live & ~plain)
    if rest.size == 0:
        return
    text = texts.take(pa.array(rest)).to_numpy(zero_copy_only=False)
    with np.errstate(all="ignore"):  # a number beyond the double range is reported by the rules, not warned of
        geoms = shapely.from_wkt(text, on_invalid="ignore")
    failed = np.equal(geoms, NONE)
    for local in np.flatnonzero(failed):
        rejects.add(rows[[rest[local]]], Reason.BAD_WKT, f"{where} is not readable WKT: {_wkt_error(text[local])}")
    good = rest[~failed]
    out.geoms[rows[good]] = geoms[~failed]
    out.srids[rows[good]] = srids[good]


def store_points(out: Decoded, rows: np.ndarray, xy: np.ndarray, srids: np.ndarray, table_epsg: int) -> None:
    """Finite 2D points: those in the table CRS as plain points (x, y and their stored WKB, no
    geometry object), the others as point geometries for the rules to reproject."""
    here = srids == table_epsg
    out.points_xy[rows[here]] = xy[here]
    out.wkb[rows[here]] = point_wkb(xy[here])
    if (~here).any():
        out.geoms[rows[~here]] = shapely.points(xy[~here])
        out.srids[rows[~here]] = srids[~here]


def point_wkb(xy: np.ndarray) -> np.ndarray:
    """The stored WKB of 2D points (little-endian ISO, 21 bytes each), built for all at once."""
    n = len(xy)
    if n == 0:
        return np.zeros(0, dtype=object)
    record = np.zeros(n, dtype=[("order", "u1"), ("type", "<u4"), ("xy", "<f8", (2,))])
    record["order"], record["type"], record["xy"] = 1, 1, xy
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * 21).tobytes())
    binary = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(record.tobytes())])
    return binary.to_numpy(zero_copy_only=False)


def _wkt_error(text: str) -> str:
    try:
        with np.errstate(all="ignore"):
            shapely.from_wkt(text, on_invalid="raise")
    except Exception as exc:  # noqa: BLE001 - GEOS's own words are the detail
        return f"{str(exc)[:200]} (in {shown(text)})"
    return shown(text)


def _collection_depth(text: str) -> int:
    """How deep GEOMETRYCOLLECTIONs nest in a WKT text (walked without recursion)."""
    upper = text.upper()
    stack: list[bool] = []  # for each open parenthesis: whether a collection opened it
    deepest = depth = 0
    pending = False
    i = 0
    while i < len(upper):
        if upper.startswith("GEOMETRYCOLLECTION", i):
            pending, i = True, i + len("GEOMETRYCOLLECTION")
            continue
        char = upper[i]
        if char == "(":
            stack.append(pending)
            depth += pending
            deepest = max(deepest, depth)
            pending = False
        elif char == ")" and stack:
            depth -= stack.pop()
        i += 1
    return deepest


def _is_utf8(value: bytes | None) -> bool:
    if value is None:
        return False
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
