"""GeoPackage binary geometries (contract format "gpkg"): GeoPackage 1.3 §2.1.3, as Kart and GDAL
write them.

A value is an 8-byte header, an optional envelope and one ISO WKB geometry:

    bytes 0-1  magic "GP"
    byte  2    version, 0 (GeoPackage 1.x)
    byte  3    flags: bit 0 byte order of the header (1 little-endian, 0 big-endian), bits 1-3
               envelope contents (0 none, 1 [minx, maxx, miny, maxy], 2 + [minz, maxz],
               3 + [minm, maxm], 4 + [minz, maxz, minm, maxm]; 5-7 reserved), bit 4 empty
               geometry, bit 5 ExtendedGeoPackageBinary, bits 6-7 reserved (0)
    bytes 4-7  srs_id, int32 in the header's byte order
    bytes 8-   the envelope's doubles (header byte order), then the WKB (its own byte order)

The headers of a batch are read with numpy straight from the Arrow buffers; the WKB after them
goes, still in the same buffer, to the WKB reader of streaming/decode/formats/wkb.py, so it is read,
checked and stored exactly as a WKB value would be. srs_id 0 and -1 (GeoPackage's undefined
geographic and Cartesian systems; Kart always writes 0) mean the table CRS; any other srs_id is
taken as an EPSG code, as an EWKB SRID is: reprojected, or rejected as unknown_srid.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow as pa
import shapely

from streaming.decode.formats.base import Decoded, InputFormat
from streaming.decode.formats.wkb import EWKB_SRID_FLAG, read_wkb
from streaming.decode.rejects import Reason
from streaming.kernels.buffers import offsets_and_bytes

HEADER_BYTES = 8
# the values of the envelope each envelope contents indicator announces, in order
ENVELOPES: dict[int, tuple[str, ...]] = {
    0: (),
    1: ("minx", "maxx", "miny", "maxy"),
    2: ("minx", "maxx", "miny", "maxy", "minz", "maxz"),
    3: ("minx", "maxx", "miny", "maxy", "minm", "maxm"),
    4: ("minx", "maxx", "miny", "maxy", "minz", "maxz", "minm", "maxm"),
}
_DOUBLES = np.array([len(ENVELOPES[i]) for i in range(5)] + [0, 0, 0])
_EMPTY_FLAG, _EXTENDED_FLAG, _RESERVED_FLAGS = 0x10, 0x20, 0xC0
# An envelope may differ from the geometry's bounds by this much (relative, at least absolute).
ENVELOPE_TOLERANCE = 1e-9
_WKB_PART = "the WKB after the GeoPackage header"


class GeoPackageFormat(InputFormat):
    names: ClassVar[tuple[str, ...]] = ("gpkg",)
    first_bytes: ClassVar[tuple[int, ...]] = (ord("G"),)
    described: ClassVar[str] = "a GeoPackage geometry"
    first_bytes_shown: ClassVar[tuple[str, ...]] = ("'G'",)

    def decode(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        taken = values.take(pa.array(rows)).cast(pa.binary())
        live = self._check_header(taken, rows, out)
        if not live.any():
            return
        rows, taken = rows[live], taken.filter(pa.array(live))
        offsets, data = offsets_and_bytes(taken)
        starts = offsets[:-1].astype(np.int64)
        flags = data[starts + 3]
        little = (flags & 1) == 1
        kind = (flags >> 1) & 7
        srs_id = _int32(data, starts + 4, little)
        envelope_at = starts + HEADER_BYTES
        wkb_parts = _after_headers(taken, kind)
        read_rows, codes, geoms = read_wkb(wkb_parts, rows, out, self.contract, self.max_nesting, where=_WKB_PART)
        rejects = out.rejects
        at = np.searchsorted(rows, read_rows)  # each read row's place among `rows` (sorted)
        rejects.add(
            read_rows[(codes & EWKB_SRID_FLAG) != 0],
            Reason.BAD_WKB,
            f"{_WKB_PART} carries an EWKB SRID; the header's srs_id (bytes 4-7) is the CRS of a GeoPackage geometry",
        )
        empty = (flags[at] & _EMPTY_FLAG) != 0
        rejects.add(
            read_rows[empty],
            Reason.EMPTY_GEOMETRY,
            [f"byte 3 (flags 0x{f:02x}): bit 4 marks the geometry empty" for f in flags[at][empty]],
        )
        with_envelope = np.flatnonzero(~empty & (kind[at] > 0))
        if with_envelope.size:
            self._check_envelopes(
                out,
                read_rows[with_envelope],
                geoms[with_envelope],
                data,
                envelope_at[at][with_envelope],
                kind[at][with_envelope],
                little[at][with_envelope],
            )
        table = self.contract.geometry.epsg
        ids = srs_id[at]
        srids = np.where((ids == 0) | (ids == -1), table, ids)
        out.srids[read_rows] = srids
        # A plain point (x and y only, no geometry object) must be in the table CRS: one in another
        # CRS becomes a geometry, to be reprojected or rejected as any other.
        elsewhere = read_rows[(srids != table) & ~np.isnan(out.points_xy[read_rows, 0])]
        out.geoms[elsewhere] = shapely.points(out.points_xy[elsewhere])
        out.points_xy[elsewhere] = np.nan

    def _check_header(self, taken: pa.Array, rows: np.ndarray, out: Decoded) -> np.ndarray:
        """Rejects values whose header is malformed; returns which values are left."""
        rejects = out.rejects
        offsets, data = offsets_and_bytes(taken)
        starts, lengths = offsets[:-1].astype(np.int64), np.diff(offsets).astype(np.int64)

        def byte(k: int) -> np.ndarray:
            """Byte k of each value; -1 where the value is shorter."""
            has = lengths > k
            found = np.full(len(starts), -1, dtype=np.int64)
            found[has] = data[starts[has] + k]
            return found

        magic = byte(1)
        bad_magic = (magic >= 0) & (magic != ord("P"))
        rejects.add(
            rows[bad_magic],
            Reason.GPKG_BAD_MAGIC,
            [f"bytes 0-1 (magic) are 0x47{m:02x}, not 'GP' (0x4750)" for m in magic[bad_magic]],
        )
        if "gpkg" not in self.contract.formats:
            rejects.add(rows, Reason.FORMAT_NOT_ACCEPTED, "GeoPackage geometries are not accepted by this table")
            return np.zeros(rows.size, dtype=bool)
        short = lengths < HEADER_BYTES
        rejects.add(
            rows[short],
            Reason.GPKG_TOO_SHORT,
            [f"value of {n} bytes ends inside the {HEADER_BYTES}-byte GeoPackage header" for n in lengths[short]],
        )
        version = byte(2)
        unknown = ~short & (version != 0)
        rejects.add(
            rows[unknown],
            Reason.GPKG_UNKNOWN_VERSION,
            [f"byte 2 (version) is {v}; GeoPackage 1.x writes 0" for v in version[unknown]],
        )
        flags = byte(3)
        kind = (flags >> 1) & 7
        reserved_kind = ~short & (kind > 4)
        rejects.add(
            rows[reserved_kind],
            Reason.GPKG_BAD_FLAGS,
            [
                f"byte 3 (flags 0x{f:02x}): envelope contents indicator {k} (bits 1-3) is reserved; 0-4 are defined"
                for f, k in zip(flags[reserved_kind], kind[reserved_kind])
            ],
        )
        reserved_bits = ~short & ((flags & _RESERVED_FLAGS) != 0)
        rejects.add(
            rows[reserved_bits],
            Reason.GPKG_BAD_FLAGS,
            [f"byte 3 (flags 0x{f:02x}): bits 6-7 are reserved and must be 0" for f in flags[reserved_bits]],
        )
        extended = ~short & ((flags & _EXTENDED_FLAG) != 0)
        rejects.add(
            rows[extended],
            Reason.GPKG_EXTENDED_TYPE,
            [
                f"byte 3 (flags 0x{f:02x}): bit 5 marks an ExtendedGeoPackageBinary geometry, "
                "whose extension type this table does not read"
                for f in flags[extended]
            ],
        )
        needed = HEADER_BYTES + 8 * _DOUBLES[np.clip(kind, 0, 7)]
        truncated = ~short & (kind <= 4) & (lengths < needed)
        rejects.add(
            rows[truncated],
            Reason.GPKG_ENVELOPE_TRUNCATED,
            [
                f"bytes {HEADER_BYTES}-{e - 1}: the envelope ({', '.join(ENVELOPES[int(k)])}) needs {e - HEADER_BYTES} "
                f"bytes, the value ends after {n - HEADER_BYTES}"
                for k, e, n in zip(kind[truncated], needed[truncated], lengths[truncated])
            ],
        )
        return rejects.ok[rows]

    def _check_envelopes(
        self,
        out: Decoded,
        rows: np.ndarray,
        geoms: np.ndarray,
        data: np.ndarray,
        at: np.ndarray,
        kind: np.ndarray,
        little: np.ndarray,
    ) -> None:
        """Rejects geometries whose bounds the header's envelope does not match."""
        n = rows.size
        actual = np.full((n, 8), np.nan)  # minx, maxx, miny, maxy, minz, maxz, minm, maxm
        plain = ~np.isnan(out.points_xy[rows, 0])
        b = shapely.bounds(geoms)
        b[plain] = np.tile(out.points_xy[rows[plain]], 2)
        actual[:, :4] = b[:, [0, 2, 1, 3]]
        has_zm = np.flatnonzero(~plain & (kind >= 2))
        if has_zm.size:
            coords, index = shapely.get_coordinates(geoms[has_zm], include_z=True, include_m=True, return_index=True)
            for axis, column in ((2, 4), (3, 6)):
                low, high = np.full(has_zm.size, np.inf), np.full(has_zm.size, -np.inf)
                with np.errstate(invalid="ignore"):  # NaN: the geometry has no Z (no M)
                    np.minimum.at(low, index, coords[:, axis])
                    np.maximum.at(high, index, coords[:, axis])
                actual[has_zm, column], actual[has_zm, column + 1] = low, high
        finite_geometry = np.isfinite(actual[:, :4]).all(axis=1)  # empty or NaN: validation rejects it
        envelope = np.full((n, 8), np.nan)
        for k in range(1, 5):
            group = np.flatnonzero(kind == k)
            if group.size == 0:
                continue
            doubles = _doubles(data, at[group], len(ENVELOPES[k]), little[group])
            columns = [0, 1, 2, 3] + {1: [], 2: [4, 5], 3: [6, 7], 4: [4, 5, 6, 7]}[k]
            envelope[np.ix_(group, np.array(columns))] = doubles
        given = ~np.isnan(envelope) | (np.arange(8) < 4)  # the values this row's envelope holds
        tolerance = ENVELOPE_TOLERANCE * np.maximum(1.0, np.abs(np.nan_to_num(actual)))
        off = given & ~(np.abs(envelope - actual) <= tolerance)
        mismatch = finite_geometry & off.any(axis=1)
        names = ("minx", "maxx", "miny", "maxy", "minz", "maxz", "minm", "maxm")
        details = []
        for i in np.flatnonzero(mismatch):
            wrong = np.flatnonzero(off[i])
            shown = ", ".join(
                f"{names[j]} {envelope[i, j]:.10g} (geometry: {_shown(actual[i, j], int(j))})" for j in wrong
            )
            details.append(
                f"bytes {HEADER_BYTES}-{HEADER_BYTES + 8 * len(ENVELOPES[int(kind[i])]) - 1} (envelope): {shown}"
            )
        out.rejects.add(rows[mismatch], Reason.GPKG_ENVELOPE_MISMATCH, details)


