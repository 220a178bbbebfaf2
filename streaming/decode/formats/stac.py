"""Rasters from STAC Items and plain raster references (contract format "stac").

A STAC Item is a GeoJSON Feature whose `assets` point at the files of a scene (Cloud Optimized
GeoTIFFs) and whose projection extension says how its pixel grid sits on the Earth:
`proj:code` ("EPSG:32660") or `proj:epsg` (32660), `proj:transform` (the affine geotransform,
rasterio's order a, b, c, d, e, f, optionally followed by 0, 0, 1) and `proj:shape`
([height, width]). A plain raster reference says the same in fewer words:
`{"id": .., "uri": "s3://../scene.tif", "crs": "EPSG:32660", "transform": [..], "shape": [h, w],
"bands": 3, "properties": {..}}`.

Each record becomes one row (`raster.rows` "item"): a raster in Havasu's model with out-db bands
(width, height, CRS as WKT, the geotransform anchored at the centre of the upper-left cell, and
a band per band of each raster asset: uri, 0-based band_number), its footprint in WGS84 as the
geometry and its WGS84 bounds (streaming/kernels/raster_bounds.py: the outline densified,
wrapped across ±180, a pole giving every longitude) as the covering. Properties feed the
contract's `properties.<name>` columns, the Item's id the `id` ones.

The projection fields are read from the Item's properties, or else from its assets when they
all agree; an asset whose own grid differs from the raster's (a 20 m band of a 10 m scene) is
not one of its bands. Items are read one by one (json.loads; a scene is one event among few),
their bounds computed over the batch, per CRS, with numpy.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import shapely

from streaming.contract import Contract
from streaming.decode.formats.base import Decoded, InputFormat
from streaming.decode.formats.geojson import _coerce_property, _load_json
from streaming.decode.rejects import Reason, shown
from streaming.kernels.raster_bounds import envelope_rings, wgs84_bounds

# Media types and roles of the assets that are a raster's bands.
_RASTER_MEDIA = ("image/tiff", "image/vnd.stac.geotiff", "application/x-geotiff")
_DATA_ROLES = ("data", "visual", "reflectance")
_MAX_SIDE = 2**31 - 1
_WGS84 = 4326


class RasterProblem(Exception):
    def __init__(self, reason: Reason, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@lru_cache(maxsize=256)
def crs_wkt(epsg: int) -> str | None:
    """The CRS's WKT, or None when PROJ does not know the code."""
    from pyproj import CRS

    try:
        return str(CRS.from_epsg(epsg).to_wkt())
    except Exception:  # noqa: BLE001 - pyproj raises CRSError, or others on odd input
        return None


def _epsg_of(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise RasterProblem(Reason.UNKNOWN_RASTER_CRS, f"{where}: {shown(value)} is not an EPSG code")
    if isinstance(value, int):
        code = value
    elif isinstance(value, str) and value.upper().startswith("EPSG:") and value[5:].isdigit():
        code = int(value[5:])
    else:
        raise RasterProblem(Reason.UNKNOWN_RASTER_CRS, f"{where}: {shown(value)} is not 'EPSG:<code>'")
    if not 0 < code < 2**31 or crs_wkt(code) is None:
        raise RasterProblem(Reason.UNKNOWN_RASTER_CRS, f"{where}: EPSG:{code} is not a CRS known to PROJ")
    return code


def _transform_of(value: Any, where: str) -> tuple[float, ...]:
    if value is None:
        raise RasterProblem(Reason.RASTER_WITHOUT_TRANSFORM, f"{where}: missing; the raster has no geotransform")
    ok = (
        isinstance(value, list)
        and len(value) in (6, 9)
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    )
    if not ok or (len(value) == 9 and list(value[6:]) != [0, 0, 1]):
        raise RasterProblem(
            Reason.RASTER_WITHOUT_TRANSFORM, f"{where}: {shown(value)} is not an affine transform (6 finite numbers)"
        )
    a, b, _, d, e, _ = (float(v) for v in value[:6])
    if a * e - b * d == 0:
        raise RasterProblem(Reason.RASTER_WITHOUT_TRANSFORM, f"{where}: {shown(value)} is singular (no pixel area)")
    return tuple(float(v) for v in value[:6])


def _shape_of(value: Any, where: str) -> tuple[int, int]:
    """(width, height) of a [height, width] shape."""
    if value is None:
        raise RasterProblem(Reason.BAD_RASTER_SHAPE, f"{where}: missing; the raster has no shape")
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= _MAX_SIDE for v in value)
    ):
        raise RasterProblem(
            Reason.BAD_RASTER_SHAPE, f"{where}: {shown(value)} is not [height, width] in whole pixels (1..2^31-1)"
        )
    return int(value[1]), int(value[0])


def _band_count(asset: dict) -> int:
    for key in ("raster:bands", "eo:bands", "bands"):
        listed = asset.get(key)
        if isinstance(listed, list) and listed:
            return len(listed)
    return 1


