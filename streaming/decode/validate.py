"""The table's geometry rules, for every input format alike: types, dimensions, vertex limit,
finite coordinates, a known CRS, reprojection to the table CRS, its area of use and the invalid
polygon policy. Vectorised over the batch; a plain point (no geometry object, its x and y only)
meets only the rules that can refuse it."""

from __future__ import annotations

import numpy as np
import shapely
from pyproj.exceptions import CRSError, ProjError

from streaming.contract import Contract
from streaming.decode.budget import RepairBudget
from streaming.decode.crs import UnknownSrid, known_crs, reproject, transformer, valid_area
from streaming.decode.formats.base import Decoded
from streaming.decode.rejects import Reason, Rejects

_TYPE_NAMES = {
    0: "Point",
    1: "LineString",
    2: "LinearRing",
    3: "Polygon",
    4: "MultiPoint",
    5: "MultiLineString",
    6: "MultiPolygon",
    7: "GeometryCollection",
}
_TYPE_NAME_BY_ID = np.array([*_TYPE_NAMES.values(), "Unknown"], dtype=object)


class GeometryRules:
    def __init__(self, contract: Contract, max_vertices: int, max_record_seconds: float = 2.0):
        self.contract = contract
        self.max_vertices = max_vertices
        self._repair = RepairBudget(max_record_seconds)
        self._table_epsg = contract.geometry.epsg
        self._area = valid_area(self._table_epsg)

    def apply(self, decoded: Decoded) -> None:
        """Rejects what breaks a rule; leaves every other geometry in the table CRS (`decoded.geoms`,
        and `decoded.wkb` None where the stored form must be written anew)."""
        self._check_kind(decoded.geoms, decoded.srids, decoded.rejects, decoded.points_xy)
        decoded.geoms = self._to_table_crs(decoded.geoms, decoded.srids, decoded.rejects, decoded.wkb)
        self._check_area_and_shape(decoded.geoms, decoded.rejects, decoded.wkb, decoded.points_xy)

    def _check_kind(self, geoms: np.ndarray, srids: np.ndarray, rejects: Rejects, points_xy: np.ndarray) -> None:
        """Type, dimensions, vertex count, finite coordinates and a known horizontal CRS."""
        spec = self.contract.geometry
        plain = ~np.isnan(points_xy[:, 0])
        # A plain point is a finite XY Point in the table CRS: only the contract's types,
        # dimensions and vertex limit can refuse it.
        points = np.flatnonzero(rejects.ok & plain)
        if "Point" not in spec.types:
            rejects.add(
                points, Reason.GEOMETRY_TYPE_NOT_ALLOWED, f"geometry type Point is not one of {list(spec.types)}"
            )
        if "XY" not in spec.dimensions:
            rejects.add(points, Reason.DIMENSION_NOT_ALLOWED, f"dimensions XY are not one of {list(spec.dimensions)}")
        if self.max_vertices < 1:
            rejects.add(points, Reason.TOO_MANY_VERTICES, f"1 vertices exceed max_vertices={self.max_vertices}")
        live = np.flatnonzero(rejects.ok & ~plain)
        g = geoms[live]
        rejects.add(live[shapely.is_empty(g)], Reason.EMPTY_GEOMETRY, "the geometry is empty")

        names = type_names(shapely.get_type_id(g))
        wrong_type = ~np.isin(names, spec.types)
        rejects.add(
            live[wrong_type],
            Reason.GEOMETRY_TYPE_NOT_ALLOWED,
            [f"geometry type {t} is not one of {list(spec.types)}" for t in names[wrong_type]],
        )

        dims = np.array(["XY", "XYZ", "XYM", "XYZM"], dtype=object)[
            shapely.has_z(g).astype(int) + 2 * shapely.has_m(g).astype(int)
        ]
        wrong_dims = ~np.isin(dims, spec.dimensions)
        rejects.add(
            live[wrong_dims],
            Reason.DIMENSION_NOT_ALLOWED,
            [f"dimensions {d} are not one of {list(spec.dimensions)}" for d in dims[wrong_dims]],
        )

        vertices = shapely.get_num_coordinates(g)
        too_many = vertices > self.max_vertices
        rejects.add(
            live[too_many],
            Reason.TOO_MANY_VERTICES,
            [f"{v} vertices exceed max_vertices={self.max_vertices}" for v in vertices[too_many]],
        )

        coords, index = shapely.get_coordinates(g, include_z=True, return_index=True)
        z_expected = shapely.has_z(g)[index]
        finite = np.isfinite(coords[:, 0]) & np.isfinite(coords[:, 1]) & (np.isfinite(coords[:, 2]) | ~z_expected)
        bad_geom = np.unique(index[~finite])
        rejects.add(live[bad_geom], Reason.NON_FINITE_COORDINATES, "a coordinate is NaN or infinite")

        live = np.flatnonzero(rejects.ok)
        for srid in np.unique(srids[live]):
            try:
                crs = known_crs(int(srid))
            except UnknownSrid as exc:
                rejects.add(live[srids[live] == srid], Reason.UNKNOWN_SRID, str(exc))
                continue
            if not (crs.is_geographic or crs.is_projected):
                rejects.add(
                    live[srids[live] == srid],
                    Reason.UNKNOWN_SRID,
                    f"SRID {srid} is EPSG:{srid} ({crs.name}), not a horizontal geographic or projected CRS",
                )

    def _to_table_crs(self, geoms: np.ndarray, srids: np.ndarray, rejects: Rejects, wkb: np.ndarray) -> np.ndarray:
        """Geometries in another CRS reprojected (their stored WKB dropped), unless PROJ cannot or
        they lie far outside their own CRS's area."""
        out = geoms.copy()
        live = rejects.ok
        for srid in np.unique(srids[live]):
            if srid == self._table_epsg:
                continue
            rows = np.flatnonzero(live & (srids == srid))
            has_m = shapely.has_m(geoms[rows])
            rejects.add(
                rows[has_m],
                Reason.REPROJECTION_FAILED,
                f"geometries with M cannot be reprojected from EPSG:{srid}; send them in EPSG:{self._table_epsg}",
            )
            rows = rows[~has_m]
            try:
                area = valid_area(int(srid))
                transformer(int(srid), self._table_epsg)
            except (ValueError, ProjError, CRSError) as exc:
                rejects.add(
                    rows,
                    Reason.REPROJECTION_FAILED,
                    f"no transformation from EPSG:{srid} to EPSG:{self._table_epsg}: {exc}",
                )
                continue
            # PROJ extrapolates far outside a CRS's area and lands somewhere plausible but wrong.
            xmin, ymin, xmax, ymax = area
            if xmin > xmax:  # a geographic area across the antimeridian (NAD83, NZGD2000): longitudes wrap
                xmin, xmax = -180.0, 180.0
            slack_x, slack_y = (xmax - xmin) / 2, (ymax - ymin) / 2
            b = shapely.bounds(geoms[rows])
            far = (
                (b[:, 0] < xmin - slack_x)
                | (b[:, 2] > xmax + slack_x)
                | (b[:, 1] < ymin - slack_y)
                | (b[:, 3] > ymax + slack_y)
            )
            rejects.add(
                rows[far],
                Reason.OUTSIDE_CRS_AREA,
                [
                    f"bounds ({r[0]:.6g}, {r[1]:.6g}, {r[2]:.6g}, {r[3]:.6g}) lie far outside the area "
                    f"of EPSG:{srid} ({xmin:.6g}, {ymin:.6g}, {xmax:.6g}, {ymax:.6g})"
                    for r in b[far]
                ],
            )
            rows = rows[~far]
            moved = reproject(geoms[rows], int(srid), self._table_epsg)
            bounds = shapely.bounds(moved)
            failed = ~np.all(np.isfinite(bounds), axis=1)
            rejects.add(
                rows[failed],
                Reason.REPROJECTION_FAILED,
                f"PROJ could not transform the coordinates from EPSG:{srid} to EPSG:{self._table_epsg}",
            )
            out[rows] = moved
            wkb[rows] = None
        return out

    def _check_area_and_shape(
        self, geoms: np.ndarray, rejects: Rejects, wkb: np.ndarray, points_xy: np.ndarray
    ) -> None:
        """Bounds inside the table CRS's area; polygons valid, or repaired under `repair`."""
        live = np.flatnonzero(rejects.ok)
        b = bounds_of(geoms[live], points_xy[live])
        xmin, ymin, xmax, ymax = self._area
        if xmin > xmax:  # a geographic area across the antimeridian: any longitude may be in it
            xmin, xmax = -180.0, 180.0
        outside = (b[:, 0] < xmin) | (b[:, 1] < ymin) | (b[:, 2] > xmax) | (b[:, 3] > ymax)
        rejects.add(
            live[outside],
            Reason.OUTSIDE_CRS_AREA,
            [
                f"bounds ({r[0]:.6g}, {r[1]:.6g}, {r[2]:.6g}, {r[3]:.6g}) leave the valid area of "
                f"EPSG:{self._table_epsg} ({xmin:.6g}, {ymin:.6g}, {xmax:.6g}, {ymax:.6g})"
                for r in b[outside]
            ],
        )

        live = np.flatnonzero(rejects.ok)
        polygonal = np.isin(shapely.get_type_id(geoms[live]), (3, 6))
        candidates = live[polygonal]
        invalid = candidates[~shapely.is_valid(geoms[candidates])]
        if invalid.size == 0:
            return
        reasons = shapely.is_valid_reason(geoms[invalid])
        if self.contract.geometry.invalid_polygons == "reject":
            rejects.add(invalid, Reason.INVALID_POLYGON, [f"invalid polygon: {r}" for r in reasons])
            return
        # GEOS's "structure" repair (the rules of JTS's GeometryFixer): rings are shells and
        # holes, overlapping shells are unioned. Measured on invalid OSM building shapes, 8x
        # faster than the "linework" default, which keeps every edge of the input.
        repaired, over = self._repair.make_valid(geoms[invalid])
        rejects.add(
            invalid[over],
            Reason.TIME_BUDGET_EXCEEDED,
            [
                f"repairing this invalid polygon ({n} vertices: {r}) took longer than "
                f"max_record_seconds={self._repair.seconds:g}"
                for n, r in zip(shapely.get_num_coordinates(geoms[invalid[over]]), reasons[over])
            ],
        )
        invalid, repaired, reasons = invalid[~over], repaired[~over], reasons[~over]
        repaired_types = type_names(shapely.get_type_id(repaired))
        fits = np.isin(repaired_types, self.contract.geometry.types) & ~shapely.is_empty(repaired)
        geoms[invalid[fits]] = repaired[fits]
        wkb[invalid[fits]] = None
        rejects.add(
            invalid[~fits],
            Reason.INVALID_POLYGON,
            [
                f"invalid polygon ({r}); its repair is a {t}, which the table does not allow"
                for r, t in zip(reasons[~fits], repaired_types[~fits])
            ],
        )


def bounds_of(geoms: np.ndarray, points_xy: np.ndarray) -> np.ndarray:
    """xmin, ymin, xmax, ymax of each geometry, or of each plain point (NaN where neither)."""
    bounds = shapely.bounds(geoms)
    plain = ~np.isnan(points_xy[:, 0])
    bounds[plain] = np.tile(points_xy[plain], 2)
    return bounds


def type_names(type_ids: np.ndarray) -> np.ndarray:
    """GeoJSON type name of each shapely type id ("Unknown" for none or a type GeoJSON lacks)."""
    known = (type_ids >= 0) & (type_ids < len(_TYPE_NAMES))
    return _TYPE_NAME_BY_ID[np.where(known, type_ids, len(_TYPE_NAMES))]
