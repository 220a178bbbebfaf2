"""Events around the anti-meridian and the brute-force answer to a window over them, for the
anti-meridian tests and bench/antimeridian.py.

The brute force is independent of the product's kernels: a geometry the generator made across
±180 has its western longitudes moved by +360 (so it is one planar shape east of 180), is cut
by the strips [-180, 180] and [180, 540] and the second piece moved back by -360; a window with
xmin > xmax is its two halves. A row matches when a piece meets a half."""

from __future__ import annotations

import json

import numpy as np
import shapely
import shapely.affinity
import shapely.geometry


def events(rng: np.random.Generator, crossing: int, plain: int, points: int) -> list[tuple[str, dict, bool]]:
    """(event id, GeoJSON geometry, whether it crosses ±180): tracks and boxes across the
    anti-meridian, tracks beside it on both sides, and points anywhere, half of them near ±180."""
    out: list[tuple[str, dict, bool]] = []
    for i in range(crossing):
        y = float(rng.uniform(-60, 60))
        x0, x1 = float(rng.uniform(178.5, 179.95)), float(rng.uniform(-179.95, -178.5))
        if i % 5 == 4:  # a box drawn across
            ring = [[x0, y], [x1, y], [x1, y + 0.4], [x0, y + 0.4], [x0, y]]
            geometry = {"type": "Polygon", "coordinates": [ring]}
        elif i % 5 == 3:  # a track that goes on west
            geometry = {"type": "LineString", "coordinates": [[x0, y], [x1, y + 0.3], [x1 + 0.6, y + 0.5]]}
        else:
            geometry = {"type": "LineString", "coordinates": [[x0, y], [x1, y + float(rng.uniform(-0.5, 0.5))]]}
        out.append((f"x{i}", geometry, True))
    for i in range(plain):
        y = float(rng.uniform(-60, 60))
        side = 1.0 if i % 2 else -1.0
        a, b = float(rng.uniform(177.0, 179.9)), float(rng.uniform(177.0, 179.9))
        geometry = {"type": "LineString", "coordinates": [[side * a, y], [side * b, y + 0.3]]}
        out.append((f"l{i}", geometry, False))
    for i in range(points):
        near = i % 2 == 0
        x = float(rng.uniform(178.0, 180.0) * rng.choice([-1.0, 1.0])) if near else float(rng.uniform(-180, 180))
        out.append((f"p{i}", {"type": "Point", "coordinates": [x, float(rng.uniform(-60, 60))]}, False))
    return out


def feature_json(event_id: str, geometry: dict) -> bytes:
    return json.dumps({"type": "Feature", "id": event_id, "geometry": geometry, "properties": {}}).encode()


def _pieces(geometry: dict, crosses: bool) -> list[shapely.Geometry]:
    shape = shapely.geometry.shape(geometry)
    if not crosses:
        return [shape]
    east_of_180 = shapely.transform(shape, lambda c: np.where(c < 0, c + 360.0, c) * [1, 0] + c * [0, 1])
    east = shapely.intersection(east_of_180, shapely.box(-180, -90, 180, 90))
    west = shapely.intersection(east_of_180, shapely.box(180, -90, 540, 90))
    return [east, shapely.affinity.translate(west, -360.0)]


def window_halves(window: tuple[float, float, float, float]) -> list[shapely.Geometry]:
    xmin, ymin, xmax, ymax = window
    boxes = [(xmin, ymin, 180.0, ymax), (-180.0, ymin, xmax, ymax)] if xmin > xmax else [window]
    return [shapely.box(*b) for b in boxes]


def expected_ids(data: list[tuple[str, dict, bool]], window: tuple[float, float, float, float]) -> set[str]:
    halves = window_halves(window)
    return {
        event_id
        for event_id, geometry, crosses in data
        if any(shapely.intersects(p, h) for p in _pieces(geometry, crosses) for h in halves)
    }


def windows(rng: np.random.Generator, count: int) -> list[tuple[float, float, float, float]]:
    """Named windows (east of 180, west of it, across it, the Gulf of Guinea), then `count`
    random ones near ±180, a third of them across."""
    out = [
        (179.0, -60.0, 180.0, 60.0),
        (-180.0, -60.0, -179.0, 60.0),
        (179.0, -5.0, -179.0, 5.0),
        (0.0, -5.0, 10.0, 5.0),
    ]
    for i in range(count):
        w, h = float(rng.uniform(0.1, 2.0)), float(rng.uniform(1.0, 20.0))
        y = float(rng.uniform(-60, 60 - h))
        if i % 3 == 0:
            x0 = float(rng.uniform(180 - w, 180))
            out.append((x0, y, x0 + w - 360.0, y + h))
        else:
            side = 1.0 if i % 3 == 1 else -1.0
            x0 = float(rng.uniform(178.0, 180.0 - w))
            lo, hi = sorted((side * x0, side * (x0 + w)))
            out.append((lo, y, hi, y + h))
    return out
