"""The CRS of a raster in each form the projection extension allows: `proj:code` (any authority
PROJ knows), `proj:epsg`, `proj:wkt2` and `proj:projjson`, the last two as rasterio writes them
for real COGs in a UTM zone next to 180°, a polar stereographic CRS with an EPSG code and one
without; and a CRS PROJ does not read, a reject with PROJ's reason."""

from __future__ import annotations

import copy
import json

import pyproj
import pytest
import rasterio
from rasterio.warp import transform_bounds

from streaming.decode.decoder import REJECT_DETAIL, REJECT_REASON
from streaming.decode.formats.stac_items import RasterProblem, crs_key
from streaming.decode.rejects import Reason
from tests.raster_scenes import SCENES, Scene, item_bytes, stac_item, write_cog
from tests.streaming.decode.formats.test_stac import decode

# Antarctic polar stereographic true at 65°S, centred on 180°: no EPSG code has it.
CUSTOM_POLAR = Scene(
    "ross-sea",
    0,
    -700_000.0,
    -500_000.0,
    4000.0,
    200,
    300,
    proj="+proj=stere +lat_0=-90 +lat_ts=-65 +lon_0=180 +x_0=0 +y_0=0 +datum=WGS84 +units=m +no_defs",
)
BY_NAME = {s.name: s for s in SCENES}
FORMS_SCENES = (BY_NAME["utm60-across"], BY_NAME["arctic-pole"], BY_NAME["utm01-south"], CUSTOM_POLAR)


@pytest.fixture(scope="module")
def cogs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("crs-forms")
    return {s.name: (s, write_cog(s, folder)) for s in FORMS_SCENES}


@pytest.mark.parametrize("form", ["wkt2", "projjson"])
def test_a_crs_as_wkt2_or_projjson_is_read_and_bounds_are_gdals(cogs, form):
    items = [stac_item(scene, cog, crs_as=form) for scene, cog in cogs.values()]
    assert all(i.properties["proj:code"] is None and f"proj:{form}" in i.properties for i in items)
    rows = decode([item_bytes(i) for i in items])
    for (scene, _), row in zip(cogs.values(), rows):
        assert row[REJECT_REASON] is None, row[REJECT_DETAIL]
        got = [row["bbox"][k] for k in ("xmin", "ymin", "xmax", "ymax")]
        assert got == pytest.approx(scene.footprint_bounds(), abs=1e-5), scene.name
        assert pyproj.CRS(row["raster"]["crs"]).equals(pyproj.CRS(scene.crs), ignore_axis_order=True), scene.name
    by_name = {r["scene_id"]: r for r in rows}
    assert by_name["utm60-across"]["bbox"]["xmin"] > by_name["utm60-across"]["bbox"]["xmax"]  # wrapped
    assert by_name["arctic-pole"]["bbox"]["ymax"] == 90.0
    # the edge's point nearest the pole lies between densified points: found all the same
    with rasterio.open(cogs["ross-sea"][1]) as src:
        coarse = transform_bounds(src.crs, "EPSG:4326", *src.bounds, densify_pts=21)
    assert by_name["ross-sea"]["bbox"]["ymin"] < coarse[1] - 5e-4
    # the same scenes stated by code store the same rows (the custom CRS has none)
    coded = decode([item_bytes(stac_item(s, c)) for s, c in list(cogs.values())[:3]])
    for a, b in zip(coded, rows):
        assert (
            a["bbox"] == b["bbox"] and a["geometry"] == b["geometry"] and a["raster"]["width"] == b["raster"]["width"]
        )


@pytest.mark.parametrize(
    "edit, names",
    [
        (lambda p: p.update({"proj:wkt2": 'PROJCRS["nowhere",BASEGEOGCRS["x"]]'}), ["proj:wkt2", "PROJ"]),
        (lambda p: p.update({"proj:wkt2": 32660}), ["proj:wkt2", "32660", "WKT text"]),
        (lambda p: p.update({"proj:projjson": {"type": "ProjectedCRS", "name": "nowhere"}}), ["proj:projjson"]),
        (lambda p: p.update({"proj:projjson": "EPSG:32660"}), ["proj:projjson", "a PROJJSON object"]),
        (lambda p: p.update({"proj:code": "NOWHERE:1"}), ["proj:code", "NOWHERE:1"]),
        (lambda p: p.update({"proj:code": "32660"}), ["proj:code", "AUTHORITY:CODE"]),
    ],
)
def test_a_crs_proj_does_not_read_is_a_reject_with_its_reason(cogs, edit, names):
    scene, cog = cogs["utm60-across"]
    doc = stac_item(scene, cog, crs_as="wkt2").to_dict()
    bad = copy.deepcopy(doc)
    bad["properties"].pop("proj:wkt2")
    edit(bad["properties"])
    good, broken = decode([json.dumps(doc).encode(), json.dumps(bad).encode()])
    assert good[REJECT_REASON] is None
    assert broken[REJECT_REASON] == "unknown_raster_crs"
    assert all(name in broken[REJECT_DETAIL] for name in names), broken[REJECT_DETAIL]


def test_codes_of_other_authorities_and_numbers_name_the_same_crs():
    assert crs_key("epsg:32660", "proj:code", "x") == crs_key(32660, "proj:epsg", "x") == "EPSG:32660"
    assert pyproj.CRS(crs_key("ESRI:54009", "proj:code", "x")).name == "World_Mollweide"
    with pytest.raises(RasterProblem) as bad:
        crs_key(True, "proj:epsg", "properties.proj:epsg")
    assert bad.value.reason == Reason.UNKNOWN_RASTER_CRS and "properties.proj:epsg" in bad.value.detail
