"""STAC Items and raster references into raster rows: the raster struct, the footprint and Havasu's
WGS84 bounds (checked against GDAL's, rasterio's transform_bounds), and the rejects."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pyarrow as pa
import pytest
import shapely

from streaming.contract import ContractError, load_contract, parse_contract
from streaming.decode.decoder import REJECT_DETAIL, REJECT_REASON, Decoder
from tests.raster_scenes import SCENES, item_bytes, stac_item, write_cog
from tests.streaming.read.test_query import _kafka_batch

CONTRACT_PATH = Path(__file__).parents[4] / "schemas" / "scenes.json"
CONTRACT = load_contract(CONTRACT_PATH)


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cogs")
    return {s.name: (s, stac_item(s, write_cog(s, folder))) for s in SCENES}


def decode(values: list[bytes]) -> list[dict]:
    keys = [f"k{i}".encode() for i in range(len(values))]
    return pa.Table.from_batches([Decoder(CONTRACT).decode(_kafka_batch(keys, values))]).to_pylist()


def test_stored_bounds_are_gdal_densified_footprints(items):
    rows = decode([item_bytes(item) for _, item in items.values()])
    for (scene, _), row in zip(items.values(), rows):
        assert row[REJECT_REASON] is None, row[REJECT_DETAIL]
        got = [row["bbox"][k] for k in ("xmin", "ymin", "xmax", "ymax")]
        # GDAL refines the extremes it finds between densified points; within ~1 m of each other
        assert got == pytest.approx(scene.footprint_bounds(), abs=1e-5), scene.name
    by_name = {r["scene_id"]: r for r in rows}
    assert by_name["utm60-across"]["bbox"]["xmin"] > by_name["utm60-across"]["bbox"]["xmax"]  # wrapped
    assert by_name["utm60-south-across"]["bbox"]["xmin"] > by_name["utm60-south-across"]["bbox"]["xmax"]
    north = by_name["arctic-pole"]["bbox"]
    assert (north["xmin"], north["xmax"], north["ymax"]) == (-180.0, 180.0, 90.0)
    south = by_name["antarctic-pole"]["bbox"]
    assert (south["xmin"], south["xmax"], south["ymin"]) == (-180.0, 180.0, -90.0)


def test_a_row_holds_havasus_raster_and_the_items_properties(items):
    scene, item = items["utm60-west"]
    (row,) = decode([item_bytes(item)])
    raster = row["raster"]
    assert (raster["width"], raster["height"]) == (scene.width, scene.height)
    assert "32660" in raster["crs"] and raster["crs"].startswith("PROJCRS")
    # Havasu anchors the grid at the centre of the upper-left cell
    assert raster["upper_left_x"] == scene.left + scene.pixel / 2
    assert raster["upper_left_y"] == scene.top - scene.pixel / 2
    assert (raster["scale_x"], raster["scale_y"], raster["skew_x"], raster["skew_y"]) == (
        scene.pixel,
        -scene.pixel,
        0.0,
        0.0,
    )
    href = item.assets["image"].href
    assert raster["bands"] == [{"uri": href, "band_number": 0}, {"uri": href, "band_number": 1}]  # no thumbnail
    assert row["platform"] == "test-sat" and row["cloud_cover"] == 12.5
    assert row["acquired"].isoformat() == "2026-06-01T10:30:00+00:00"
    footprint = shapely.from_wkb(row["geometry"])
    assert footprint.geom_type == "Polygon" and footprint.is_valid
    across = shapely.from_wkb(decode([item_bytes(items["utm60-across"][1])])[0]["geometry"])
    assert across.geom_type == "MultiPolygon" and across.is_valid  # cut at 180
    assert across.bounds[0] == -180.0 and across.bounds[2] == 180.0
    xmin, ymin, xmax, ymax = footprint.bounds
    assert (xmin, ymin, xmax, ymax) == pytest.approx(scene.footprint_bounds(), abs=1e-5)


def test_a_plain_raster_reference_is_a_raster_too():
    event = {
        "id": "drone-7",
        "uri": "s3://tiles/drone-7.tif",
        "crs": "EPSG:32631",
        "transform": [0.05, 0, 448_000.0, 0, -0.05, 5_411_000.0],
        "shape": [4000, 6000],
        "bands": 3,
        "properties": {"platform": "drone", "datetime": "2026-06-02T08:00:00Z"},
    }
    (row,) = decode([json.dumps(event).encode()])
    assert row[REJECT_REASON] is None, row[REJECT_DETAIL]
    assert row["scene_id"] == "drone-7" and row["platform"] == "drone"
    assert [b["band_number"] for b in row["raster"]["bands"]] == [0, 1, 2]
    assert row["raster"]["width"] == 6000 and row["raster"]["height"] == 4000
    assert 2.0 < row["bbox"]["xmin"] < row["bbox"]["xmax"] < 2.5 and 48.8 < row["bbox"]["ymin"] < 48.9


def _broken(item, edit) -> bytes:
    doc = copy.deepcopy(item.to_dict())
    edit(doc)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "edit, reason, names",
    [
        (lambda d: d["properties"].pop("proj:transform"), "raster_without_transform", ["proj:transform", "missing"]),
        (
            lambda d: d["properties"].update({"proj:transform": [1, 0, 0, 0, "x", 0]}),
            "raster_without_transform",
            ["proj:transform"],
        ),
        (
            lambda d: d["properties"].update({"proj:transform": [0, 0, 5, 0, 0, 6]}),
            "raster_without_transform",
            ["singular"],
        ),
        (lambda d: d["properties"].update({"proj:code": "EPSG:999999"}), "unknown_raster_crs", ["EPSG:999999"]),
        (lambda d: d["properties"].update({"proj:code": "ESRI:54009"}), "unknown_raster_crs", ["ESRI:54009"]),
        (lambda d: d["properties"].pop("proj:code"), "unknown_raster_crs", ["proj:code"]),
        (lambda d: d["properties"].update({"proj:shape": [100]}), "bad_raster_shape", ["proj:shape", "[100]"]),
        (lambda d: d["properties"].update({"proj:shape": [0, 10]}), "bad_raster_shape", ["proj:shape"]),
        (lambda d: d["properties"].update({"proj:shape": [10.5, 10]}), "bad_raster_shape", ["proj:shape"]),
        (
            lambda d: d["properties"].update({"eo:cloud_cover": "cloudy"}),
            "property_type_mismatch",
            ["eo:cloud_cover", "cloudy"],
        ),
        (lambda d: d.pop("assets"), "not_a_feature", ["assets"]),
        (
            lambda d: d["assets"]["image"].update({"proj:transform": ["a"]}),
            "bad_raster_shape",
            ["no GeoTIFF asset has the Item's grid"],
        ),
    ],
)
def test_bad_items_are_rejects_with_reasons(items, edit, reason, names):
    _, item = items["paris"]
    rows = decode([item_bytes(item), _broken(item, edit), item_bytes(item)])
    assert rows[0][REJECT_REASON] is None and rows[2][REJECT_REASON] is None
    assert rows[1][REJECT_REASON] == reason, rows[1][REJECT_DETAIL]
    for name in names:
        assert name in rows[1][REJECT_DETAIL]
    assert rows[1]["raster"] is None and rows[1]["bbox"] is None


def test_rasters_in_lon_lat_across_180_and_over_the_whole_world():
    def reference(name, transform, shape):
        return {"id": name, "uri": f"s3://{name}.tif", "crs": "EPSG:4326", "transform": transform, "shape": shape}

    world, across = decode(
        [
            json.dumps(reference("world", [0.5, 0, -180, 0, -0.5, 90], [360, 720])).encode(),
            json.dumps(reference("across", [0.1, 0, 170, 0, -0.1, 10], [100, 200])).encode(),
        ]
    )
    assert [world["bbox"][k] for k in ("xmin", "ymin", "xmax", "ymax")] == [-180.0, -90.0, 180.0, 90.0]
    assert [across["bbox"][k] for k in ("xmin", "ymin", "xmax", "ymax")] == pytest.approx([170, 0, -170, 10])
    cut = shapely.from_wkb(across["geometry"])
    assert cut.geom_type == "MultiPolygon" and cut.area == pytest.approx(200.0)


def test_a_shape_far_outside_the_crs_is_a_reprojection_failure():
    event = {
        "id": "lost",
        "uri": "s3://x.tif",
        "crs": "EPSG:32631",
        "transform": [1e9, 0, 1e15, 0, -1e9, 1e15],
        "shape": [10, 10],
    }
    (row,) = decode([json.dumps(event).encode()])
    assert row[REJECT_REASON] == "reprojection_failed", row[REJECT_DETAIL]


def test_the_contract_of_a_raster_table():
    raw = json.loads(CONTRACT_PATH.read_text())
    assert CONTRACT.raster is not None and CONTRACT.raster.rows == "item"
    for edit, message in [
        (lambda r: r.pop("raster"), "raster: missing"),
        (lambda r: r["raster"].update({"rows": "asset"}), "raster.rows"),
        (lambda r: r.update({"formats": ["stac", "geojson"]}), "formats"),
        (lambda r: r["geometry"].update({"crs": "EPSG:3857", "antimeridian": "planar"}), "EPSG:4326"),
        (lambda r: r["raster"].update({"name": "bbox"}), "raster.name"),
        (lambda r: r["raster"].update({"id": 3}), "raster.id"),
    ]:
        broken = copy.deepcopy(raw)
        edit(broken)
        with pytest.raises(ContractError, match=message):
            parse_contract(broken)


def test_raster_ids_are_those_iceberg_assigns():
    from pyiceberg.schema import assign_fresh_schema_ids

    from streaming.contract import check_fresh_ids

    check_fresh_ids(CONTRACT)
    assert assign_fresh_schema_ids(CONTRACT.iceberg_schema) == CONTRACT.iceberg_schema
    assert CONTRACT.bbox_field_ids == {"xmin": 8, "ymin": 9, "xmax": 10, "ymax": 11}
