"""What maintenance would do, from facts about a table: the policy (ages, sizes, counts), which
partitions retention drops, which small files are compacted together in which bins along the
Hilbert curve (never across partitions), and which snapshots expire. Pure: records in, plans out, no table touched; streaming/maintenance/maintain.py carries the plans
out against a table."""

from __future__ import annotations

import calendar
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from streaming.contract import parse_retention

# In the order they run: retention first (nothing is compacted only to be dropped), expiry after
# it (expiry is what frees the files of dropped partitions).
STEPS = ("retention", "compact", "expire", "orphans")


@dataclass(frozen=True)
class MaintenancePolicy:
    """When maintenance touches what. Ages in seconds, sizes in bytes."""

    # Files below this are compacted; 0: three quarters of the contract's target file size.
    small_file_bytes: int = 0
    # Files added more recently are left alone: fresh data is not rewritten again and again.
    min_file_age_s: float = 3600.0
    # Input bytes one rewrite holds in memory at most (a bin); larger sets are split along the curve.
    max_bin_bytes: int = 512 * 1024 * 1024
    # A bin of fewer files is not worth rewriting.
    min_files_per_bin: int = 2
    # Manifests are merged when the current snapshot has more data manifests than this.
    max_manifests: int = 8
    # Manifests are merged into files of about this size (Iceberg's default).
    manifest_target_bytes: int = 8 * 1024 * 1024
    # Snapshots older than this may expire (Iceberg's default: 5 days) ...
    snapshot_max_age_s: float = 5 * 24 * 3600.0
    # ... but the newest this many never do.
    keep_snapshots: int = 100
    # Beyond the newest this many, snapshots expire whatever their age (0: no limit). Every snapshot
    # kept costs each commit (metadata.json is read and written whole): bench/maintenance.py.
    max_snapshots: int = 100
    # Unreferenced files younger than this may belong to a commit in flight.
    orphan_min_age_s: float = 3600.0
    # How long a maintainer holds the table's maintenance lease without renewing it (streaming/maintenance/lease.py).
    lease_s: float = 900.0
    # Upsert tables: once the keys the delete files list come to this share of the rows of the files
    # they reach, compaction rewrites all those files (then readers need the deletes no more).
    delete_ratio: float = 0.3
    # Rows older than this many seconds are dropped, whole partitions at a time; None: as the
    # table's contract says (its "retention"), and for ever if it says nothing.
    retention_s: int | None = None

    @classmethod
    def from_settings(cls, settings) -> MaintenancePolicy:
        """The policy the `maintenance_*` settings (and `retention`) describe (app/settings.py)."""
        retention = getattr(settings, "retention", "")
        return cls(
            **{
                f.name: getattr(settings, f"maintenance_{f.name}")
                for f in dataclasses.fields(cls)
                if hasattr(settings, f"maintenance_{f.name}")
            },
            retention_s=parse_retention(retention, "retention (setting)") if retention else None,
        )

    def __post_init__(self) -> None:
        for name in ("small_file_bytes", "min_file_age_s", "snapshot_max_age_s", "orphan_min_age_s", "max_snapshots"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)} must not be negative")
        for name in ("max_bin_bytes", "min_files_per_bin", "manifest_target_bytes", "keep_snapshots"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)} must be at least 1")
        if not 0 < self.delete_ratio <= 1:
            raise ValueError(f"delete_ratio: {self.delete_ratio} must be in (0, 1]")
        if self.lease_s <= 0:
            raise ValueError(f"lease_s: {self.lease_s} must be positive")
        if self.max_manifests < 1:
            raise ValueError(f"max_manifests: {self.max_manifests} must be at least 1")
        if self.retention_s is not None and self.retention_s < 1:
            raise ValueError(f"retention_s: {self.retention_s} must be at least 1")


