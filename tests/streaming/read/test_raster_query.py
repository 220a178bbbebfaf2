"""Window queries on a table of rasters the project's pieces build (decoder, writer, fast append;
SQL catalog, no Spark): the manifests hold each file's WGS84 bounds, and a window finds exactly
the scenes whose footprints (GDAL's, cut at ±180) it meets, with their asset URIs."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import shapely
from rasterio.warp import transform_geom

from streaming.contract import load_contract
from streaming.decode.decoder import REJECT_REASON, Decoder
from streaming.read.query import query_bbox
from tests.raster_scenes import SCENES, Scene, item_bytes, stac_item, write_cog
from tests.streaming.decode.formats.test_stac import CONTRACT_PATH
from tests.streaming.read.test_query import _append, _catalog, _create_table, _kafka_batch

WINDOWS = [
    (179.0, 59.0, -179.0, 61.0),  # across 180 at 60°N
    (170.0, 59.0, 178.0, 61.0),  # west of it
    (-179.5, 59.0, -176.0, 60.0),  # just east of it
    (179.9, -42.0, 180.0, -40.0),  # the southern scene across 180, its western half
    (-180.0, -42.0, -179.9, -40.0),  # and its eastern half
    (-180.0, 88.0, 180.0, 90.0),  # the north pole
    (40.0, 85.0, 41.0, 86.0),  # far from the arctic scene's edges, inside it
    (-10.0, -85.0, 10.0, -80.0),  # the south pole scene reaches 82.2°S
    (0.0, 40.0, 5.0, 50.0),  # Paris
    (-60.0, -10.0, -50.0, 0.0),  # nothing
    (5.0, 70.0, 6.0, 71.0),  # the arctic scene off the pole
]


def footprint(scene: Scene) -> shapely.Geometry:
    """GDAL's footprint: the outline densified and cut at ±180; a scene holding a pole is the
    band of latitudes it covers."""
    xmin, ymin, xmax, ymax = scene.footprint_bounds()
    if xmin == -180.0 and xmax == 180.0:
        return shapely.box(-180.0, ymin, 180.0, ymax)
    right, bottom = scene.left + scene.width * scene.pixel, scene.top - scene.height * scene.pixel
    outline = shapely.segmentize(shapely.box(scene.left, bottom, right, scene.top), scene.pixel)
    cut = transform_geom(
        f"EPSG:{scene.epsg}", "EPSG:4326", shapely.geometry.mapping(outline), antimeridian_cutting=True
    )
    return shapely.geometry.shape(cut)


def expected(window: tuple[float, float, float, float]) -> set[str]:
    xmin, ymin, xmax, ymax = window
    boxes = (
        [shapely.box(xmin, ymin, xmax, ymax)]
        if xmin <= xmax
        else [
            shapely.box(xmin, ymin, 180.0, ymax),
            shapely.box(-180.0, ymin, xmax, ymax),
        ]
    )
    return {s.name for s in SCENES if any(footprint(s).intersects(b) for b in boxes)}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("rasters")


@pytest.fixture(scope="module")
def table(root):
    contract = load_contract(CONTRACT_PATH)
    values = [item_bytes(stac_item(s, write_cog(s, root))) for s in SCENES]
    decoded = Decoder(contract).decode(_kafka_batch([s.name.encode() for s in SCENES], values))
    rows = pa.Table.from_batches([decoded])
    assert rows.column(REJECT_REASON).null_count == len(SCENES)
    catalog = _catalog(root)
    t = _create_table(catalog, contract)
    _append(t, contract, rows.drop_columns([c for c in rows.column_names if c.startswith("_") and c != "_hilbert"]))
    return catalog.load_table(contract.table)


def test_windows_find_exactly_the_scenes_whose_footprints_they_meet(table):
    for window in WINDOWS:
        result = query_bbox(table, window).table
        assert set(result.column("scene_id").to_pylist()) == expected(window), window
    assert expected((179.0, 59.0, -179.0, 61.0)) == {"utm60-across"}  # the windows do discriminate
    assert expected((-10.0, -85.0, 10.0, -80.0)) == {"antarctic-pole"}


def test_results_carry_the_asset_uris_and_files_prune(table):
    result = query_bbox(table, (0.0, 40.0, 5.0, 50.0))
    (raster,) = result.table.column("raster").to_pylist()
    assert [b["uri"].rsplit("/", 1)[1] for b in raster["bands"]] == ["paris.tif", "paris.tif"]
    assert result.stats.files_scanned < result.stats.files_total
    everything = query_bbox(table, (-180.0, -90.0, 180.0, 90.0)).table
    bbox = everything.column("bbox").combine_chunks()
    wrapped = everything.filter(pc.greater(bbox.field("xmin"), bbox.field("xmax")))
    assert set(wrapped.column("scene_id").to_pylist()) == {"utm60-across", "utm60-south-across"}


def test_a_result_leaves_as_geojson_lines_and_geoparquet(table, tmp_path):
    import json

    import pyarrow.parquet as pq

    from streaming.read.output import to_geojson_lines, write_geoparquet

    contract = load_contract(CONTRACT_PATH)
    result = query_bbox(table, (179.0, 59.0, -179.0, 61.0))
    (line,) = to_geojson_lines(result, "geometry", "scene_id")
    feature = json.loads(line)
    assert feature["id"] == "utm60-across" and feature["geometry"]["type"] == "MultiPolygon"
    assert feature["properties"]["raster"]["bands"][0]["uri"].endswith("utm60-across.tif")
    geo = write_geoparquet(result, contract, tmp_path / "scenes.parquet")
    assert geo["columns"]["geometry"]["bbox"][0] > geo["columns"]["geometry"]["bbox"][2]  # wrapped
    assert pq.read_table(tmp_path / "scenes.parquet").column("raster")[0].as_py()["width"] == 250


def test_inspect_draws_the_footprints_and_query_returns_the_uris(table, root, monkeypatch, capsys, tmp_path):
    import json

    from streaming.read.inspect import raster_footprints
    from tests.streaming.read.test_query import _cli

    footprints = raster_footprints(table)
    assert sorted(f.geom_type for f in footprints).count("MultiPolygon") == 2 and len(footprints) == len(SCENES)
    png = tmp_path / "scenes.png"
    assert _cli(monkeypatch, root, "inspect", "--table", "imagery.scenes", "--plot", str(png), "--footprints") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["footprints"] == len(SCENES) and png.stat().st_size > 30_000
    assert _cli(monkeypatch, root, "inspect", "--table", "imagery.scenes", "--footprints") == 2
    capsys.readouterr()
    assert _cli(monkeypatch, root, "query", "--table", "imagery.scenes", "--bbox", "179,59,-179,61") == 0
    (line,) = capsys.readouterr().out.splitlines()
    feature = json.loads(line)
    assert feature["id"] == "utm60-across"
    assert feature["properties"]["raster"]["bands"][1] == {
        "uri": feature["properties"]["raster"]["bands"][0]["uri"],
        "band_number": 1,
    }


def test_compaction_keeps_rasters_and_their_bounds(tmp_path):
    from dataclasses import replace

    from streaming.maintenance.compaction import compact
    from streaming.maintenance.plan import MaintenancePolicy

    contract = load_contract(CONTRACT_PATH)
    contract = replace(contract, table="imagery.compacted")
    values = [item_bytes(stac_item(s, write_cog(s, tmp_path))) for s in SCENES]
    rows = pa.Table.from_batches([Decoder(contract).decode(_kafka_batch([s.name.encode() for s in SCENES], values))])
    rows = rows.drop_columns([c for c in rows.column_names if c.startswith("_") and c != "_hilbert"])
    catalog = _catalog(tmp_path)
    t = _create_table(catalog, contract)
    for part in range(3):  # three small appends, a scene in two of them at most
        _append(t, contract, rows.slice(part * 3, 3), prefix=f"part{part}")
    t = catalog.load_table(contract.table)
    before = {r["scene_id"]: r for r in t.scan().to_arrow().to_pylist()}
    report = compact(t, MaintenancePolicy(min_file_age_s=0))
    assert report.files_rewritten > 0
    t.refresh()
    after = {r["scene_id"]: r for r in t.scan().to_arrow().to_pylist()}
    assert after.keys() == before.keys()
    for name, row in after.items():
        assert row["raster"] == before[name]["raster"] and row["bbox"] == before[name]["bbox"]
    for window in WINDOWS:
        assert set(query_bbox(t, window).table.column("scene_id").to_pylist()) == expected(window), window


def test_a_table_of_rasters_gains_a_column_and_keeps_its_raster(tmp_path):
    import copy
    import json

    from streaming.contract import parse_contract
    from streaming.table.catalog import create_table
    from streaming.table.evolve import EvolutionError, apply_evolution

    raw = json.loads(CONTRACT_PATH.read_text())
    catalog = _catalog(tmp_path)
    table, _ = create_table(catalog, parse_contract(raw))
    grown = copy.deepcopy(raw)
    grown["columns"].append(
        {"id": 25, "name": "sun_elevation", "type": "double", "from": ["properties.view:sun_elevation"]}
    )
    changes = apply_evolution(table, parse_contract(grown))
    assert [(c.kind, c.id) for c in changes if c.kind != "contract"] == [("add", 25)]
    table = catalog.load_table(raw["table"])
    assert table.schema().find_field("raster").field_id == 7
    for edit, message in [
        (lambda r: r["raster"].update({"name": "image"}), "raster"),
        (lambda r: r["columns"].append({"id": 7, "name": "x", "type": "double", "from": ["properties.x"]}), "7"),
    ]:
        broken = copy.deepcopy(grown)
        edit(broken)
        with pytest.raises((EvolutionError, ValueError), match=message):
            apply_evolution(table, parse_contract(broken))


def test_a_table_of_assets_answers_geoingest_query_and_inspect(root, table, monkeypatch, capsys, tmp_path):
    """One row per raster asset: `geoingest query` returns each asset that meets the window with
    its key and its file's URI, and `inspect --footprints` draws every asset's footprint."""
    import json

    from tests.raster_scenes import asset_item, cog_footprint, window_boxes
    from tests.streaming.read.test_query import _cli

    contract = load_contract(CONTRACT_PATH.parent / "scene_assets.json")
    by_name = {s.name: s for s in SCENES}
    made = {n: asset_item(by_name[n], root / "assets" / n) for n in ("utm60-across", "utm01-north", "paris")}
    values = [item_bytes(item) for item, _ in made.values()]
    rows = pa.Table.from_batches([Decoder(contract).decode(_kafka_batch([n.encode() for n in made], values))])
    assert rows.column(REJECT_REASON).null_count == rows.num_rows
    _append(
        _create_table(_catalog(root), contract),
        contract,
        rows.drop_columns([c for c in rows.column_names if c.startswith("_") and c != "_hilbert"]),
    )
    cogs = {(n, k): cog for n, (_, files) in made.items() for k, cog in files.items()}
    window = (179.0, 59.0, -179.0, 61.0)
    assert _cli(monkeypatch, root, "query", "--table", contract.table, "--bbox", "179,59,-179,61") == 0
    features = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    got = {(f["properties"]["scene_id"], f["properties"]["asset"]): f for f in features}
    want = {k for k, cog in cogs.items() if any(cog_footprint(cog).intersects(b) for b in window_boxes(window))}
    assert set(got) == want and want >= {("utm60-across", "B04"), ("utm60-across", "B11")}
    for key, feature in got.items():
        assert {b["uri"] for b in feature["properties"]["raster"]["bands"]} == {cogs[key].as_uri()}
    png = tmp_path / "assets.png"
    assert _cli(monkeypatch, root, "inspect", "--table", contract.table, "--plot", str(png), "--footprints") == 0
    assert json.loads(capsys.readouterr().out)["footprints"] == len(cogs) and png.stat().st_size > 10_000
