"""A query's predicate: the geometry Q in the table CRS and the test a row's geometry must pass
(intersects, within, contains), with the conditions on a row's bbox it implies (Havasu's inclusive
projection), for windows that may wrap across ±180."""

from __future__ import annotations

import math
from dataclasses import dataclass

import shapely

from streaming.kernels.antimeridian import window_intervals

BBox = tuple[float, float, float, float]
PREDICATES = ("intersects", "within", "contains")
XMIN, YMIN, XMAX, YMAX = range(4)  # indices into BBOX_FIELDS
# A necessary condition on one bbox field of a matching row: (field index, "<=" or ">=", value).
Condition = tuple[int, str, float]


@dataclass(frozen=True)
class Predicate:
    """Rows whose geometry `kind`s `geometry`: intersects Q, is within Q, or contains Q.

    Q is in the table CRS. It must be non-empty, finite and valid: GEOS gives no reliable
    answers about invalid polygons.
    """

    kind: str
    geometry: shapely.Geometry
    # A window across the anti-meridian: its (xmin, xmax) with xmin > xmax; `geometry` is then its
    # two halves, [xmin, 180] and [-180, xmax].
    wrapped_x: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.kind not in PREDICATES:
            raise ValueError(f"predicate {self.kind!r}: expected one of {', '.join(PREDICATES)}")
        if not isinstance(self.geometry, shapely.Geometry):
            raise ValueError(f"{self.kind}: expected a shapely geometry, got {type(self.geometry).__name__}")
        problem = _geometry_problem(self.geometry)
        if problem:
            raise ValueError(f"{self.kind} geometry {_short(self.geometry.wkt)!r}: {problem}")

    @classmethod
    def from_wkt(cls, kind: str, text: str) -> Predicate:
        """The predicate with Q read from WKT; errors name the text."""
        if kind not in PREDICATES:
            raise ValueError(f"predicate {kind!r}: expected one of {', '.join(PREDICATES)}")
        try:
            geometry = shapely.from_wkt(text)
        except (shapely.errors.ShapelyError, ValueError, TypeError) as exc:
            raise ValueError(f"{kind} WKT {_short(text)!r}: not well-known text ({exc})") from None
        if geometry is None:
            raise ValueError(f"{kind} WKT {_short(text)!r}: not well-known text")
        problem = _geometry_problem(geometry)
        if problem:
            raise ValueError(f"{kind} WKT {_short(text)!r}: {problem}")
        return cls(kind, geometry)

    @classmethod
    def from_bbox(cls, bbox: BBox) -> Predicate:
        """Intersects the window `bbox` (edges included); a degenerate window is a line or point.
        A window with xmin > xmax crosses the anti-meridian (longitudes, tables read the short way)."""
        xmin, ymin, xmax, ymax = _validated_bbox(tuple(bbox), f"bbox {tuple(bbox)!r}", wrapped=True)
        if xmin <= xmax:
            return cls("intersects", window_geometry((xmin, ymin, xmax, ymax)))
        halves = shapely.union(window_geometry((xmin, ymin, 180.0, ymax)), window_geometry((-180.0, ymin, xmax, ymax)))
        return cls("intersects", halves, wrapped_x=(xmin, xmax))

    def x_intervals(self) -> list[tuple[float, float]]:
        """For tables read the short way: intervals (lo, hi) of which every match's x range
        (xmin, xmax), plain or wrapped, passes one by `x_overlaps`: Q's x range, or the two of a
        wrapped window. For contains, (Q's xmax, Q's xmin): then `x_overlaps` asks a plain range
        to hold Q's and a wrapped one to hold it on either side of ±180."""
        if self.wrapped_x is not None:
            return window_intervals(*self.wrapped_x)
        xmin, _, xmax, _ = self.bounds
        return [(xmax, xmin)] if self.kind == "contains" else [(xmin, xmax)]

    @property
    def bounds(self) -> BBox:
        xmin, ymin, xmax, ymax = self.geometry.bounds
        return (float(xmin), float(ymin), float(xmax), float(ymax))

    def bbox_conditions(self) -> list[Condition]:
        """Conditions every matching row's bbox meets: the predicate's inclusive projection."""
        qxmin, qymin, qxmax, qymax = self.bounds
        overlaps = [(XMIN, "<=", qxmax), (XMAX, ">=", qxmin), (YMIN, "<=", qymax), (YMAX, ">=", qymin)]
        if self.kind == "intersects":
            return overlaps
        if self.kind == "within":
            # geometry within Q => bbox within Q's bbox. The overlap conditions follow from these
            # for any bbox with xmin <= xmax, but stated they also bound the other end of each
            # column's range, which is what min/max statistics can test.
            return [(XMIN, ">=", qxmin), (XMAX, "<=", qxmax), (YMIN, ">=", qymin), (YMAX, "<=", qymax), *overlaps]
        # geometry contains Q => Q within geometry => Q's bbox within the row's bbox.
        return [(XMIN, "<=", qxmin), (XMAX, ">=", qxmax), (YMIN, "<=", qymin), (YMAX, ">=", qymax)]

    def prunes_by_shape(self) -> bool:
        """Whether testing an MBR against Q itself can prune more than against Q's bbox.

        For intersects and within, a file can hold a match only if its MBR intersects Q. For
        contains, "MBR contains Q" is the same as "MBR contains Q's bbox", which the conditions
        already test; and when Q is its own bbox, the conditions are the whole test too.
        """
        return self.kind != "contains" and not self.geometry.equals(self.geometry.envelope)