def parse_steps(text: str) -> tuple[str, ...]:
    """'compact,expire' -> ('compact', 'expire'), in the order they run; errors name the step."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in STEPS]
    if unknown or not names:
        raise ValueError(f"maintenance steps {text!r}: expected some of {', '.join(STEPS)}")
    return tuple(s for s in STEPS if s in names)


# -- plans ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LiveFile:
    """A data file of the current snapshot, as compaction plans with it."""

    path: str
    file_size_in_bytes: int
    record_count: int
    hilbert_key: int | None  # of its extent's centre; None without bbox bounds
    # When the snapshot that added it was committed; once that expired, when it was written (its
    # name, streaming/write/data_files.py data_file_name); None if neither is known.
    added_ms: int | None
    spec_id: int = 0  # the partition spec it was written with
    partition: tuple[Any, ...] = ()  # its partition values, in the order of that spec's fields
    # The upper bound of the retention column in its manifest entry (microseconds), if it has one.
    time_upper_us: int | None = None

    @property
    def partition_key(self) -> tuple[int, tuple[Any, ...]]:
        """Which partition it belongs to: files of different specs never share one."""
        return self.spec_id, self.partition


@dataclass(frozen=True)
class Bin:
    """Files rewritten together: a contiguous stretch of the curve within one partition of one
    spec, sorted by key."""

    files: tuple[LiveFile, ...]

    @property
    def spec_id(self) -> int:
        return self.files[0].spec_id

    @property
    def partition(self) -> tuple[Any, ...]:
        return self.files[0].partition

    @property
    def bytes(self) -> int:
        return sum(f.file_size_in_bytes for f in self.files)

    @property
    def records(self) -> int:
        return sum(f.record_count for f in self.files)

    @property
    def key_range(self) -> tuple[int | None, int | None]:
        return self.files[0].hilbert_key, self.files[-1].hilbert_key


def compaction_candidates(
    files: Iterable[LiveFile], small_file_bytes: int, min_age_ms: int, now_ms: int
) -> list[LiveFile]:
    """Files worth rewriting: small, old enough, and with bounds (so they can be placed on the curve).

    A file of unknown age (its adding snapshot expired and its name carries no write time) is
    older than any snapshot still kept, so old enough."""
    return [
        f
        for f in files
        if f.file_size_in_bytes < small_file_bytes
        and f.hilbert_key is not None
        and (f.added_ms is None or now_ms - f.added_ms >= min_age_ms)
    ]


def _partition_order(key: tuple[int, tuple[Any, ...]]) -> tuple:
    # Partition values of one field share a type, but may be null: nulls first, then by value.
    spec_id, values = key
    return spec_id, tuple((v is not None, v if v is not None else 0) for v in values)


def plan_bins(candidates: Sequence[LiveFile], max_bin_bytes: int, min_files: int) -> list[Bin]:
    """Pack files into bins, each within one partition of one spec: the files of a partition
    ordered along the Hilbert curve and cut into as few runs of at most `max_bin_bytes` as will do,
    of about equal size; bins of fewer than `min_files` dropped. A compacted file thus spans no
    more time (or place) than its partition does.

    A file larger than `max_bin_bytes` is a bin of its own (and, alone, dropped)."""
    partitions: dict[tuple[int, tuple[Any, ...]], list[LiveFile]] = {}
    for f in candidates:
        partitions.setdefault(f.partition_key, []).append(f)
    bins: list[Bin] = []
    for key in sorted(partitions, key=_partition_order):
        bins += _bins_along_the_curve(partitions[key], max_bin_bytes, min_files)
    return bins


def _bins_along_the_curve(candidates: Sequence[LiveFile], max_bin_bytes: int, min_files: int) -> list[Bin]:
    ordered = sorted(candidates, key=lambda f: (f.hilbert_key, f.path))
    if not ordered:
        return []
    total = sum(f.file_size_in_bytes for f in ordered)
    share = total / max(1, math.ceil(total / max_bin_bytes))
    bins: list[list[LiveFile]] = [[]]
    filled = 0
    for f in ordered:
        size = f.file_size_in_bytes
        # Cut when this file would overflow the bin, or when the bin already holds its fair share.
        if bins[-1] and (filled + size > max_bin_bytes or filled >= share):
            bins.append([])
            filled = 0
        bins[-1].append(f)
        filled += size
    return [Bin(tuple(b)) for b in bins if len(b) >= min_files]


@dataclass(frozen=True)
class SnapshotFacts:
    snapshot_id: int
    sequence_number: int
    timestamp_ms: int
    carries_history: bool


@dataclass(frozen=True)
class ExpiryPlan:
    expire: tuple[int, ...]  # snapshot ids that may go now
    # Old enough, but not yet covered by a carried writer history: a new carrier must come first.
    uncovered: tuple[int, ...]


def plan_expiry(
    snapshots: Sequence[SnapshotFacts],
    protected: set[int],
    now_ms: int,
    max_age_ms: int,
    keep: int,
    max_snapshots: int = 0,
) -> ExpiryPlan:
    """Snapshots older than `max_age_ms` or beyond the newest `max_snapshots` (0: no such limit),
    except the newest `keep` and the `protected` ones (branch and tag heads), that a carried history
    covers (committed before the newest carrier, which itself stays); the rest of them are `uncovered`."""
    ordered = sorted(snapshots, key=lambda s: s.sequence_number)
    kept = {s.snapshot_id for s in ordered[-keep:]} | set(protected)
    beyond_limit = {s.snapshot_id for s in ordered[:-max_snapshots]} if max_snapshots else set()
    old = [
        s
        for s in ordered
        if s.snapshot_id not in kept and (now_ms - s.timestamp_ms > max_age_ms or s.snapshot_id in beyond_limit)
    ]
    carriers = [s for s in ordered if s.carries_history]
    covered_before = carriers[-1].sequence_number if carriers else None
    expire = tuple(s.snapshot_id for s in old if covered_before is not None and s.sequence_number < covered_before)
    uncovered = tuple(
        s.snapshot_id
        for s in old
        if s.snapshot_id not in expire and not (carriers and s.snapshot_id == carriers[-1].snapshot_id)
    )
    return ExpiryPlan(expire, uncovered)


# -- retention --------------------------------------------------------------------------------------
_US = 1_000_000


def partition_time_range_us(transform: str, value: int) -> tuple[int, int]:
    """[start, end) in microseconds since the epoch of a time partition value, as Iceberg stores it:
    years, months, days or hours since 1970-01-01 00:00 UTC."""
    if transform == "hour":
        return value * 3600 * _US, (value + 1) * 3600 * _US
    if transform == "day":
        return value * 86400 * _US, (value + 1) * 86400 * _US
    if transform == "month":
        first, after = (1970 + value // 12, value % 12 + 1), (1970 + (value + 1) // 12, (value + 1) % 12 + 1)
        return calendar.timegm((*first, 1, 0, 0, 0)) * _US, calendar.timegm((*after, 1, 0, 0, 0)) * _US
    if transform == "year":
        return (
            calendar.timegm((1970 + value, 1, 1, 0, 0, 0)) * _US,
            calendar.timegm((1971 + value, 1, 1, 0, 0, 0)) * _US,
        )
    raise ValueError(f"{transform!r} is not a time transform (year, month, day, hour)")


@dataclass(frozen=True)
class TimeField:
    """A time partition field of a spec: its place in the partition tuple and its transform."""

    position: int
    transform: str


@dataclass(frozen=True)
class RetentionPlan:
    horizon_us: int
    drop: tuple[LiveFile, ...]  # every file of every partition wholly past the horizon
    partitions: tuple[tuple[int, tuple[Any, ...]], ...]  # (spec id, partition values) dropped
    # Partitions the horizon cuts through: kept whole until all of them is past.
    partly_past: tuple[tuple[int, tuple[Any, ...]], ...]
    # Files with neither a time partition nor an upper bound of the time column: never dropped.
    undated: int

    @property
    def rows(self) -> int:
        return sum(f.record_count for f in self.drop)

    @property
    def bytes(self) -> int:
        return sum(f.file_size_in_bytes for f in self.drop)


def plan_retention(
    files: Iterable[LiveFile], time_fields: Mapping[int, Sequence[TimeField]], horizon_us: int
) -> RetentionPlan:
    """The files whose every row is older than the horizon, decided per partition: a partition of a
    time field (`time_fields`, by spec id) goes once its whole range ends at or before the horizon,
    and is kept whole while the horizon cuts through it. Files of a spec without a time field (as
    before a partition evolution) go when the upper bound of the time column is before the horizon.
    Either way whole files, so dropping them rewrites nothing."""
    drop: list[LiveFile] = []
    dropped: set[tuple[int, tuple[Any, ...]]] = set()
    partly: set[tuple[int, tuple[Any, ...]]] = set()
    undated = 0
    for f in files:
        ranges = [
            partition_time_range_us(field.transform, f.partition[field.position])
            for field in time_fields.get(f.spec_id, ())
            if f.partition[field.position] is not None
        ]
        if ranges:
            start, end = max(r[0] for r in ranges), min(r[1] for r in ranges)
            if end <= horizon_us:
                drop.append(f)
                dropped.add(f.partition_key)
            elif start < horizon_us:
                partly.add(f.partition_key)
        elif f.time_upper_us is not None:
            if f.time_upper_us < horizon_us:
                drop.append(f)
        else:
            undated += 1
    return RetentionPlan(
        horizon_us,
        tuple(sorted(drop, key=lambda f: f.path)),
        tuple(sorted(dropped, key=_partition_order)),
        tuple(sorted(partly, key=_partition_order)),
        undated,
    )


# -- manifests ------------------------------------------------------------------------------------
def plan_manifests(
    entries: Sequence[tuple[int, tuple[Any, ...]]], bytes_per_entry: float, target_bytes: int
) -> list[list[int]]:
    """How manifest merging regroups the data files of a snapshot, given each file's (spec id,
    partition values): the indices of the files of each new manifest. A manifest holds one spec
    (Iceberg requires it), its files ordered by partition, and is cut at a partition boundary once
    it reaches `target_bytes` (at about `bytes_per_entry` a file), so each manifest covers a short
    run of partitions and its partition summary lets a scan skip it (a day's files in one or two
    manifests, not spread over all of them). A partition larger than the target is cut within."""
    order = sorted(range(len(entries)), key=lambda i: _partition_order(entries[i]))
    per_manifest = max(1, int(target_bytes // max(bytes_per_entry, 1.0)))
    groups: list[list[int]] = []
    for i in order:
        if groups:
            last = groups[-1]
            same_spec = entries[last[-1]][0] == entries[i][0]
            boundary = entries[last[-1]] != entries[i]
            if same_spec and (len(last) < per_manifest or not boundary) and len(last) < 2 * per_manifest:
                last.append(i)
                continue
        groups.append([i])
    return groups
