"""Reading ISO WKB headers straight from Arrow buffers, without parsing the geometries."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_BASE_NAMES = {
    1: "Point",
    2: "LineString",
    3: "Polygon",
    4: "MultiPoint",
    5: "MultiLineString",
    6: "MultiPolygon",
    7: "GeometryCollection",
}


def wkb_type_codes(wkb: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """ISO WKB type code of each value (1 Point ... 7 GeometryCollection, +1000 Z, +2000 M)."""
    if isinstance(wkb, pa.ChunkedArray):
        wkb = wkb.combine_chunks()
    wkb = wkb.cast(pa.binary())
    if wkb.null_count:
        raise ValueError("WKB column has nulls; every stored row has a geometry")
    n = len(wkb)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.frombuffer(wkb.buffers()[1], dtype=np.int32)[wkb.offset : wkb.offset + n]
    data = np.frombuffer(wkb.buffers()[2], dtype=np.uint8)
    code_bytes = np.stack([data[starts + 1 + i] for i in range(4)], axis=1).astype(np.int64)
    little = data[starts] == 1
    weights_le = np.array([1, 1 << 8, 1 << 16, 1 << 24], dtype=np.int64)
    return np.where(little, code_bytes @ weights_le, code_bytes @ weights_le[::-1])


def wkb_storage(geometry: pa.ChunkedArray) -> pa.ChunkedArray:
    """A geometry column's WKB: the storage of Parquet GEOMETRY's extension type (a native table's
    files), else the column itself."""
    if isinstance(geometry.type, pa.ExtensionType):
        return pa.chunked_array([c.storage for c in geometry.chunks], geometry.type.storage_type)
    return geometry


def geometry_type_names(wkb: pa.Array | pa.ChunkedArray) -> set[str]:
    """GeoParquet geometry_types present: 'Point', 'Polygon Z', ...

    GeoParquet 1.1 names only the Z suffix, so XYM and XYZM geometries are named by their
    base type and Z where they have one.
    """
    names = set()
    for code in np.unique(wkb_type_codes(wkb)).tolist():
        base, dims = code % 1000, code // 1000
        names.add(_BASE_NAMES[base] + (" Z" if dims in (1, 3) else ""))
    return names
