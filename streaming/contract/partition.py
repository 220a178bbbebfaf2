"""The contract's partition spec (`partition`: Iceberg transforms in Spark SQL words and geohash
cells of the geometry), its event-time column (`event_time`) and its retention (`retention`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyproj import CRS

from streaming.contract.terms import (
    GEOHASH_MAX_PRECISION,
    MAX_PARTITIONS_PER_BATCH,
    PARTITION_TRANSFORMS,
    RETENTION_UNITS,
    TIME_PARTITIONS_PER_BATCH,
    TIME_TRANSFORMS,
    ContractError,
)

if TYPE_CHECKING:
    from streaming.contract.parts import Clustering, Column, GeometrySpec


@dataclass(frozen=True)
class PartitionField:
    """One field of the contract's partition spec, as written (`day(event_time)`, `geohash(geometry, 3)`)."""

    text: str
    transform: str  # one of PARTITION_TRANSFORMS
    source: str  # the column it reads
    param: int | None = None  # bucket N, truncate W, geohash precision

    @property
    def name(self) -> str:
        """The partition field's name (Iceberg's defaults), or for a cell the column that holds it."""
        if self.transform == "identity":
            return self.source
        if self.transform == "geohash":
            return f"{self.source}_geohash{self.param}"
        if self.transform == "bucket":
            return f"{self.source}_bucket_{self.param}"
        if self.transform == "truncate":
            return f"{self.source}_trunc_{self.param}"
        return f"{self.source}_{self.transform}"

    @property
    def is_cell(self) -> bool:
        return self.transform == "geohash"

    @property
    def column(self) -> str:
        """The table column the partition field reads: a cell's own column, else its source."""
        return self.name if self.is_cell else self.source

    @property
    def cell_meaning(self) -> str:
        """What a cell column holds, as its table property says: `geohash:<precision>:<geometry column>`."""
        return f"{self.transform}:{self.param}:{self.source}"


@dataclass(frozen=True)
class CellColumn:
    """A column of spatial cells the table holds, which the writer fills from the bbox covering.

    The cells a table was made with sit after the flat bbox columns (`appended` False); one a
    partition evolution added (`geoingest table evolve`) comes after every other column, optional,
    as Iceberg adds columns: the files written before it have none."""

    id: int
    field: PartitionField
    required: bool = True
    appended: bool = False

    @property
    def name(self) -> str:
        return self.field.name


def cell_field(meaning: str) -> PartitionField | None:
    """The partition field a cell column's table property describes (`geohash:<P>:<geometry>`),
    None for a kind this version does not know."""
    kind, _, rest = meaning.partition(":")
    precision, _, source = rest.partition(":")
    if kind != "geohash" or not precision.isdigit() or not source:
        return None
    return PartitionField(f"geohash({source}, {precision})", "geohash", source, int(precision))


def parse_event_time(raw: dict, columns: tuple[Column, ...]) -> str | None:
    """The event-time column: as named, else the first timestamptz column fed by kafka.timestamp."""
    if "event_time" not in raw:
        fed = [c.name for c in columns if c.type == "timestamptz" and "kafka.timestamp" in c.sources]
        return fed[0] if fed else None
    name = raw["event_time"]
    by_name = {c.name: c for c in columns}
    if not isinstance(name, str) or name not in by_name:
        raise ContractError(f"event_time: {name!r} is not one of the columns {list(by_name)}")
    if by_name[name].type != "timestamptz":
        raise ContractError(f"event_time: column {name!r} is a {by_name[name].type}, not a timestamptz")
    return name


_PARTITION_TEXT = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?:\((.*)\))?\s*$")


def parse_partition(
    raw: dict,
    columns: tuple[Column, ...],
    geometry: GeometrySpec,
    event_time: str | None,
    clustering: Clustering,
    names: list[str],
) -> tuple[PartitionField, ...]:
    """The partition spec: as the contract writes it, else `day(<event time column>)` (none without one)."""
    if "partition" not in raw:
        return (PartitionField(f"day({event_time})", "day", event_time),) if event_time else ()
    texts = raw["partition"]
    if not isinstance(texts, list):
        raise ContractError(f"partition: expected a list of transforms like ['day(event_time)'], got {texts!r}")
    by_name = {c.name: c for c in columns}
    fields: list[PartitionField] = []
    estimate = 1
    for i, text in enumerate(texts):
        where = f"partition[{i}]"
        field = _parse_partition_field(text, where, by_name, geometry)
        if field.name in names and field.is_cell:
            raise ContractError(f"{where}: {text}: its cell column {field.name!r} would take the name of a column")
        if any(f.name == field.name for f in fields):
            raise ContractError(f"{where}: {text} is already in the spec")
        if field.transform in TIME_TRANSFORMS:
            clash = next((f for f in fields if f.transform in TIME_TRANSFORMS and f.source == field.source), None)
            if clash is not None:
                raise ContractError(f"{where}: {text}: {field.source} is already partitioned by {clash.text}")
        if field.is_cell:
            estimate *= _cell_count(clustering.extent, field.param or 1)
        elif field.transform == "bucket":
            estimate *= field.param or 1
        elif field.transform in TIME_PARTITIONS_PER_BATCH:
            estimate *= TIME_PARTITIONS_PER_BATCH[field.transform]
        if estimate > MAX_PARTITIONS_PER_BATCH:
            raise ContractError(
                f"{where}: {text} would let one batch write up to {estimate:,} partitions "
                f"(over the clustering extent), more than {MAX_PARTITIONS_PER_BATCH:,}; use a coarser transform"
            )
        fields.append(field)
    return tuple(fields)


