"""File extents of a snapshot, from the manifests, and their picture (a real table, no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from streaming.kernels.hilbert import hilbert_keys_of_bounds
from streaming.read.inspect import FileExtent, file_extents, plot_file_extents
from tests.streaming.read.test_query import (  # noqa: F401 (fixtures)
    EVENT_COUNT,
    Built,
    TwoCommits,
    _catalog,
    _cli,
    _create_table,
    built,
    contract,
    two_commits,
)

WORLD = (-180.0, -90.0, 180.0, 90.0)


def test_one_extent_per_data_file_as_the_manifest_holds_it(built: Built) -> None:
    layout = file_extents(built.table)
    assert layout.snapshot_id == built.table.current_snapshot().snapshot_id
    assert len(layout.files) == len(built.records)
    by_path = {r.path: r for r in built.records}
    assert {f.path for f in layout.files} == set(by_path)
    for f in layout.files:
        record = by_path[f.path]
        # The writer's file bbox is what it put into the manifest as bbox.* bounds.
        assert f.bbox == record.bbox
        assert f.record_count == record.record_count
        assert f.file_size_in_bytes == record.file_size_in_bytes
    # And the manifest as pyiceberg plans it agrees on the files and counts.
    planned = {t.file.file_path: t.file.record_count for t in built.table.scan().plan_files()}
    assert planned == {f.path: f.record_count for f in layout.files}
    assert layout.record_count == EVENT_COUNT


def test_files_are_in_hilbert_order_of_their_centres(built: Built) -> None:
    layout = file_extents(built.table)
    assert layout.hilbert_bits == 16 and layout.hilbert_extent == WORLD
    b = np.array([f.bbox for f in layout.files])
    expected = hilbert_keys_of_bounds(b[:, 0], b[:, 1], b[:, 2], b[:, 3], WORLD, 16)
    keys = [f.hilbert_key for f in layout.files]
    assert keys == expected.tolist() == sorted(keys)


def test_summary_counts_and_extent(built: Built) -> None:
    layout = file_extents(built.table)
    summary = layout.summary()
    boxes = np.array([r.bbox for r in built.records])
    extent = [boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max()]
    assert summary["files"] == len(built.records) and summary["rows"] == EVENT_COUNT
    assert summary["data_extent"] == extent == list(layout.data_extent)
    assert summary["files_without_bounds"] == 0
    assert summary["snapshot_id"] == layout.snapshot_id
    assert summary["file_area_over_extent"] > 0
    json.dumps(summary)  # plain JSON values


def test_an_older_snapshot_has_its_own_files(two_commits: TwoCommits) -> None:
    t = two_commits
    now, then = file_extents(t.table), file_extents(t.table, snapshot_id=t.first)
    assert then.snapshot_id == t.first and then.record_count == t.first_rows
    assert now.record_count == t.all_rows
    assert {f.path for f in then.files} < {f.path for f in now.files}
    assert file_extents(t.table, as_of=t.table.snapshot_by_id(t.first).timestamp_ms).snapshot_id == t.first


def test_the_plot_is_a_png_of_some_substance(built: Built, tmp_path: Path) -> None:
    path = plot_file_extents(file_extents(built.table), tmp_path / "deep" / "files.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 30_000
    with Image.open(path) as image:
        width, height = image.size
        pixels = np.asarray(image.convert("RGB").resize((200, 100))).reshape(-1, 3)
    colours = len(np.unique(pixels, axis=0))
    assert width >= 1200 and height >= 600
    assert colours > 50, "file rectangles coloured along the Hilbert order"


def test_an_empty_table_has_no_files_and_still_plots(tmp_path: Path, contract) -> None:  # noqa: F811
    table = _create_table(_catalog(tmp_path), contract)
    layout = file_extents(table)
    assert layout.files == () and layout.snapshot_id is None and layout.data_extent is None
    assert layout.summary()["files"] == 0
    path = plot_file_extents(layout, tmp_path / "empty.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_a_file_without_bounds_is_listed_last_and_not_drawn(built: Built, tmp_path: Path) -> None:
    layout = file_extents(built.table)
    unbounded = FileExtent("s3://bucket/nobounds.parquet", 10, 1000, None, None)
    partial = type(layout)(
        layout.table, layout.snapshot_id, layout.hilbert_bits, layout.hilbert_extent, (*layout.files, unbounded)
    )
    assert partial.summary()["files_without_bounds"] == 1
    assert partial.data_extent == layout.data_extent
    assert plot_file_extents(partial, tmp_path / "partial.png").stat().st_size > 30_000


def test_cli_inspect_prints_a_summary_and_draws(
    built: Built, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    png = tmp_path / "files.png"
    assert _cli(monkeypatch, built.root, "inspect", "--table", "demo.events", "--plot", str(png), "--files") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["files"] == len(built.records) and summary["rows"] == EVENT_COUNT
    assert summary["plot"] == str(png) and png.stat().st_size > 30_000
    assert len(summary["file_extents"]) == len(built.records)
    assert _cli(monkeypatch, built.root, "inspect", "--table", "demo.events", "--snapshot", "7") == 2
    assert "snapshot 7" in capsys.readouterr().err
