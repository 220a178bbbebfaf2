"""The layout of a table's data files: where each file lies, how many rows it holds, and where it
falls on the Hilbert curve the rows were sorted by; and a picture of it.

The extents come from the manifests alone (the lower and upper bounds of bbox.*, or of the
geometry column of a table that stores no covering: streaming/read/bounds.py), so inspecting
a table reads no data file. A well-clustered table shows small, barely overlapping rectangles
whose colours (their Hilbert order) change smoothly across space; wide rectangles are files of
sparse rows, which every query window in their extent has to open.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import shapely
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table

from streaming.kernels.antimeridian import centre_x, window_intervals
from streaming.kernels.hilbert import hilbert_keys_of_bounds
from streaming.read.predicate import BBox
from streaming.read.query import (
    QueryError,
    _property,
    _schema_of,
    query_bbox,
    resolve_snapshot,
    table_contract,
    table_file_bounds,
)

HILBERT_BITS_PROPERTY = "geo.hilbert.bits"
HILBERT_EXTENT_PROPERTY = "geo.hilbert.extent"


@dataclass(frozen=True)
class FileExtent:
    """One data file: its MBR from the manifest bounds of bbox.* (None without bounds), its
    record count, and the Hilbert key of its MBR centre over the table's Hilbert extent."""

    path: str
    record_count: int
    file_size_in_bytes: int
    bbox: BBox | None
    hilbert_key: int | None


@dataclass(frozen=True)
class TableLayout:
    table: str
    snapshot_id: int | None
    hilbert_bits: int
    hilbert_extent: BBox
    files: tuple[FileExtent, ...]  # in Hilbert order of their centres; files without bounds last

    @property
    def record_count(self) -> int:
        return sum(f.record_count for f in self.files)

    @property
    def data_extent(self) -> BBox | None:
        """The union of the file extents (None when no file has bounds)."""
        boxes = [f.bbox for f in self.files if f.bbox is not None]
        if not boxes:
            return None
        b = np.array(boxes)
        wrapped = b[:, 0] > b[:, 2]  # across the anti-meridian: they reach both -180 and 180
        xmin, xmax = np.where(wrapped, -180.0, b[:, 0]), np.where(wrapped, 180.0, b[:, 2])
        return (float(xmin.min()), float(b[:, 1].min()), float(xmax.max()), float(b[:, 3].max()))

    def summary(self) -> dict:
        """Counts, extents and how much the files overlap, as plain JSON values."""
        extent = self.data_extent
        boxes = np.array([f.bbox for f in self.files if f.bbox is not None]).reshape(-1, 4)
        areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        extent_area = (extent[2] - extent[0]) * (extent[3] - extent[1]) if extent else 0.0
        return {
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "files": len(self.files),
            "files_without_bounds": sum(f.bbox is None for f in self.files),
            "rows": self.record_count,
            "bytes": sum(f.file_size_in_bytes for f in self.files),
            "data_extent": list(extent) if extent else None,
            "hilbert": {"bits": self.hilbert_bits, "extent": list(self.hilbert_extent)},
            # Sum of the file areas over the data extent's area: 1 would tile it exactly once;
            # much more means that a window opens many files.
            "file_area_over_extent": round(float(areas.sum()) / extent_area, 4) if extent_area > 0 else None,
            "median_file_area_share": (
                round(float(np.median(areas)) / extent_area, 6) if extent_area > 0 and len(areas) else None
            ),
        }


def file_extents(
    table: Table, snapshot_id: int | None = None, as_of: str | int | datetime | None = None
) -> TableLayout:
    """The data files of the current snapshot (or `snapshot_id`, or the one current at `as_of`)."""
    snapshot = resolve_snapshot(table, snapshot_id, as_of)
    bits, extent = _hilbert_properties(table)
    name = ".".join(table.name())
    if snapshot is None:
        return TableLayout(name, None, bits, extent, ())

    file_bounds = table_file_bounds(table, _schema_of(table, snapshot))

    rows = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            f = entry.data_file
            rows.append((f.file_path, int(f.record_count), int(f.file_size_in_bytes), file_bounds(f)))

    with_bounds = [r for r in rows if r[3] is not None]
    keys: list[int] = []
    if with_bounds:
        b = np.array([r[3] for r in with_bounds])
        keys = hilbert_keys_of_bounds(b[:, 0], b[:, 1], b[:, 2], b[:, 3], extent, bits).tolist()
    files = [FileExtent(path, count, size, bbox, key) for (path, count, size, bbox), key in zip(with_bounds, keys)]
    files.sort(key=lambda f: (f.hilbert_key, f.path))
    files += [FileExtent(path, count, size, None, None) for path, count, size, bbox in rows if bbox is None]
    return TableLayout(name, snapshot.snapshot_id, bits, extent, tuple(files))


def _hilbert_properties(table: Table) -> tuple[int, BBox]:
    bits_text = _property(table, HILBERT_BITS_PROPERTY)
    extent_text = _property(table, HILBERT_EXTENT_PROPERTY)
    try:
        bits = int(bits_text)
        extent = tuple(float(v) for v in extent_text.split(","))
    except ValueError:
        raise QueryError(
            f"table properties {HILBERT_BITS_PROPERTY}={bits_text!r} / "
            f"{HILBERT_EXTENT_PROPERTY}={extent_text!r} are not a number / four numbers"
        ) from None
    if not 1 <= bits <= 31 or len(extent) != 4 or not (extent[0] < extent[2] and extent[1] < extent[3]):
        raise QueryError(
            f"table properties {HILBERT_BITS_PROPERTY}={bits_text!r} / "
            f"{HILBERT_EXTENT_PROPERTY}={extent_text!r} do not describe a Hilbert grid"
        )
    return bits, extent


