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
from pystac.extensions.projection import ProjectionExtension
from rasterio.transform import Affine
from rasterio.warp import transform_bounds


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

    @property
    def transform(self) -> Affine:
        return Affine(self.pixel, 0.0, self.left, 0.0, -self.pixel, self.top)

    def footprint_bounds(self) -> tuple[float, float, float, float]:
        """WGS84 bounds as GDAL computes them: rasterio's transform_bounds, densified."""
        right, bottom = self.left + self.width * self.pixel, self.top - self.height * self.pixel
        return transform_bounds(f"EPSG:{self.epsg}", "EPSG:4326", self.left, bottom, right, self.top, densify_pts=21)


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
        "crs": f"EPSG:{scene.epsg}",
        "transform": scene.transform,
    }
    with rasterio.open(path, "w", **profile) as dst:
        for b in range(1, bands + 1):
            dst.write(data, b)
    return path


def stac_item(scene: Scene, cog: Path, cloud_cover: float = 12.5) -> pystac.Item:
    """The Item of a COG, its projection fields read back from the file."""
    with rasterio.open(cog) as src:
        transform, shape, epsg, count = src.transform, [src.height, src.width], src.crs.to_epsg(), src.count
        left, bottom, right, top = src.bounds
    lon_lat = transform_bounds(f"EPSG:{epsg}", "EPSG:4326", left, bottom, right, top, densify_pts=21)
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
    proj.code = f"EPSG:{epsg}"
    proj.transform = list(transform)[:6]
    proj.shape = shape
    return item


def item_bytes(item: pystac.Item) -> bytes:
    return json.dumps(item.to_dict()).encode()
