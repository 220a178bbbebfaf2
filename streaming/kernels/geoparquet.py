"""GeoParquet 1.1 file metadata, built from a file's geometries: pure functions, no I/O."""

from __future__ import annotations

import json
from functools import lru_cache

from streaming.contract import BBOX_FIELDS, Contract

GEOPARQUET_VERSION = "1.1.0"


@lru_cache(maxsize=16)
def projjson(epsg: int) -> dict:
    from pyproj import CRS

    return CRS.from_epsg(epsg).to_json_dict()


def geo_metadata(contract: Contract, geometry_types: list[str], bbox: tuple[float, float, float, float]) -> dict:
    """The `geo` key of a data file: one primary WKB column, covered by the bbox struct column
    where the table stores it."""
    g = contract.geometry
    return {
        "version": GEOPARQUET_VERSION,
        "primary_column": g.name,
        "columns": {
            g.name: {
                "encoding": "WKB",
                "geometry_types": geometry_types,
                "crs": projjson(g.epsg),
                "bbox": [float(v) for v in bbox],
                **(
                    {"covering": {"bbox": {name: [contract.bbox_name, name] for name in BBOX_FIELDS}}}
                    if contract.bbox_stored
                    else {}
                ),
            }
        },
    }


def geo_metadata_bytes(contract: Contract, geometry_types: list[str], bbox: tuple[float, float, float, float]) -> bytes:
    return json.dumps(geo_metadata(contract, geometry_types, bbox), separators=(",", ":")).encode()