def _is_raster_asset(asset: Any) -> bool:
    if not isinstance(asset, dict) or not isinstance(asset.get("href"), str):
        return False
    media = str(asset.get("type", "")).split(";")[0].strip().lower()
    roles = asset.get("roles")
    if isinstance(roles, list) and roles and not any(r in _DATA_ROLES for r in roles):
        return False
    return media in _RASTER_MEDIA or (not media and asset["href"].lower().endswith((".tif", ".tiff")))


class Raster:
    """One record's raster: what the row stores, before its bounds."""

    __slots__ = ("bands", "epsg", "height", "transform", "width")

    def __init__(self, epsg: int, transform: tuple[float, ...], width: int, height: int, bands: list[tuple[str, int]]):
        self.epsg, self.transform, self.width, self.height, self.bands = epsg, transform, width, height, bands


def _same_numbers(values: list, expected: tuple[float, ...]) -> bool:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    return numbers and tuple(float(v) for v in values) == expected


def _properties_of(doc: dict) -> dict[str, Any]:
    props = doc.get("properties")
    return props if isinstance(props, dict) else {}


def read_item(doc: dict) -> Raster:
    """The raster of a STAC Item; raises RasterProblem."""
    props = _properties_of(doc)
    assets = doc.get("assets")
    if not isinstance(assets, dict):
        raise RasterProblem(Reason.NOT_A_FEATURE, "assets: missing or not an object; a STAC Item lists its files")
    rasters = {k: a for k, a in assets.items() if _is_raster_asset(a)}
    if not rasters:
        raise RasterProblem(Reason.NOT_A_FEATURE, "assets: none is a GeoTIFF with a data role")

    def field(key: str) -> tuple[Any, str]:
        if key in props:
            return props[key], f"properties.{key}"
        seen = {repr(a.get(key)) for a in rasters.values() if key in a}
        for name, a in rasters.items():
            if key in a and len(seen) == 1:
                return a[key], f"assets.{name}.{key}"
        return None, f"properties.{key}"

    crs, crs_where = field("proj:code")
    if crs is None:
        crs, crs_where = field("proj:epsg")
    if crs is None:
        raise RasterProblem(Reason.UNKNOWN_RASTER_CRS, "properties.proj:code: missing (and no proj:epsg)")
    epsg = _epsg_of(crs, crs_where)
    transform = _transform_of(*field("proj:transform"))
    width, height = _shape_of(*field("proj:shape"))
    bands: list[tuple[str, int]] = []
    for asset in rasters.values():
        own_t, own_s = asset.get("proj:transform"), asset.get("proj:shape")
        if own_t is not None and not (isinstance(own_t, list) and _same_numbers(own_t[:6], transform)):
            continue
        if own_s is not None and own_s != [height, width]:
            continue
        bands += [(asset["href"], i) for i in range(_band_count(asset))]
    if not bands:
        raise RasterProblem(
            Reason.BAD_RASTER_SHAPE, "assets: no GeoTIFF asset has the Item's grid (proj:transform, proj:shape)"
        )
    return Raster(epsg, transform, width, height, bands)