def _after_headers(taken: pa.Array, kind: np.ndarray) -> pa.Array:
    """The WKB of each value: its bytes after the header and envelope, gathered into a new binary
    array with numpy (one copy of the bytes; pyarrow 26's binary_slice miscounts its output on
    values of mixed lengths)."""
    offsets, data = offsets_and_bytes(taken)
    starts = offsets[:-1].astype(np.int64) + HEADER_BYTES + 8 * _DOUBLES[kind]
    lengths = offsets[1:].astype(np.int64) - starts
    new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    positions = np.repeat(starts - new_offsets[:-1], lengths) + np.arange(int(new_offsets[-1]))
    return pa.Array.from_buffers(
        pa.binary(), len(taken), [None, pa.py_buffer(new_offsets), pa.py_buffer(data[positions].tobytes())]
    )


def _shown(value: float, axis: int) -> str:
    if np.isnan(value):
        return "no Z" if axis in (4, 5) else "no M" if axis in (6, 7) else "none"
    return f"{value:.10g}"


def _gather(data: np.ndarray, at: np.ndarray, width: int, little: np.ndarray) -> np.ndarray:
    """`width` bytes from each offset, in little-endian order (big-endian ones reversed)."""
    raw = data[at[:, None] + np.arange(width)]
    return np.where(little[:, None], raw, raw[:, ::-1])


def _int32(data: np.ndarray, at: np.ndarray, little: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(_gather(data, at, 4, little)).view("<i4").reshape(-1).astype(np.int64)


def _doubles(data: np.ndarray, at: np.ndarray, count: int, little: np.ndarray) -> np.ndarray:
    """`count` doubles from each offset, in the byte order given, as an (n, count) array."""
    out = np.empty((at.size, count))
    for i in range(count):
        out[:, i] = np.ascontiguousarray(_gather(data, at + 8 * i, 8, little)).view("<f8").reshape(-1)
    return out
