"""STAC Items and raster references into raster rows: the raster struct, the footprint and Havasu's
WGS84 bounds (checked against GDAL's, rasterio's transform_bounds), and the rejects."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pyarrow as pa
import pyproj
import pytest
import rasterio
import shapely

from streaming.contract import ContractError, load_contract, parse_contract
from streaming.decode.decoder import REJECT_DETAIL, REJECT_REASON, Decoder
from tests.raster_scenes import SCENES, asset_item, cog_bounds, item_bytes, stac_item, write_cog
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
        (lambda d: d["properties"].update({"proj:code": "ESRI:999999"}), "unknown_raster_crs", ["ESRI:999999"]),
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
        (lambda r: r["raster"].update({"rows": "band"}), "raster.rows"),
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


# One row per raster asset (`raster.rows` "asset").
ASSETS_CONTRACT = load_contract(CONTRACT_PATH.parent / "scene_assets.json")


def decode_assets(values: list[bytes]) -> list[dict]:
    keys = [f"k{i}".encode() for i in range(len(values))]
    return pa.Table.from_batches([Decoder(ASSETS_CONTRACT).decode(_kafka_batch(keys, values))]).to_pylist()


@pytest.fixture(scope="module")
def asset_items(tmp_path_factory):
    folder = tmp_path_factory.mktemp("assets")
    by_name = {s.name: s for s in SCENES}
    return {name: asset_item(by_name[name], folder / name) for name in ("utm01-north", "utm60-across", "arctic-pole")}


def test_an_item_makes_a_row_per_raster_asset_on_its_own_grid(asset_items):
    item, cogs = asset_items["utm01-north"]
    rows = decode_assets([item_bytes(item), item_bytes(asset_items["arctic-pole"][0])])
    assert [r[REJECT_DETAIL] for r in rows] == [None] * len(rows)
    mine = [r for r in rows if r["scene_id"] == "utm01-north"]
    # the thumbnail, the metadata JSON and the overview are no rows
    assert [r["asset"] for r in mine] == ["B04", "B11", "lonlat"] == list(cogs)
    assert {r["_source_offset"] for r in mine} == {0}  # one Kafka record
    for row in mine:
        cog = cogs[row["asset"]]
        with rasterio.open(cog) as src:
            assert (row["raster"]["width"], row["raster"]["height"]) == (src.width, src.height)
            assert row["raster"]["scale_x"] == src.transform.a
            assert [b["uri"] for b in row["raster"]["bands"]] == [cog.as_uri()] * src.count
            assert pyproj.CRS(row["raster"]["crs"]) == pyproj.CRS(src.crs.to_wkt())
        got = [row["bbox"][k] for k in ("xmin", "ymin", "xmax", "ymax")]
        assert got == pytest.approx(cog_bounds(cog), abs=1e-5), row["asset"]
        # the Item's properties, repeated
        assert (row["platform"], row["cloud_cover"]) == ("test-sat", 30.0)
        assert row["acquired"].isoformat() == "2026-06-01T10:30:00+00:00"
    assert [b["band_number"] for b in mine[0]["raster"]["bands"]] == [0, 1]
    assert "WGS 84" in mine[2]["raster"]["crs"] and "UTM" not in mine[2]["raster"]["crs"]  # the asset's own CRS
    polar = [r for r in rows if r["scene_id"] == "arctic-pole"]
    assert [r["asset"] for r in polar] == list(asset_items["arctic-pole"][1])
    assert all(r["bbox"]["xmin"] == -180.0 and r["bbox"]["ymax"] == 90.0 for r in polar)


@pytest.mark.parametrize(
    "edit, asset, reason, names",
    [
        (
            lambda d: d["assets"]["B11"].update({"proj:transform": [1, 0, 0, 0, "x", 0]}),
            "B11",
            "raster_without_transform",
            ["assets.B11.proj:transform"],
        ),
        (lambda d: d["assets"]["B11"].update({"proj:shape": [0, 5]}), "B11", "bad_raster_shape", ["assets.B11"]),
        (
            lambda d: d["assets"]["lonlat"].update({"proj:wkt2": 'PROJCRS["nowhere",NOPE[]]'}),
            "lonlat",
            "unknown_raster_crs",
            ["assets.lonlat.proj:wkt2"],
        ),
        (lambda d: d["assets"]["B04"].pop("href"), "B04", "not_a_feature", ["assets.B04.href"]),
        (
            lambda d: d["assets"]["B04"].update({"proj:code": "EPSG:999999"}),
            "B04",
            "unknown_raster_crs",
            ["assets.B04.proj:code", "EPSG:999999"],
        ),
    ],
)
def test_a_bad_asset_is_a_reject_and_its_siblings_land(asset_items, edit, asset, reason, names):
    item, _ = asset_items["utm01-north"]
    rows = decode_assets([_broken(item, edit)])
    by_asset = {r["asset"]: r for r in rows}
    assert list(by_asset) == ["B04", "B11", "lonlat"]
    bad = by_asset.pop(asset)
    assert bad[REJECT_REASON] == reason, bad[REJECT_DETAIL]
    assert all(name in bad[REJECT_DETAIL] for name in names), bad[REJECT_DETAIL]
    assert bad["raster"] is None and bad["bbox"] is None
    assert [r[REJECT_REASON] for r in by_asset.values()] == [None, None]


def test_a_bad_item_is_one_reject_whatever_its_assets(asset_items):
    item, _ = asset_items["utm60-across"]
    no_rasters = _broken(item, lambda d: d.update({"assets": {"thumb": d["assets"]["thumbnail"]}}))
    mistyped = _broken(item, lambda d: d["properties"].update({"eo:cloud_cover": "cloudy"}))
    rows = decode_assets([no_rasters, b'{"type": "Feature", "assets": ', mistyped, item_bytes(item)])
    reasons = [(r["_source_offset"], r[REJECT_REASON]) for r in rows]
    # an Item whose properties do not fit rejects each of its rows; the good Item's land
    assert reasons == [
        (0, "not_a_feature"),
        (1, "malformed_json"),
        (2, "property_type_mismatch"),
        (2, "property_type_mismatch"),
        (3, None),
        (3, None),
    ]
    across = [r for r in rows if r["_source_offset"] == 3]
    assert all(r["bbox"]["xmin"] > r["bbox"]["xmax"] for r in across)  # both wrapped at 180


def test_the_contract_of_a_table_of_assets():
    raw = json.loads((CONTRACT_PATH.parent / "scene_assets.json").read_text())
    assert ASSETS_CONTRACT.raster is not None and ASSETS_CONTRACT.raster.rows == "asset"
    per_item = json.loads(CONTRACT_PATH.read_text())
    per_item["columns"].append({"id": 25, "name": "asset", "type": "string", "from": ["asset.key"]})
    with pytest.raises(ContractError, match="asset.key"):
        parse_contract(per_item)
    upsert = copy.deepcopy(raw)
    upsert.update({"mode": "upsert", "primary_key": ["scene_id"]})
    with pytest.raises(ContractError, match="asset.key"):
        parse_contract(upsert)
    raw["columns"][1]["required"] = True
    raw.update({"mode": "upsert", "primary_key": ["scene_id", "asset"]})
    assert parse_contract(raw).primary_key == ("scene_id", "asset")


def test_a_lone_surrogate_escape_is_malformed_json_and_a_surrogate_pair_is_text(items):
    """JSON lets "\\ud800" stand alone; no column or struct field can hold it (found by fuzzing)."""
    _, item = items["utm60-west"]
    text = item_bytes(item).decode()
    lone = text.replace(f'"id": "{item.id}"', '"id": "\\ud800"', 1).encode()
    pair = text.replace(f'"id": "{item.id}"', '"id": "scene-\\ud83d\\ude00"', 1).encode()
    assert lone != pair != item_bytes(item)
    bad, good = decode([lone, pair])
    assert bad[REJECT_REASON] == "malformed_json" and "lone surrogate" in bad[REJECT_DETAIL]
    assert good[REJECT_REASON] is None and good["scene_id"] == "scene-\U0001f600"
