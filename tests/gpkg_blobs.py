"""GeoPackage binary geometries built by hand from GeoPackage 1.3 §2.1.3, for the tests, the fuzz
harness and the benchmarks (deliberately not the decoder's own code): an 8-byte header ("GP",
version, flags, srs_id), an optional envelope and ISO WKB."""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

import numpy as np
import shapely

# envelope contents indicator -> the envelope's values, in order
ENVELOPE_FIELDS = {
    0: (),
    1: ("minx", "maxx", "miny", "maxy"),
    2: ("minx", "maxx", "miny", "maxy", "minz", "maxz"),
    3: ("minx", "maxx", "miny", "maxy", "minm", "maxm"),
    4: ("minx", "maxx", "miny", "maxy", "minz", "maxz", "minm", "maxm"),
}


def envelope_of(geometry: shapely.Geometry, kind: int) -> list[float]:
    """The envelope values of a geometry for an envelope contents indicator."""
    coords = shapely.get_coordinates(geometry, include_z=True, include_m=True)
    minx, miny, maxx, maxy = shapely.bounds(geometry).tolist()
    values = {"minx": minx, "maxx": maxx, "miny": miny, "maxy": maxy}
    if coords.size:
        values |= {"minz": coords[:, 2].min(), "maxz": coords[:, 2].max()}
        values |= {"minm": coords[:, 3].min(), "maxm": coords[:, 3].max()}
    return [float(values.get(name, np.nan)) for name in ENVELOPE_FIELDS[kind]]


def header(
    srs_id: int = 0,
    kind: int = 0,
    little: bool = True,
    empty: bool = False,
    extended: bool = False,
    envelope: list[float] | None = None,
    version: int = 0,
    magic: bytes = b"GP",
    extra_flags: int = 0,
) -> bytes:
    order = "<" if little else ">"
    flags = int(little) | (kind << 1) | (0x10 if empty else 0) | (0x20 if extended else 0) | extra_flags
    out = magic + bytes([version, flags]) + struct.pack(order + "i", srs_id)
    return out + struct.pack(order + f"{len(envelope or [])}d", *(envelope or []))


def gpkg(
    geometry: shapely.Geometry | bytes,
    srs_id: int = 0,
    kind: int | None = None,
    little: bool = True,
    wkb_little: bool | None = None,
    **header_args,
) -> bytes:
    """A GeoPackage geometry: the header (its envelope computed from the geometry unless given),
    then the geometry as ISO WKB (or the WKB bytes given). `kind` None: Kart's choice."""
    if isinstance(geometry, bytes):
        wkb, shape = geometry, shapely.from_wkb(geometry)
    else:
        shape = geometry
        order = little if wkb_little is None else wkb_little
        wkb = shapely.to_wkb(shape, output_dimension=4, byte_order=int(order), flavor="iso")
    empty = bool(shapely.is_empty(shape))
    if kind is None:
        kind = kart_envelope_kind(shape)
    header_args.setdefault("empty", empty)
    if "envelope" not in header_args:
        header_args["envelope"] = envelope_of(shape, kind) if not empty else [np.nan] * len(ENVELOPE_FIELDS[kind])
    return header(srs_id=srs_id, kind=kind, little=little, **header_args) + wkb


def kart_envelope_kind(geometry: shapely.Geometry) -> int:
    """Kart's rule (table datasets V3, "Geometry encoding"): points and empty geometries have no
    envelope, geometries with Z an XYZ envelope, the others an XY one."""
    if shapely.is_empty(geometry) or shapely.get_type_id(geometry) == 0:
        return 0
    return 2 if shapely.has_z(geometry) else 1


def kart(geometry: shapely.Geometry) -> bytes:
    """A geometry as Kart writes it: little-endian header and WKB, srs_id 0, Kart's envelope."""
    return gpkg(geometry, srs_id=0, kind=kart_envelope_kind(geometry), little=True)


def write_geopackage(path: Path, table: str, rows: list[tuple[int, str, bytes]], srs_id: int, srs_name: str) -> None:
    """A minimal GeoPackage file: the required metadata tables and one feature table
    (fid, name, geom) holding the blobs given."""
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA application_id = 1196444487")  # 'GPKG'
        con.execute("PRAGMA user_version = 10300")
        con.executescript(
            """
            CREATE TABLE gpkg_spatial_ref_sys (srs_name TEXT NOT NULL, srs_id INTEGER PRIMARY KEY,
              organization TEXT NOT NULL, organization_coordsys_id INTEGER NOT NULL,
              definition TEXT NOT NULL, description TEXT);
            CREATE TABLE gpkg_contents (table_name TEXT NOT NULL PRIMARY KEY, data_type TEXT NOT NULL,
              identifier TEXT UNIQUE, description TEXT DEFAULT '', last_change DATETIME,
              min_x DOUBLE, min_y DOUBLE, max_x DOUBLE, max_y DOUBLE, srs_id INTEGER);
            CREATE TABLE gpkg_geometry_columns (table_name TEXT NOT NULL, column_name TEXT NOT NULL,
              geometry_type_name TEXT NOT NULL, srs_id INTEGER NOT NULL, z TINYINT NOT NULL,
              m TINYINT NOT NULL, CONSTRAINT pk_geom_cols PRIMARY KEY (table_name, column_name));
            """
        )
        con.executemany(
            "INSERT INTO gpkg_spatial_ref_sys VALUES (?, ?, ?, ?, ?, ?)",
            [
                ("Undefined cartesian SRS", -1, "NONE", -1, "undefined", None),
                ("Undefined geographic SRS", 0, "NONE", 0, "undefined", None),
                (srs_name, srs_id, "EPSG", srs_id, "(see EPSG)", None),
            ],
        )
        con.execute(
            "INSERT INTO gpkg_contents (table_name, data_type, identifier, srs_id) VALUES (?, 'features', ?, ?)",
            (table, table, srs_id),
        )
        con.execute("INSERT INTO gpkg_geometry_columns VALUES (?, 'geom', 'GEOMETRY', ?, 2, 0)", (table, srs_id))
        con.execute(f'CREATE TABLE "{table}" (fid INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, geom BLOB)')
        con.executemany(f'INSERT INTO "{table}" (fid, name, geom) VALUES (?, ?, ?)', rows)
        con.commit()
    finally:
        con.close()


def read_geopackage(path: Path, table: str) -> list[tuple[int, str, bytes]]:
    """The (fid, name, geometry blob) rows of a feature table, as sqlite3 reads them."""
    con = sqlite3.connect(path)
    try:
        column = con.execute("SELECT column_name FROM gpkg_geometry_columns WHERE table_name = ?", (table,)).fetchone()[
            0
        ]
        return [
            (fid, name, bytes(blob))
            for fid, name, blob in con.execute(f'SELECT fid, name, "{column}" FROM "{table}" ORDER BY fid')
        ]
    finally:
        con.close()
