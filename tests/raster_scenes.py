"""Scenes of imagery for the raster tests: Cloud Optimized GeoTIFFs written with rasterio, and the
STAC Items (pystac, projection extension) that point at them.

Scenes sit where WGS84 bounds are hard: UTM zones next to 180° (zone 60 north, zone 1 north and
south), a zone-60 scene running across the anti-meridian, and polar stereographic scenes over
each pole and off it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pystac
import rasterio
import shapely
import shapely.geometry
from pystac.extensions.projection import ProjectionExtension
from rasterio.transform import Affine
from rasterio.warp import transform_bounds, transform_geom

# Points per edge of the reference bounds.
FINE = 2001


@dataclass(frozen=True)
class Scene:
    name: str
    epsg: int
    # upper-left corner, pixel size, [height, width]
    left: float
    top: float
    pixel: float
    height: int
    width: int
    # a CRS without an EPSG code, as PROJ text (epsg is then 0)
    proj: str = ""

    @property
    def crs(self) -> str:
        return self.proj or f"EPSG:{self.epsg}"

    @property
    def transform(self) -> Affine:
        return Affine(self.pixel, 0.0, self.left, 0.0, -self.pixel, self.top)

    def footprint_bounds(self) -> tuple[float, float, float, float]:
        """WGS84 bounds as GDAL computes them: rasterio's transform_bounds, densified (finely: with
        21 points an edge's extreme between two of them, a polar scene's point nearest the pole,
        is missed by up to 0.003°)."""
        right, bottom = self.left + self.width * self.pixel, self.top - self.height * self.pixel
        return transform_bounds(self.crs, "EPSG:4326", self.left, bottom, right, self.top, densify_pts=FINE)


SCENES = (
    # UTM 60N: its central meridian is 177°E; at 60°N, 180° lies near easting 667 km
    Scene("utm60-west", 32660, 400_000.0, 6_700_000.0, 1000.0, 100, 150),
    Scene("utm60-across", 32660, 600_000.0, 6_700_000.0, 1000.0, 100, 250),
    # UTM 1N and 1S: central meridian 177°W, the scenes just east of 180°
    Scene("utm01-north", 32601, 420_000.0, 6_650_000.0, 1000.0, 80, 120),
    Scene("utm01-south", 32701, 350_000.0, 8_000_000.0, 500.0, 120, 160),
    Scene("utm60-south-across", 32760, 650_000.0, 5_500_000.0, 800.0, 150, 150),
    # NSIDC polar stereographic, north (EPSG:3413) and south (EPSG:3031)
    Scene("arctic-pole", 3413, -400_000.0, 400_000.0, 2000.0, 400, 400),
    Scene("arctic-off-pole", 3413, 1_500_000.0, -1_000_000.0, 2000.0, 200, 250),
    Scene("antarctic-pole", 3031, -600_000.0, 500_000.0, 5000.0, 220, 240),
    # far from both: Paris in Lambert-93
    Scene("paris", 2154, 640_000.0, 6_870_000.0, 100.0, 200, 300),
)


def write_cog(scene: Scene, folder: Path, bands: int = 2) -> Path:
    path = folder / f"{scene.name}.tif"
    data = (np.arange(scene.height * scene.width, dtype=np.uint16) % 251).reshape(scene.height, scene.width)
    profile = {
        "driver": "COG",
        "width": scene.width,
        "height": scene.height,
        "count": bands,
        "dtype": "uint16",
        "crs": scene.crs,
        "transform": scene.transform,
    }
    with rasterio.open(path, "w", **profile) as dst:
        for b in range(1, bands + 1):
            dst.write(data, b)
    return path


def stac_item(scene: Scene, cog: Path, cloud_cover: float = 12.5, crs_as: str = "code") -> pystac.Item:
    """The Item of a COG, its projection fields read back from the file; its CRS as `proj:code`,
    or (`crs_as`) as `proj:wkt2` or `proj:projjson` with a null code, as the extension allows."""
    with rasterio.open(cog) as src:
        transform, shape, crs, count = src.transform, [src.height, src.width], src.crs, src.count
        left, bottom, right, top = src.bounds
    lon_lat = transform_bounds(crs, "EPSG:4326", left, bottom, right, top, densify_pts=21)
    item = pystac.Item(
        id=scene.name,
        geometry=None,
        bbox=list(lon_lat),
        datetime=datetime(2026, 6, 1, 10, 30, tzinfo=UTC),
        properties={"platform": "test-sat", "eo:cloud_cover": cloud_cover},
    )
    item.add_asset(
        "image",
        pystac.Asset(
            href=cog.as_uri(),
            media_type=pystac.MediaType.COG,
            roles=["data"],
            extra_fields={"raster:bands": [{"data_type": "uint16"}] * count},
        ),
    )
    item.add_asset("thumbnail", pystac.Asset(href=cog.with_suffix(".png").as_uri(), media_type="image/png"))
    proj = ProjectionExtension.ext(item, add_if_missing=True)
    proj.code = f"EPSG:{crs.to_epsg()}" if crs_as == "code" else None
    if crs_as == "wkt2":
        proj.wkt2 = crs.to_wkt(version="WKT2_2019")
    elif crs_as == "projjson":
        proj.projjson = crs.to_dict(projjson=True)
    proj.transform = list(transform)[:6]
    proj.shape = shape
    return item


def item_bytes(item: pystac.Item) -> bytes:
    return json.dumps(item.to_dict()).encode()


def asset_item(scene: Scene, folder: Path) -> tuple[pystac.Item, dict[str, Path]]:
    """An Item of one scene with the assets of a real product: a 2-band COG on the scene's grid
    (the Item's projection fields), a band at half the resolution (its own proj:transform and
    proj:shape), a band whose file is in another CRS (its own proj:wkt2), and what is no raster:
    a thumbnail, a metadata JSON and an overview GeoTIFF (role "overview"). Returns the Item and
    the COG of each raster asset, by asset key."""
    folder.mkdir(parents=True, exist_ok=True)
    coarse = Scene(
        f"{scene.name}-B11",
        scene.epsg,
        scene.left,
        scene.top,
        scene.pixel * 2,
        scene.height // 2,
        scene.width // 2,
        scene.proj,
    )
    item = stac_item(scene, write_cog(scene, folder), cloud_cover=30.0)
    item.assets["B04"] = item.assets.pop("image")
    cogs = {"B04": folder / f"{scene.name}.tif", "B11": write_cog(coarse, folder, bands=1)}
    with rasterio.open(cogs["B11"]) as src:
        own = {"proj:transform": list(src.transform)[:6], "proj:shape": [src.height, src.width]}
    item.add_asset(
        "B11",
        pystac.Asset(href=cogs["B11"].as_uri(), media_type=pystac.MediaType.COG, roles=["data"], extra_fields=own),
    )
    # the same ground in WGS 84 lon / lat (off 180° only), an asset stating its CRS as WKT2 over the Item's code
    west, south, east, north = cog_bounds(cogs["B04"])
    if west < east:
        step = (north - south) / 50
        lonlat = Scene(f"{scene.name}-lonlat", 4326, west, north, step, 50, max(1, round((east - west) / step)))
        cogs["lonlat"] = write_cog(lonlat, folder, bands=1)
        with rasterio.open(cogs["lonlat"]) as src:
            own = {
                "proj:code": None,
                "proj:wkt2": src.crs.to_wkt(version="WKT2_2019"),
                "proj:transform": list(src.transform)[:6],
                "proj:shape": [src.height, src.width],
            }
        lonlat_asset = pystac.Asset(href=cogs["lonlat"].as_uri(), media_type="image/tiff", extra_fields=own)
        item.add_asset("lonlat", lonlat_asset)
    item.add_asset(
        "metadata",
        pystac.Asset(href=(folder / "meta.json").as_uri(), media_type="application/json", roles=["metadata"]),
    )
    item.add_asset(
        "overview",
        pystac.Asset(href=(folder / "overview.tif").as_uri(), media_type=pystac.MediaType.COG, roles=["overview"]),
    )
    return item, cogs


def cog_bounds(cog: Path) -> tuple[float, float, float, float]:
    """A file's WGS84 bounds as GDAL computes them (rasterio's transform_bounds, densified)."""
    with rasterio.open(cog) as src:
        return transform_bounds(src.crs, "EPSG:4326", *src.bounds, densify_pts=FINE)


def cog_footprint(cog: Path) -> shapely.Geometry:
    """GDAL's footprint of a file: its outline densified and cut at ±180; one holding a pole is
    the band of latitudes it covers."""
    xmin, ymin, xmax, ymax = cog_bounds(cog)
    if xmin == -180.0 and xmax == 180.0:
        return shapely.box(-180.0, ymin, 180.0, ymax)
    with rasterio.open(cog) as src:
        outline = shapely.segmentize(shapely.box(*src.bounds), abs(src.transform.a))
        cut = transform_geom(src.crs, "EPSG:4326", shapely.geometry.mapping(outline), antimeridian_cutting=True)
    return shapely.geometry.shape(cut)


def window_boxes(window: tuple[float, float, float, float]) -> list[shapely.Geometry]:
    """A window as plain boxes: one across 180° is two."""
    xmin, ymin, xmax, ymax = window
    if xmin <= xmax:
        return [shapely.box(xmin, ymin, xmax, ymax)]
    return [shapely.box(xmin, ymin, 180.0, ymax), shapely.box(-180.0, ymin, xmax, ymax)]
