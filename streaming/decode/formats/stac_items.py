"""What a STAC Item (or a plain raster reference) says of its rasters: their CRS, geotransform,
shape and band files, read from one parsed document; every problem a RasterProblem naming the field.

The projection extension's fields (https://github.com/stac-extensions/projection) give the grid:
the CRS as `proj:code` ("EPSG:32660", or any "AUTHORITY:CODE" PROJ knows), `proj:epsg` (32660),
`proj:wkt2` (WKT2 text) or `proj:projjson` (a PROJJSON object), the first of them that is set and
not null; `proj:transform` (rasterio's order a, b, c, d, e, f, optionally followed by 0, 0, 1) and
`proj:shape` ([height, width]). An asset may state its own (a 20 m band of a 10 m scene): read as
one row per Item, the Item's own fields win and an asset on another grid is not one of its bands;
read as one row per asset, the asset's fields override the Item's, the CRS fields as a group.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from typing import Any

from streaming.decode.rejects import Reason, shown

# Media types of the assets that are rasters, and the roles that make one a data file (a
# thumbnail, an overview or a metadata file has other roles, or another media type).
RASTER_MEDIA = ("image/tiff", "image/vnd.stac.geotiff", "application/x-geotiff")
DATA_ROLES = ("data", "visual", "reflectance")
CRS_FIELDS = ("proj:code", "proj:epsg", "proj:wkt2", "proj:projjson")
_MAX_SIDE = 2**31 - 1
_AUTHORITY_CODE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*:[A-Za-z0-9_.-]+$")


class RasterProblem(Exception):
    def __init__(self, reason: Reason, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@lru_cache(maxsize=256)
def read_crs(key: str) -> Any:
    """The pyproj CRS of a key (an "AUTHORITY:CODE", WKT, or PROJJSON text), or the text of pyproj's
    refusal: CRSs are few in a stream, so each is read once."""
    from pyproj import CRS

    try:
        if key.startswith("{"):
            return CRS.from_json(key)
        return CRS.from_user_input(key)
    except Exception as exc:  # noqa: BLE001 - pyproj raises CRSError, or others on odd input
        return str(exc) or type(exc).__name__


@lru_cache(maxsize=256)
def crs_wkt(key: str) -> str:
    """The WKT of a CRS `read_crs` read: Havasu stores a raster's CRS as WKT."""
    return str(read_crs(key).to_wkt())


def _known(key: str, named: str, where: str) -> str:
    crs = read_crs(key)
    if isinstance(crs, str):
        raise RasterProblem(Reason.UNKNOWN_RASTER_CRS, f"{where}: {named} is not a CRS known to PROJ ({crs[:200]})")
    return key


def crs_key(value: Any, field: str, where: str) -> str:
    """The key of the CRS a field states (the same CRS stated alike has the same key)."""
    if field in ("proj:code", "proj:epsg", "crs") and isinstance(value, int) and not isinstance(value, bool):
        if not 0 < value < 2**31:
            raise RasterProblem(Reason.UNKNOWN_RASTER_CRS, f"{where}: {value} is not an EPSG code")
        return _known(f"EPSG:{value}", f"EPSG:{value}", where)
    if field in ("proj:code", "proj:epsg", "crs") and isinstance(value, str) and _AUTHORITY_CODE.match(value):
        authority, code = value.split(":", 1)
        return _known(f"{authority.upper()}:{code}", shown(value), where)
    if field in ("proj:wkt2", "crs") and isinstance(value, str) and value.strip():
        return _known(value.strip(), "the text", where)
    if field in ("proj:projjson", "crs") and isinstance(value, dict):
        return _known(json.dumps(value, sort_keys=True), "the object", where)
    expected = {
        "proj:code": "'AUTHORITY:CODE' (EPSG:32660)",
        "proj:epsg": "an EPSG code",
        "proj:wkt2": "WKT text",
        "proj:projjson": "a PROJJSON object",
    }.get(field, "an 'AUTHORITY:CODE', a WKT text or a PROJJSON object")
    raise RasterProblem(Reason.UNKNOWN_RASTER_CRS, f"{where}: {shown(value)} is not {expected}")


def transform_of(value: Any, where: str) -> tuple[float, ...]:
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


def shape_of(value: Any, where: str) -> tuple[int, int]:
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


def band_count(asset: dict) -> int:
    for key in ("raster:bands", "eo:bands", "bands"):
        listed = asset.get(key)
        if isinstance(listed, list) and listed:
            return len(listed)
    return 1


def is_raster_asset(asset: Any) -> bool:
    """A GeoTIFF (by media type, or by a .tif href when it has none) whose roles, if it states
    any, include a data role."""
    if not isinstance(asset, dict):
        return False
    href = asset.get("href")
    media = str(asset.get("type", "")).split(";")[0].strip().lower()
    roles = asset.get("roles")
    if isinstance(roles, list) and roles and not any(r in DATA_ROLES for r in roles):
        return False
    by_name = not media and isinstance(href, str) and href.lower().endswith((".tif", ".tiff"))
    return media in RASTER_MEDIA or by_name


def raster_asset_keys(doc: Any) -> list[str]:
    """The keys of an Item's raster assets, in its order; none for anything else."""
    if not isinstance(doc, dict) or doc.get("type") != "Feature" or not isinstance(doc.get("assets"), dict):
        return []
    return [str(k) for k, a in doc["assets"].items() if is_raster_asset(a)]


