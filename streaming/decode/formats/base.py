"""What an input format is to the decoder: the per-batch state it fills, and its small interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from streaming.contract import Contract
from streaming.decode.rejects import Reason, Rejects
from streaming.decode.schema_registry import RegistrySettings


@dataclass
class Exploded:
    """Records that make several rows each (a STAC Item read as one row per raster asset): the
    decoder repeats each record's Kafka fields over its rows, and the format reads each row's part."""

    # the record (index into the batch as it came) of each row
    parents: np.ndarray
    # each record's parsed document (None where it did not parse, or was not read), and why not
    docs: list[Any]
    problems: list[tuple[Reason, str] | None]
    # the part of its record each row stands for (an asset key), None where the record is one row
    parts: list[str | None]


@dataclass
class Decoded:
    """What the formats read of a batch, one slot per record; validation, reprojection and the
    column mapping go on from it."""

    rejects: Rejects
    # shapely geometry of each record (None where none was made: a reject, or a plain point)
    geoms: np.ndarray
    # the stored WKB of a geometry already in its stored form (a WKB input read as it is), else None
    wkb: np.ndarray
    # the EPSG code each geometry is in
    srids: np.ndarray
    # x, y of each plain point, which gets no geometry object; NaN elsewhere
    points_xy: np.ndarray
    # the Feature id and properties of GeoJSON records (null for the other formats)
    feature_ids: pa.Array
    properties: dict[str, pa.Array]
    # the values of the `json.<path>` columns of JSON events, by path (a path absent: all null)
    fields: dict[str, pa.Array] = field(default_factory=dict)
    # Rasters (format "stac"): each row's raster struct, and its WGS84 bounds (Havasu's raster
    # bounds, wrapped across ±180), which the covering takes instead of the footprint's (NaN: none)
    raster: pa.Array | None = None
    bounds: np.ndarray | None = None
    # Set when the format's records make several rows each (see Exploded).
    exploded: Exploded | None = None
    # Records that delete their key (a change event's delete): their key columns only, no geometry.
    deletes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # Values a change event did not carry (Debezium's placeholder of a TOASTed value an update left
    # unchanged): per property, the records whose value it is (set to null); and the valid records
    # whose geometry it is, which get none (the upsert pass keeps the key's current one).
    unavailable: dict[str, np.ndarray] = field(default_factory=dict)
    geometry_unavailable: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @classmethod
    def empty(
        cls, n: int, table_epsg: int, property_types: dict[str, pa.DataType], rejects: Rejects | None = None
    ) -> Decoded:
        return cls(
            rejects=rejects if rejects is not None else Rejects(n),
            geoms=np.full(n, None, dtype=object),
            wkb=np.full(n, None, dtype=object),
            srids=np.full(n, table_epsg, dtype=np.int64),
            points_xy=np.full((n, 2), np.nan),
            feature_ids=pa.nulls(n, pa.string()),
            properties={name: pa.nulls(n, t) for name, t in property_types.items()},
            deletes=np.zeros(n, dtype=bool),
            geometry_unavailable=np.zeros(n, dtype=bool),
        )


class InputFormat(ABC):
    """One input format: which values it claims (by their first significant byte) and how it reads
    them into a `Decoded`. A format rejects the records it cannot read (its own reasons and
    format_not_accepted); the geometry rules of the table are checked after it, for every format.

    To add a format: a module in streaming/decode/formats/ with a subclass, listed in
    streaming/decode/formats/__init__.py, its name in FORMATS of streaming/contract/terms.py."""

    # The contract `formats` names this format reads (WKB reads two: "wkb" and "ewkb").
    names: ClassVar[tuple[str, ...]]
    # First significant byte (after JSON whitespace) of the values it claims.
    first_bytes: ClassVar[tuple[int, ...]]
    # How unknown_format's detail names it ("a JSON object", "WKB") and its first bytes ("'{'").
    described: ClassVar[str]
    first_bytes_shown: ClassVar[tuple[str, ...]]
    # First bytes it does not claim but knows a reason for (a JSON array is no Feature).
    refused_first_bytes: ClassVar[dict[int, tuple[Reason, str]]] = {}
    # Formats that claim values more narrowly than by their first byte (a WKT keyword) claim them
    # before the others (GeoPackage's 'G').
    precedence: ClassVar[int] = 0

    @classmethod
    def active(cls, contract: Contract) -> bool:
        """Whether the decoder of this contract routes values to it at all (of the two readings of a
        JSON object, GeoJSON Feature and plain JSON event, the contract names one)."""
        return True

    def claims(self, values: pa.Array, first: np.ndarray) -> np.ndarray:
        """Which values are this format's, given their first significant byte (-1: none or rejected)."""
        return np.isin(first, self.first_bytes)

    # Values in the Confluent wire format (schema registry): a contract that names such a format
    # is read by the registry formats it names alone (their 0x00 is big-endian WKB's first byte).
    registry_encoded: ClassVar[bool] = False

    def __init__(self, contract: Contract, max_nesting: int, property_types: dict[str, pa.DataType]):
        self.contract = contract
        self.max_nesting = max_nesting
        self.property_types = property_types

    # Whether a null value with a key is this format's (a tombstone it reads with `decode_tombstones`).
    reads_tombstones: ClassVar[bool] = False

    def decode_tombstones(self, keys: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        """Reads the Kafka keys at `rows` of records with a null value (tombstones) into `out`."""
        raise NotImplementedError(f"{type(self).__name__} reads no tombstones")

    def use_registry(self, settings: RegistrySettings) -> None:
        """The schema registry a registry-encoded format reads its schemas from (others need none)."""
        return None

    def explode(self, values: pa.Array, live: np.ndarray) -> Exploded | None:
        """How many rows each of the live values makes, when a record may make several (None: one
        each, the default). Called on the whole batch before `decode`, which then sees the rows."""
        return None

    @abstractmethod
    def decode(self, values: pa.Array, rows: np.ndarray, out: Decoded) -> None:
        """Reads the values at `rows` (indices into the batch, none rejected yet) into `out`."""
