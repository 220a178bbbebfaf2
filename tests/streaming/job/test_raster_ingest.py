"""Scenes end to end: STAC Items (pystac) for COGs written with rasterio go through a real broker,
real Spark and a SQLite-backed Iceberg catalog. The stored bounds are GDAL's footprint bounds,
the manifests hold their unions (wrapped files for the scenes across 180°), and windows find
exactly the scenes whose footprints they meet; a bad Item is a dead letter with its reason. The
same with a row per raster asset: each file its own raster, a bad asset a dead letter of its own."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest
from pyiceberg.conversions import from_bytes
from pyiceberg.types import DoubleType

from streaming.contract import load_contract
from streaming.job.config import JobConfig
from streaming.job.processor import BatchProcessor
from streaming.job.stream import start_query
from streaming.read.query import query_bbox
from streaming.table.catalog import create_table, open_catalog
from streaming.write.dead_letter import DETAIL_HEADER, REASON_HEADER, DeadLetterConfig
from tests.conftest import produce_records
from tests.raster_scenes import (
    SCENES,
    asset_item,
    cog_bounds,
    cog_footprint,
    item_bytes,
    stac_item,
    window_boxes,
    write_cog,
)
from tests.streaming.decode.formats.test_stac import CONTRACT_PATH
from tests.streaming.read.test_raster_query import WINDOWS, expected

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ingested(kafka, spark, tmp_path_factory):
    from kafka.admin import KafkaAdminClient, NewTopic

    home = tmp_path_factory.mktemp("rasters")
    topic = "scenes"
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    admin.close()
    records = [(s.name.encode(), item_bytes(stac_item(s, write_cog(s, home))), []) for s in SCENES]
    broken = json.loads(records[0][1])
    del broken["properties"]["proj:transform"]
    records.append((b"no-transform", json.dumps(broken).encode(), []))
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    contract = load_contract(CONTRACT_PATH)
    catalog = open_catalog(
        "test", {"type": "sql", "uri": f"sqlite:///{home / 'catalog.db'}", "warehouse": f"file://{home / 'warehouse'}"}
    )
    table, _ = create_table(catalog, contract)
    dead_letter = DeadLetterConfig(kafka.bootstrap, f"{topic}.dlq", spill_location=f"file://{home / 'spill'}")
    config = JobConfig(kafka.bootstrap, topic, str(home / "checkpoint"), writer_id="rasters", dead_letter=dead_letter)
    query = start_query(spark, BatchProcessor(spark, table, contract, config), until_idle=True)
    query.awaitTermination()
    assert query.exception() is None
    table.refresh()
    from tests.streaming.job.test_chaos import read_dead_letters

    dead = read_dead_letters({"bootstrap_servers": kafka.bootstrap}, f"{topic}.dlq")
    return table, contract, dead


def test_scenes_land_with_gdal_bounds_and_their_manifests_bound_them(ingested):
    table, contract, _ = ingested
    rows = table.scan().to_arrow()
    assert sorted(rows.column("scene_id").to_pylist()) == sorted(s.name for s in SCENES)  # not the bad one
    by_name = {r["scene_id"]: r for r in rows.to_pylist()}
    for scene in SCENES:
        box = by_name[scene.name]["bbox"]
        got = (box["xmin"], box["ymin"], box["xmax"], box["ymax"])
        assert got == pytest.approx(scene.footprint_bounds(), abs=1e-5), scene.name
        assert by_name[scene.name]["raster"]["bands"][0]["uri"].endswith(f"{scene.name}.tif")
    bbox = rows.column("bbox").combine_chunks()
    wrapped = set(rows.filter(pc.greater(bbox.field("xmin"), bbox.field("xmax"))).column("scene_id").to_pylist())
    assert wrapped == {"utm60-across", "utm60-south-across"}
    ids = contract.bbox_field_ids
    wrapped_rows_in_files = 0
    for task in table.scan().plan_files():
        lo = {k: from_bytes(DoubleType(), task.file.lower_bounds[i]) for k, i in ids.items()}
        hi = {k: from_bytes(DoubleType(), task.file.upper_bounds[i]) for k, i in ids.items()}
        # a file of wrapped rows reads as such from its bounds: min(xmin) > max(xmax)
        if lo["xmin"] > hi["xmax"]:
            wrapped_rows_in_files += task.file.record_count
            assert 178.0 < lo["xmin"] and hi["xmax"] < -176.0
    assert wrapped_rows_in_files == 2


def test_a_bad_item_is_a_dead_letter_with_its_reason(ingested):
    _, _, dead = ingested
    assert [(m.key, dict(m.headers)[REASON_HEADER]) for m in dead] == [(b"no-transform", b"raster_without_transform")]


def test_windows_find_exactly_the_scenes_whose_footprints_they_meet(ingested):
    table, _, _ = ingested
    for window in WINDOWS:
        result = query_bbox(table, window).table
        assert set(result.column("scene_id").to_pylist()) == expected(window), window


# One row per raster asset (schemas/scene_assets.json): an Item of four raster assets and three
# other files makes four rows, each on its own grid, and a bad asset is a dead letter of its own.
ASSET_SCENES = ("utm60-across", "utm01-north", "arctic-off-pole", "paris")


@pytest.fixture(scope="module")
def assets_ingested(kafka, spark, tmp_path_factory):
    from kafka.admin import KafkaAdminClient, NewTopic

    home = tmp_path_factory.mktemp("raster-assets")
    topic = "scene-assets"
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    admin.close()
    by_name = {s.name: s for s in SCENES}
    made = {name: asset_item(by_name[name], home / name) for name in ASSET_SCENES}
    records = [(name.encode(), item_bytes(item), []) for name, (item, _) in made.items()]
    broken = json.loads(records[1][1])
    broken["id"] = "bad-b11"
    broken["assets"]["B11"]["proj:shape"] = [0, 10]
    records.append((b"bad-b11", json.dumps(broken).encode(), []))
    assert produce_records(kafka.bootstrap, topic, records) == len(records)
    contract = load_contract(CONTRACT_PATH.parent / "scene_assets.json")
    catalog = open_catalog(
        "test", {"type": "sql", "uri": f"sqlite:///{home / 'catalog.db'}", "warehouse": f"file://{home / 'warehouse'}"}
    )
    table, _ = create_table(catalog, contract)
    dead_letter = DeadLetterConfig(kafka.bootstrap, f"{topic}.dlq", spill_location=f"file://{home / 'spill'}")
    config = JobConfig(kafka.bootstrap, topic, str(home / "checkpoint"), writer_id="assets", dead_letter=dead_letter)
    query = start_query(spark, BatchProcessor(spark, table, contract, config), until_idle=True)
    query.awaitTermination()
    assert query.exception() is None
    table.refresh()
    from tests.streaming.job.test_chaos import read_dead_letters

    dead = read_dead_letters({"bootstrap_servers": kafka.bootstrap}, f"{topic}.dlq")
    cogs = {(name, key): cog for name, (_, files) in made.items() for key, cog in files.items()}
    cogs.update({("bad-b11", key): cog for key, cog in made[ASSET_SCENES[1]][1].items() if key != "B11"})
    return table, cogs, dead


def test_each_raster_asset_lands_as_a_row_with_its_files_bounds(assets_ingested):
    table, cogs, _ = assets_ingested
    rows = table.scan().to_arrow().to_pylist()
    assert sorted((r["scene_id"], r["asset"]) for r in rows) == sorted(cogs)  # no thumbnail, metadata, overview
    for row in rows:
        cog = cogs[(row["scene_id"], row["asset"])]
        assert {b["uri"] for b in row["raster"]["bands"]} == {cog.as_uri()}
        got = (row["bbox"]["xmin"], row["bbox"]["ymin"], row["bbox"]["xmax"], row["bbox"]["ymax"])
        assert got == pytest.approx(cog_bounds(cog), abs=1e-5), (row["scene_id"], row["asset"])
        assert row["cloud_cover"] == 30.0 and row["platform"] == "test-sat"  # the Item's, repeated
    wrapped = {(r["scene_id"], r["asset"]) for r in rows if r["bbox"]["xmin"] > r["bbox"]["xmax"]}
    assert wrapped == {("utm60-across", "B04"), ("utm60-across", "B11")}


def test_a_bad_asset_is_a_dead_letter_and_its_item_lands_without_it(assets_ingested):
    _, _, dead = assets_ingested
    ((key, headers),) = [(m.key, dict(m.headers)) for m in dead]
    assert key == b"bad-b11" and headers[REASON_HEADER] == b"bad_raster_shape"
    assert b"assets.B11.proj:shape" in headers[DETAIL_HEADER]


def test_windows_find_exactly_the_assets_whose_footprints_they_meet(assets_ingested):
    table, cogs, _ = assets_ingested
    footprints = {k: cog_footprint(cog) for k, cog in cogs.items()}
    hits = 0
    for window in WINDOWS:
        result = query_bbox(table, window).table
        got = set(zip(result.column("scene_id").to_pylist(), result.column("asset").to_pylist()))
        want = {k for k, f in footprints.items() if any(f.intersects(b) for b in window_boxes(window))}
        assert got == want, window
        hits += len(got)
    assert hits > 0
