"""Rasters from STAC Items and plain raster references (contract format "stac").

A STAC Item is a GeoJSON Feature whose `assets` point at the files of a scene (Cloud Optimized
GeoTIFFs) and whose projection extension says how its pixel grid sits on the Earth (what each
field may be: streaming/decode/formats/stac_items.py). A plain raster reference says the same in
fewer words: `{"id": .., "uri": "s3://../scene.tif", "crs": "EPSG:32660", "transform": [..],
"shape": [h, w], "bands": 3, "properties": {..}}`.

A row is a raster in Havasu's model with out-db bands (width, height, CRS as WKT, the
geotransform anchored at the centre of the upper-left cell, and its bands: uri, 0-based
band_number), its footprint in WGS84 as the geometry and its WGS84 bounds
(streaming/kernels/raster_bounds.py: the outline densified, wrapped across ±180, a pole giving
every longitude) as the covering. With `raster.rows` "item" each record is one row, its bands
those of the raster assets on the Item's grid; with "asset" each raster asset of an Item is a row
of its own (`explode`: the record's Kafka fields repeated over them), on its own grid, the
`asset.key` source its key. Properties feed the contract's `properties.<name>` columns (read
once per Item, repeated over its rows), the Item's id the `id` ones.

Items are read one by one (json.loads; a scene is one event among few), their bounds computed
over the batch, per CRS, with numpy.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import shapely

from streaming.contract import Contract
from streaming.decode.formats.base import Decoded, Exploded, InputFormat
from streaming.decode.formats.geojson import _load_json
from streaming.decode.formats.stac_items import (
    Raster,
    RasterProblem,
    crs_wkt,
    properties_of,
    raster_asset_keys,
    read_asset,
    read_crs,
    read_item,
    read_reference,
)
from streaming.decode.json_values import ValueProblem, coerce
from streaming.decode.rejects import Reason
from streaming.kernels.raster_bounds import envelope_rings, wgs84_bounds

_WGS84 = 4326


@lru_cache(maxsize=256)
def _to_wgs84(key: str) -> Any:
    from pyproj import Transformer

    return Transformer.from_crs(read_crs(key), "EPSG:4326", always_xy=True)


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

    def explode(self, values: pa.Array, live: np.ndarray) -> Exploded | None:
        """One row per raster asset of each Item (`raster.rows` "asset"); anything else, an Item
        without raster assets included, one row, which `decode` reads or rejects."""
        if self.contract.raster is None or self.contract.raster.rows != "asset":
            return None
        n = len(values)
        docs: list[Any] = [None] * n
        problems: list[tuple[Reason, str] | None] = [None] * n
        counts = np.ones(n, dtype=np.int64)
        keys: list[list[str | None]] = [[None]] * n
        for i in np.flatnonzero(live).tolist():
            raw = values[i].as_py()
            if raw[:1] != b"{" and raw.lstrip(b" \t\r\n")[:1] != b"{":
                continue  # not this format's: the decoder says why
            docs[i], problems[i] = _load_item(raw)
            assets = raster_asset_keys(docs[i])
            if assets:
                keys[i], counts[i] = list(assets), len(assets)
        parents = np.repeat(np.arange(n), counts)
        parts = [k for record in keys for k in record]
        return Exploded(parents=parents, docs=docs, problems=problems, parts=parts)

    def decode(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        exploded = out.exploded
        n = len(values)
        rejects = out.rejects
        if exploded is None:
            # one row per record: the record is its own parent
            parents, parts = np.arange(n), None
            docs: list[Any] = [None] * n
            problems: list[tuple[Reason, str] | None] = [None] * n
            for i in rows.tolist():
                docs[i], problems[i] = _load_item(values[i].as_py())
        else:
            parents, parts, docs, problems = exploded.parents, exploded.parts, exploded.docs, exploded.problems
        records = len(docs)
        fids: list[Any] = [None] * records
        props: dict[str, list[Any]] = {k: [None] * records for k in self.property_types}
        rasters: dict[int, Raster] = {}
        # the rows of one record are consecutive: read the record once, at its first row
        record_rows = np.split(rows, np.flatnonzero(np.diff(parents[rows])) + 1) if rows.size else []
        for mine in record_rows:
            p = int(parents[mine[0]])
            doc = docs[p]
            problem = problems[p]
            if problem is not None:
                rejects.add(mine, problem[0], problem[1])
                continue
            if not isinstance(doc, dict):
                rejects.add(mine, Reason.NOT_A_JSON_OBJECT, "value is not a JSON object")
                continue
            try:
                read = self._properties(doc)
            except RasterProblem as bad:
                rejects.add(mine, bad.reason, bad.detail)
                continue
            fid = doc.get("id")
            fids[p] = str(fid) if isinstance(fid, str | int) and not isinstance(fid, bool) else None
            for name, value in read.items():
                props[name][p] = value
            for i in mine.tolist():
                part = None if parts is None else parts[i]
                try:
                    if doc.get("type") != "Feature":
                        rasters[i] = read_reference(doc)
                    elif part is not None:
                        rasters[i] = read_asset(doc, part)
                    else:
                        rasters[i] = read_item(doc)
                except RasterProblem as bad:
                    rejects.add(np.array([i]), bad.reason, bad.detail)
        take = None if exploded is None else pa.array(parents)
        ids = pa.array(fids, pa.string())
        out.feature_ids = ids if take is None else ids.take(take)
        for name, values_of in props.items():
            column = pa.array(values_of, self.property_types[name])
            out.properties[name] = column if take is None else column.take(take)
        self._georeference(rasters, out)

    def _properties(self, doc: dict) -> dict[str, Any]:
        """The record's properties the contract reads, each as its column's type."""
        row_props = properties_of(doc)
        read = {}
        for name, arrow_type in self.property_types.items():
            try:
                read[name] = coerce(row_props.get(name), arrow_type, f"properties.{name}")
            except ValueProblem as problem:
                raise RasterProblem(Reason.PROPERTY_TYPE_MISMATCH, str(problem)) from None
        return read

    def _georeference(self, rasters: dict[int, Raster], out: Decoded) -> None:
        """Bounds and footprints, per CRS over the batch; the raster structs of the rows."""
        n = len(out.geoms)
        if out.bounds is None:
            out.bounds = np.full((n, 4), np.nan)
        by_crs: dict[str, list[int]] = {}
        for i, r in rasters.items():
            by_crs.setdefault(r.crs, []).append(i)
        for key, idx in by_crs.items():
            t = np.array([rasters[i].transform for i in idx])
            w = np.array([rasters[i].width for i in idx])
            h = np.array([rasters[i].height for i in idx])
            crs = read_crs(key)
            bounds = wgs84_bounds(t, w, h, crs)
            rings = envelope_rings(t, w, h)
            lon, lat = _to_wgs84(key).transform(rings[..., 0], rings[..., 1], errcheck=False)
            named = key if len(key) < 40 else str(crs.name)
            for j, i in enumerate(idx):
                if not np.isfinite(bounds[j]).all():
                    out.rejects.add(
                        np.array([i]),
                        Reason.REPROJECTION_FAILED,
                        f"the raster's outline in {named} does not transform to WGS84 (outside the CRS's area)",
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
                "crs": crs_wkt(r.crs),
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


# A JSON escape of a UTF-16 surrogate (\ud800-\udfff), in either case.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _load_item(raw: bytes) -> tuple[Any, tuple[Reason, str] | None]:
    """The record's JSON document, or why it is none. A string holding a lone surrogate (JSON lets an
    escape make one) could not be stored in any column or struct field: the record is refused."""
    doc, problem = _load_json(raw)
    if problem is None and _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return None, (
                Reason.MALFORMED_JSON,
                "value holds a string that is not valid Unicode (an escaped lone surrogate)",
            )
    return doc, problem
