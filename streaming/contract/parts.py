"""The parts of a contract that every section reads: its columns, its geometry column, its
clustering and its schema evolution, each as parsed and checked."""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.types import IcebergType

from streaming.contract.types import primitive_type, type_name


@dataclass(frozen=True)
class Column:
    id: int
    name: str
    # A primitive's name (`long`, `decimal(12, 2)`), or struct, list or map (the type in `nested`).
    type: str
    required: bool
    sources: tuple[str, ...]
    nested: IcebergType | None = None

    @property
    def iceberg_type(self) -> IcebergType:
        if self.nested is not None:
            return self.nested
        kind = primitive_type(self.type)
        assert kind is not None, self.type  # parse_contract checked it
        return kind

    @staticmethod
    def of_type(field_id: int, name: str, kind: IcebergType, required: bool, sources: tuple[str, ...]) -> Column:
        """The column of a type as Iceberg holds it (a table's field)."""
        nested = None if kind.is_primitive else kind
        return Column(field_id, name, type_name(kind), required, sources, nested)


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
    # True: an Iceberg v3 table whose geometry column is Iceberg's `geometry` type, its files'
    # Parquet's GEOMETRY (streaming/table/native.py); False: WKB in a `binary` column of a v2 table.
    native: bool = False

    @property
    def crs(self) -> str:
        return f"EPSG:{self.epsg}"

    @property
    def native_crs(self) -> str:
        """The CRS as Iceberg's geometry type and Parquet's GEOMETRY name it: OGC:CRS84 (their
        default) for longitude/latitude, `srid:<code>` for any other."""
        return "OGC:CRS84" if self.epsg == 4326 else f"srid:{self.epsg}"


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