def _geometry_problem(geometry: shapely.Geometry) -> str | None:
    if geometry.is_empty:
        return "the geometry is empty"
    if not all(math.isfinite(v) for v in geometry.bounds):
        return "the coordinates must be finite"
    if not geometry.is_valid:
        return f"not a valid geometry ({shapely.is_valid_reason(geometry)})"
    return None


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_bbox(text: str) -> BBox:
    """'xmin,ymin,xmax,ymax' as four finite floats with ymin <= ymax and xmin <= xmax, or
    xmin > xmax for longitudes across the anti-meridian (both within [-180, 180])."""
    parts = text.split(",")
    if len(parts) != 4:
        raise ValueError(f"bbox {text!r}: expected four numbers 'xmin,ymin,xmax,ymax', got {len(parts)} values")
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"bbox {text!r}: every value must be a number") from None
    return _validated_bbox(values, f"bbox {text!r}", wrapped=True)


def _validated_bbox(values: tuple[float, ...], label: str, wrapped: bool = False) -> BBox:
    if len(values) != 4:
        raise ValueError(f"{label}: expected (xmin, ymin, xmax, ymax)")
    xmin, ymin, xmax, ymax = (float(v) for v in values)
    if not all(math.isfinite(v) for v in (xmin, ymin, xmax, ymax)):
        raise ValueError(f"{label}: values must be finite numbers")
    if xmin > xmax and not (wrapped and -180.0 <= xmax and xmin <= 180.0):
        raise ValueError(
            f"{label}: xmin {xmin:g} is greater than xmax {xmax:g}"
            + (" (a window across the anti-meridian has both within [-180, 180])" if wrapped else "")
        )
    if ymin > ymax:
        raise ValueError(f"{label}: ymin {ymin:g} is greater than ymax {ymax:g}")
    return (xmin, ymin, xmax, ymax)


def window_geometry(bbox: BBox) -> shapely.Geometry:
    # A zero-width window is a line or a point; as a polygon it would be invalid and GEOS's
    # answers about it unreliable.
    xmin, ymin, xmax, ymax = bbox
    if xmin == xmax and ymin == ymax:
        return shapely.Point(xmin, ymin)
    if xmin == xmax or ymin == ymax:
        return shapely.LineString([(xmin, ymin), (xmax, ymax)])
    return shapely.box(xmin, ymin, xmax, ymax)