def raster_footprints(
    table: Table, snapshot_id: int | None = None, as_of: str | int | datetime | None = None
) -> list[shapely.Geometry]:
    """The footprint of every raster of a table of rasters (its geometry column: the outline in
    WGS84, cut at ±180), read from the data files; none for a table without a raster column."""
    contract = table_contract(table)
    if contract.raster is None:
        return []
    rows = query_bbox(table, (-180.0, -90.0, 180.0, 90.0), snapshot_id=snapshot_id, as_of=as_of).table
    column = rows.column(contract.geometry.name).to_numpy(zero_copy_only=False)
    return list(shapely.from_wkb(column)) if len(column) else []


def plot_file_extents(
    layout: TableLayout,
    path: str | Path,
    title: str | None = None,
    dpi: int = 150,
    footprints: list[shapely.Geometry] | None = None,
) -> Path:
    """Draw the file extents over the data extent, coloured by Hilbert order, as a PNG; and the
    footprints of a table's rasters, when given, as outlines over them."""
    # The Agg canvas on a bare Figure: no pyplot, so no global state and no display needed.
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.collections import PatchCollection
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.patches import Polygon as MplPolygon

    path = Path(path)
    drawn = [f.bbox for f in layout.files if f.bbox is not None]
    extent = layout.data_extent
    frame = extent or layout.hilbert_extent
    width, height = frame[2] - frame[0], frame[3] - frame[1]
    aspect = height / width if width > 0 and height > 0 else 0.5
    fig = Figure(figsize=(11, max(4.0, min(11.0, 9.0 * aspect + 1.5))), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    cmap = colormaps["viridis"]
    norm = Normalize(vmin=0, vmax=max(len(drawn) - 1, 1))
    # Wide files first, so the small ones stay visible on top of them.
    order = sorted(range(len(drawn)), key=lambda i: -_area(drawn[i]))
    rectangles, colours = [], []
    for i in order:
        xmin, ymin, xmax, ymax = drawn[i]
        # A file of rows across the anti-meridian (xmin > xmax) is drawn as its two halves.
        for lo, hi in window_intervals(xmin, xmax):
            # A file of one point (or of points on one line) still gets a visible outline.
            rectangles.append(Rectangle((lo, ymin), max(hi - lo, width * 1e-3), max(ymax - ymin, height * 1e-3)))
            colours.append(cmap(norm(i)))
    if rectangles:
        ax.add_collection(
            PatchCollection(
                rectangles, facecolors=[(*c[:3], 0.18) for c in colours], edgecolors=colours, linewidths=0.9
            )
        )
        centres = np.array([(float(centre_x(b[0], b[2])), (b[1] + b[3]) / 2) for b in drawn])
        ax.plot(centres[:, 0], centres[:, 1], color="0.35", linewidth=0.6, alpha=0.7, zorder=3)
        ax.scatter(
            centres[:, 0],
            centres[:, 1],
            c=[cmap(norm(i)) for i in range(len(drawn))],
            s=10,
            zorder=4,
            edgecolors="0.2",
            linewidths=0.3,
        )
        mappable = ScalarMappable(norm=norm, cmap=cmap)
        bar = fig.colorbar(mappable, ax=ax, shrink=0.85, pad=0.01)
        bar.set_label("Hilbert order of the file centre (0 = first)")
    for footprint in footprints or []:
        for part in shapely.get_parts(footprint):
            if isinstance(part, shapely.Polygon):
                ring = np.asarray(part.exterior.coords)
                ax.add_patch(MplPolygon(ring, closed=True, fill=False, edgecolor="darkorange", linewidth=0.8, zorder=6))
    if extent:
        ax.add_patch(
            Rectangle(
                (extent[0], extent[1]),
                width,
                height,
                fill=False,
                edgecolor="crimson",
                linewidth=1.4,
                linestyle="--",
                zorder=5,
            )
        )

    margin_x, margin_y = width * 0.03 or 1.0, height * 0.03 or 1.0
    ax.set_xlim(frame[0] - margin_x, frame[2] + margin_x)
    ax.set_ylim(frame[1] - margin_y, frame[3] + margin_y)
    ax.set_aspect("equal" if 0.05 < aspect < 20 else "auto")
    ax.set_xlabel("x (table CRS)")
    ax.set_ylabel("y (table CRS)")
    ax.grid(True, linewidth=0.3, alpha=0.5)
    snapshot = layout.snapshot_id if layout.snapshot_id is not None else "none"
    handles = [
        Patch(facecolor=(*cmap(0.5)[:3], 0.18), edgecolor=cmap(0.5), label=f"{len(drawn):,} data files"),
        Line2D([], [], color="none", label=f"{layout.record_count:,} rows"),
        Line2D([], [], color="crimson", linestyle="--", label="data extent"),
        Line2D([], [], color="0.35", marker="o", markersize=3, linewidth=0.6, label="file centres in Hilbert order"),
        Line2D([], [], color="none", label=f"snapshot {snapshot}"),
    ]
    if footprints:
        handles.append(
            Line2D([], [], color="darkorange", linewidth=0.8, label=f"{len(footprints):,} raster footprints")
        )
    missing = len(layout.files) - len(drawn)
    if missing:
        handles.append(Line2D([], [], color="none", label=f"{missing} files without bounds (not drawn)"))
    # Below the map, where it hides no file.
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    ax.set_title(title or f"{layout.table}: data file extents")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    return path


def _area(bbox: BBox) -> float:
    width = bbox[2] - bbox[0]
    return (width + 360.0 if width < 0 else width) * (bbox[3] - bbox[1])  # xmin > xmax: across ±180