def read_reference(doc: dict) -> Raster:
    """The raster of a plain reference event; raises RasterProblem."""
    uri = doc.get("uri")
    if not isinstance(uri, str) or not uri:
        raise RasterProblem(Reason.NOT_A_FEATURE, f"uri: {shown(uri)} is not the URI of a raster file")
    if "crs" not in doc:
        raise RasterProblem(Reason.UNKNOWN_RASTER_CRS, "crs: missing")
    epsg = _epsg_of(doc["crs"], "crs")
    transform = _transform_of(doc.get("transform"), "transform")
    width, height = _shape_of(doc.get("shape"), "shape")
    count = doc.get("bands", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= 65535:
        raise RasterProblem(Reason.BAD_RASTER_SHAPE, f"bands: {shown(count)} is not a number of bands (1..65535)")
    return Raster(epsg, transform, width, height, [(uri, i) for i in range(count)])


def footprint(ring: np.ndarray, bounds: np.ndarray) -> shapely.Geometry:
    """The footprint in WGS84: the transformed outline, cut at ±180 into a MultiPolygon when it
    crosses (RFC 7946's way, so that plain coordinates read it right); for a raster that holds a
    pole, the band of latitudes it covers from -180 to 180."""
    xmin, ymin, xmax, ymax = bounds
    if xmin == -180.0 and xmax == 180.0 and (ymax == 90.0 or ymin == -90.0):
        return shapely.box(-180.0, ymin, 180.0, ymax)
    lon = np.unwrap(ring[:, 0], period=360.0)
    shape = shapely.make_valid(shapely.Polygon(np.column_stack([lon, ring[:, 1]])))
    if -180.0 <= lon.min() and lon.max() <= 180.0:
        return shape
    pieces = []
    for shift in (-360.0, 0.0, 360.0):
        piece = shapely.clip_by_rect(shapely.transform(shape, lambda xy, s=shift: xy + [s, 0.0]), -180, -90, 180, 90)
        pieces += [p for p in shapely.get_parts(piece) if isinstance(p, shapely.Polygon) and not p.is_empty]
    return shapely.MultiPolygon(pieces)


class StacFormat(InputFormat):
    names: ClassVar[tuple[str, ...]] = ("stac",)
    first_bytes: ClassVar[tuple[int, ...]] = (ord("{"),)
    described: ClassVar[str] = "a STAC Item or raster reference (a JSON object)"
    first_bytes_shown: ClassVar[tuple[str, ...]] = ("'{'",)
    refused_first_bytes: ClassVar[dict[int, tuple[Reason, str]]] = {
        ord("["): (Reason.NOT_A_JSON_OBJECT, "a JSON array is not a STAC Item (an object)")
    }

    @classmethod
    def active(cls, contract: Contract) -> bool:
        return "stac" in contract.formats

    def decode(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        n = len(values)
        rejects = out.rejects
        fids: list[Any] = [None] * n
        props: dict[str, list[Any]] = {k: [None] * n for k in self.property_types}
        rasters: dict[int, Raster] = {}
        for i in rows.tolist():
            raw = values[i].as_py()
            doc, problem = _load_json(raw)
            if problem is not None:
                rejects.add(np.array([i]), *problem)
                continue
            if not isinstance(doc, dict):
                rejects.add(np.array([i]), Reason.NOT_A_JSON_OBJECT, "value is not a JSON object")
                continue
            try:
                raster = read_item(doc) if doc.get("type") == "Feature" else read_reference(doc)
                row_props = _properties_of(doc)
                read = {}
                for name, arrow_type in self.property_types.items():
                    value = row_props.get(name)
                    try:
                        read[name] = _coerce_property(value, arrow_type)
                    except (TypeError, ValueError, OverflowError, pa.ArrowInvalid):
                        raise RasterProblem(
                            Reason.PROPERTY_TYPE_MISMATCH, f"properties.{name}: {shown(value)} is not a {arrow_type}"
                        ) from None
            except RasterProblem as p:
                rejects.add(np.array([i]), p.reason, p.detail)
                continue
            fid = doc.get("id")
            fids[i] = str(fid) if isinstance(fid, str | int) and not isinstance(fid, bool) else None
            for name, value in read.items():
                props[name][i] = value
            rasters[i] = raster
        out.feature_ids = pa.array(fids, pa.string())
        out.properties = {k: pa.array(v, self.property_types[k]) for k, v in props.items()}
        self._georeference(rasters, out)

    def _georeference(self, rasters: dict[int, Raster], out: Decoded) -> None:
        """Bounds and footprints, per CRS over the batch; the raster structs of the rows."""
        n = len(out.geoms)
        if out.bounds is None:
            out.bounds = np.full((n, 4), np.nan)
        by_crs: dict[int, list[int]] = {}
        for i, r in rasters.items():
            by_crs.setdefault(r.epsg, []).append(i)
        for epsg, idx in by_crs.items():
            t = np.array([rasters[i].transform for i in idx])
            w = np.array([rasters[i].width for i in idx])
            h = np.array([rasters[i].height for i in idx])
            bounds = wgs84_bounds(t, w, h, epsg)
            rings = envelope_rings(t, w, h)
            from pyproj import Transformer

            lon, lat = Transformer.from_crs(f"EPSG:{epsg}", "EPSG:4326", always_xy=True).transform(
                rings[..., 0], rings[..., 1], errcheck=False
            )
            for j, i in enumerate(idx):
                if not np.isfinite(bounds[j]).all():
                    out.rejects.add(
                        np.array([i]),
                        Reason.REPROJECTION_FAILED,
                        f"the raster's outline in EPSG:{epsg} does not transform to WGS84 (outside the CRS's area)",
                    )
                    continue
                out.bounds[i] = bounds[j]
                out.geoms[i] = footprint(np.column_stack([lon[j], lat[j]]), bounds[j])
                out.srids[i] = _WGS84
        structs: list[dict[str, Any] | None] = [None] * n
        for i, r in rasters.items():
            if not out.rejects.ok[i]:
                continue
            a, b, c, d, e, f = r.transform
            structs[i] = {
                "width": r.width,
                "height": r.height,
                "crs": crs_wkt(r.epsg),
                "scale_x": a,
                "scale_y": e,
                "skew_x": b,
                "skew_y": d,
                # Havasu anchors the grid at the centre of the upper-left cell; STAC at its corner.
                "upper_left_x": c + 0.5 * a + 0.5 * b,
                "upper_left_y": f + 0.5 * d + 0.5 * e,
                "bands": [{"uri": u, "band_number": k} for u, k in r.bands],
            }
        assert self.contract.raster is not None  # the contract requires the column with the format
        out.raster = pa.array(structs, self.contract.arrow_schema.field(self.contract.raster.name).type)
