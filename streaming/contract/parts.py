"""The parts of a contract that every section reads: its columns, its geometry column, its
clustering and its schema evolution, each as parsed and checked."""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.types import IcebergType

from streaming.contract.terms import COLUMN_TYPES


@dataclass(frozen=True)
class Column:
    id: int
    name: str
    type: str
    required: bool
    sources: tuple[str, ...]

    @property
    def iceberg_type(self) -> IcebergType:
        return COLUMN_TYPES[self.type]


@dataclass(frozen=True)
class GeometrySpec:
    id: int
    name: str
    types: tuple[str, ...]
    dimensions: tuple[str, ...]
    epsg: int
    encoding: str
    invalid_polygons: str  # "reject" or "repair"
    # "short": in a geographic CRS, an edge whose longitudes are more than 180 degrees apart goes
    # the short way across ±180 and its bbox is wrapped (xmin > xmax), see docs/antimeridian.md;
    # "planar": coordinates are a plane (the only reading of a projected CRS).
    antimeridian: str = "planar"

    @property
    def crs(self) -> str:
        return f"EPSG:{self.epsg}"


@dataclass(frozen=True)
class Clustering:
    hilbert_bits: int
    extent: tuple[float, float, float, float]
    target_file_bytes: int
    row_group_rows: int


@dataclass(frozen=True)
class SchemaEvolution:
    """What happens to a property no column maps: "off" ignores it (counted and logged), "add-columns"
    makes it an optional column of the type its values have, within these limits."""

    mode: str = "off"
    max_new_columns_per_batch: int = 20
    max_columns: int = 500
    # A new column's name: what every reader (Spark, DuckDB, Trino) takes unquoted.
    name_pattern: str = r"^[a-z_][a-z0-9_]{0,62}$"