def _cell_count(extent: tuple[float, float, float, float], precision: int) -> int:
    lon_bits, lat_bits = (5 * precision + 1) // 2, 5 * precision // 2
    xmin, ymin, xmax, ymax = extent
    w = 360.0 / (1 << lon_bits)
    h = 180.0 / (1 << lat_bits)
    nx = math.floor((min(xmax, 180.0) + 180.0) / w) - math.floor((max(xmin, -180.0) + 180.0) / w) + 1
    ny = math.floor((min(ymax, 90.0) + 90.0) / h) - math.floor((max(ymin, -90.0) + 90.0) / h) + 1
    return max(1, min(nx, 1 << lon_bits)) * max(1, min(ny, 1 << lat_bits))


def _parse_partition_field(text: Any, where: str, by_name: dict[str, Column], geometry: GeometrySpec) -> PartitionField:
    if not isinstance(text, str):
        raise ContractError(f"{where}: expected a transform like 'day(event_time)', got {text!r}")
    match = _PARTITION_TEXT.match(text)
    if match is None:
        raise ContractError(f"{where}: {text!r} is not a column or a transform like 'day(event_time)'")
    head, inner = match.group(1), match.group(2)
    if inner is None:  # identity
        transform, args = "identity", [head]
    else:
        transform, args = head.lower(), [a.strip() for a in inner.split(",")]
    if transform == "h3":
        raise ContractError(f"{where}: {text}: h3 cells are not offered; use geohash({geometry.name}, <precision>)")
    if transform not in PARTITION_TRANSFORMS:
        raise ContractError(
            f"{where}: {text}: unknown transform {head!r}; expected one of {list(PARTITION_TRANSFORMS)}"
        )
    arity = {"bucket": 2, "truncate": 2, "geohash": 2}.get(transform, 1)
    if len(args) != arity or not all(args):
        usage = {"bucket": "bucket(N, column)", "truncate": "truncate(W, column)"}.get(
            transform, f"geohash({geometry.name}, precision)" if transform == "geohash" else f"{transform}(column)"
        )
        raise ContractError(f"{where}: {text}: expected {usage}")
    if transform == "geohash":
        source, param_text = args
        if source != geometry.name:
            kind = f"a {by_name[source].type} column" if source in by_name else "not a column"
            raise ContractError(
                f"{where}: {text}: geohash takes the geometry column {geometry.name!r}; {source!r} is {kind}"
            )
        param = _whole(param_text, where, text, "precision", 1, GEOHASH_MAX_PRECISION)
        if not CRS.from_epsg(geometry.epsg).is_geographic:
            raise ContractError(
                f"{where}: {text}: geohash cells are of longitude/latitude; the table CRS {geometry.crs} is projected"
            )
        return PartitionField(text, transform, source, param)
    width: int | None = None
    if transform in ("bucket", "truncate"):
        width = _whole(args[0], where, text, "N" if transform == "bucket" else "W", 1, 2**31 - 1)
        args = args[1:]
    source = args[0]
    if source == geometry.name:
        raise ContractError(
            f"{where}: {text}: {transform} cannot take the geometry; use geohash({source}, <precision>)"
        )
    if source not in by_name:
        raise ContractError(f"{where}: {text}: {source!r} is not one of the columns {list(by_name)}")
    ctype = by_name[source].type
    allowed = {
        "bucket": ("int", "long", "string", "timestamptz"),
        "truncate": ("int", "long", "string"),
        # A partition value travels from the tasks as JSON (DataFileRecord) and names a folder:
        # bytes have neither form, and a binary column (a key) is no way to group rows anyway.
        "identity": ("string", "int", "long", "float", "double", "boolean", "timestamptz"),
    }.get(transform, ("timestamptz",))
    if ctype not in allowed:
        raise ContractError(
            f"{where}: {text}: column {source!r} is a {ctype}; {transform} takes {' or '.join(allowed)}"
        )
    return PartitionField(text, transform, source, width)


def _whole(value: str, where: str, text: str, what: str, lo: int, hi: int) -> int:
    if not re.fullmatch(r"\d+", value) or not lo <= int(value) <= hi:
        raise ContractError(f"{where}: {text}: {what} {value!r} must be a whole number {lo}..{hi}")
    return int(value)


def parse_retention(text: Any, where: str = "retention") -> int:
    """'30 days' or '12 hours' -> seconds; an error that names `where` otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]+)\s*", text) if isinstance(text, str) else None
    if match is None or match.group(2) not in RETENTION_UNITS or int(match.group(1)) < 1:
        raise ContractError(f"{where}: {text!r} is not a retention; expected 'N days' or 'N hours', N at least 1")
    return int(match.group(1)) * RETENTION_UNITS[match.group(2)]


def parse_contract_retention(raw: dict, columns: tuple[Column, ...], terms: list[tuple[str, str]]) -> int | None:
    """The contract's retention in seconds, which needs a time partition (`terms`: the (transform,
    column) of the spec's time fields) of a timestamptz column: whole partitions are what retention
    drops."""
    if "retention" not in raw:
        return None
    seconds = parse_retention(raw["retention"])
    if not terms:
        raise ContractError(
            f"retention: {raw['retention']!r} needs a time partition to drop, and partition "
            f"({raw.get('partition', 'missing')!r}) has none; add e.g. 'day(<timestamptz column>)'"
        )
    types = {c.name: c.type for c in columns}
    for transform, column in terms:
        if types.get(column) != "timestamptz":
            raise ContractError(
                f"retention: the time partition {transform}({column}) is not of a timestamptz column "
                f"({column!r} is {types.get(column, 'not a column')})"
            )
    return seconds
