"""GeoPackage geometries through the real service: a real broker, real Spark, a real catalog.
Kart-spelt features land as rows with their geometry (reprojected where their srs_id says so);
malformed ones reach the dead-letter topic with their reason and original bytes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import shapely
from pyproj import Transformer

from app.service import run
from streaming.table.catalog import create_table, open_catalog
from tests.conftest import local_settings, produce_records
from tests.gpkg_blobs import gpkg, header, kart
from tests.streaming.decode.formats.test_gpkg import GPKG
from tests.streaming.decode.test_dead_letter_corpus import dead_letters

pytestmark = pytest.mark.integration

TO_3857 = Transformer.from_crs("EPSG:4326", "EPSG:3857", always_xy=True)
POINT_WKB = shapely.to_wkb(shapely.Point(2.35, 48.86))

# key -> (value, reason)
MALFORMED: dict[bytes, tuple[bytes, str]] = {
    b"bad-short": (b"GP\x00\x01", "gpkg_too_short"),
    b"bad-magic": (b"GQ\x00\x01\x00\x00\x00\x00" + POINT_WKB, "gpkg_bad_magic"),
    b"bad-version": (header(version=3) + POINT_WKB, "gpkg_unknown_version"),
    b"bad-indicator": (header(kind=7) + b"\x00" * 64 + POINT_WKB, "gpkg_bad_flags"),
    b"bad-extended": (header(extended=True) + POINT_WKB, "gpkg_extended_type"),
    b"bad-envelope-cut": (header(kind=1) + b"\x00" * 12, "gpkg_envelope_truncated"),
    b"bad-envelope": (
        gpkg(shapely.box(2, 48, 3, 49), kind=1, envelope=[2.0, 3.0, 48.0, 49.5]),
        "gpkg_envelope_mismatch",
    ),
    b"bad-wkb": (header() + POINT_WKB[:12], "bad_wkb"),
    b"bad-empty": (gpkg(shapely.from_wkt("POINT EMPTY")), "empty_geometry"),
    b"bad-srs": (gpkg(shapely.Point(2.35, 48.86), srs_id=999999), "unknown_srid"),
}


def test_geopackage_records_land_as_rows_and_malformed_ones_as_dead_letters(kafka, spark, topic, tmp_path):
    rng = np.random.default_rng(5)
    expected: dict[str, shapely.Geometry] = {}
    records = []
    for i, (x, y) in enumerate(zip(rng.uniform(-170, 170, 600), rng.uniform(-80, 80, 600))):
        geometry = shapely.Point(x, y) if i % 3 else shapely.box(x, y, x + 0.5, y + 0.25)
        if i % 10 == 0:  # big-endian header and WKB, in Web Mercator: reprojected
            mercator = shapely.transform(geometry, lambda xy: np.column_stack(TO_3857.transform(xy[:, 0], xy[:, 1])))
            value = gpkg(mercator, srs_id=3857, kind=1, little=False)
        else:
            value = kart(geometry)
        expected[f"gp-{i}"] = geometry
        records.append((f"gp-{i}".encode(), value, []))
    for n, (key, (value, _)) in enumerate(MALFORMED.items()):
        records.insert(37 * n + 5, (key, value, []))
    assert produce_records(kafka.bootstrap, topic, records) == len(records)

    settings = local_settings(kafka, topic, tmp_path, max_offsets_per_trigger=250)
    contract = dataclasses.replace(GPKG, geometry=dataclasses.replace(GPKG.geometry, invalid_polygons="reject"))
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    totals = run(settings, contract, until_idle=True, spark=spark)
    assert totals.commits == {"committed": totals.batches}

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    rows = table.scan(selected_fields=("event_id", "geometry")).to_arrow().to_pylist()
    assert sorted(r["event_id"] for r in rows) == sorted(expected)
    for row in rows:
        stored = shapely.from_wkb(row["geometry"])
        assert shapely.equals_exact(stored, expected[row["event_id"]], 1e-7), row["event_id"]

    dead = dead_letters(kafka.bootstrap, settings.dead_letter_topic)
    assert {d.key: d.reason for d in dead.values()} == {key: reason for key, (_, reason) in MALFORMED.items()}
    assert {d.key: d.value for d in dead.values()} == {key: value for key, (value, _) in MALFORMED.items()}
    assert len(rows) + len(dead) == len(records) == totals.consumed