class Raster:
    """One row's raster: what the row stores, before its bounds. `crs` is a `read_crs` key."""

    __slots__ = ("bands", "crs", "height", "transform", "width")

    def __init__(self, crs: str, transform: tuple[float, ...], width: int, height: int, bands: list[tuple[str, int]]):
        self.crs, self.transform, self.width, self.height, self.bands = crs, transform, width, height, bands


def _same_numbers(values: list, expected: tuple[float, ...]) -> bool:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    return numbers and tuple(float(v) for v in values) == expected


def properties_of(doc: dict) -> dict[str, Any]:
    props = doc.get("properties")
    return props if isinstance(props, dict) else {}


def _crs_in(fields: dict, where: str) -> str | None:
    """The CRS key of the first CRS field set (not null) in a properties or asset object."""
    for key in CRS_FIELDS:
        if fields.get(key) is not None:
            return crs_key(fields[key], key, f"{where}{key}")
    return None


def _assets_of(doc: dict) -> dict:
    assets = doc.get("assets")
    if not isinstance(assets, dict):
        raise RasterProblem(Reason.NOT_A_FEATURE, "assets: missing or not an object; a STAC Item lists its files")
    return assets


def read_item(doc: dict) -> Raster:
    """The raster of a STAC Item, its bands the raster assets on the Item's grid."""
    props = properties_of(doc)
    rasters = {k: a for k, a in _assets_of(doc).items() if is_raster_asset(a) and isinstance(a.get("href"), str)}
    if not rasters:
        raise RasterProblem(Reason.NOT_A_FEATURE, "assets: none is a GeoTIFF with a data role")

    def field(key: str) -> tuple[Any, str]:
        if props.get(key) is not None:
            return props[key], f"properties.{key}"
        seen = {repr(a.get(key)) for a in rasters.values() if a.get(key) is not None}
        for name, a in rasters.items():
            if a.get(key) is not None and len(seen) == 1:
                return a[key], f"assets.{name}.{key}"
        return None, f"properties.{key}"

    crs = None
    for key in CRS_FIELDS:
        value, where = field(key)
        if value is not None:
            crs = crs_key(value, key, where)
            break
    if crs is None:
        raise RasterProblem(
            Reason.UNKNOWN_RASTER_CRS, "properties.proj:code: missing (and no proj:epsg, proj:wkt2 or proj:projjson)"
        )
    transform = transform_of(*field("proj:transform"))
    width, height = shape_of(*field("proj:shape"))
    bands: list[tuple[str, int]] = []
    for asset in rasters.values():
        own_t, own_s = asset.get("proj:transform"), asset.get("proj:shape")
        if own_t is not None and not (isinstance(own_t, list) and _same_numbers(own_t[:6], transform)):
            continue
        if own_s is not None and own_s != [height, width]:
            continue
        bands += [(asset["href"], i) for i in range(band_count(asset))]
    if not bands:
        raise RasterProblem(
            Reason.BAD_RASTER_SHAPE, "assets: no GeoTIFF asset has the Item's grid (proj:transform, proj:shape)"
        )
    return Raster(crs, transform, width, height, bands)


def read_asset(doc: dict, key: str) -> Raster:
    """The raster of one asset of an Item: its own projection fields over the Item's."""
    asset = _assets_of(doc)[key]
    where = f"assets.{key}."
    href = asset.get("href")
    if not isinstance(href, str) or not href:
        raise RasterProblem(Reason.NOT_A_FEATURE, f"{where}href: {shown(href)} is not the URI of a raster file")
    props = properties_of(doc)
    crs = _crs_in(asset, where) or _crs_in(props, "properties.")
    if crs is None:
        raise RasterProblem(
            Reason.UNKNOWN_RASTER_CRS,
            f"{where}proj:code: missing, and the Item has none (no proj:code, proj:epsg, proj:wkt2 or proj:projjson)",
        )

    def field(name: str) -> tuple[Any, str]:
        if asset.get(name) is not None:
            return asset[name], f"{where}{name}"
        return props.get(name), f"properties.{name}"

    transform = transform_of(*field("proj:transform"))
    width, height = shape_of(*field("proj:shape"))
    return Raster(crs, transform, width, height, [(href, i) for i in range(band_count(asset))])


def read_reference(doc: dict) -> Raster:
    """The raster of a plain reference event."""
    uri = doc.get("uri")
    if not isinstance(uri, str) or not uri:
        raise RasterProblem(Reason.NOT_A_FEATURE, f"uri: {shown(uri)} is not the URI of a raster file")
    if doc.get("crs") is None:
        raise RasterProblem(Reason.UNKNOWN_RASTER_CRS, "crs: missing")
    crs = crs_key(doc["crs"], "crs", "crs")
    transform = transform_of(doc.get("transform"), "transform")
    width, height = shape_of(doc.get("shape"), "shape")
    count = doc.get("bands", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= 65535:
        raise RasterProblem(Reason.BAD_RASTER_SHAPE, f"bands: {shown(count)} is not a number of bands (1..65535)")
    return Raster(crs, transform, width, height, [(uri, i) for i in range(count)])
