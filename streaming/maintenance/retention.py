"""Retention: whole partitions older than the horizon leave the table, as a metadata-only delete.

The horizon is now minus the retention (the `retention` setting, else the contract's
`"retention": "30 days"`). A partition of a time field (year, month, day or hour of the time
column) goes once its whole range ends at or before the horizon: its data files are removed from
the current snapshot in one Iceberg "delete" snapshot, no data file read or rewritten. A partition
the horizon cuts through is kept whole until all of it is past, so rows live up to one partition
longer than the retention (a day with day partitions), never shorter. Files written under a spec
without a time field (before a partition evolution) go when the upper bound of the time column in
their manifest entry is before the horizon, whole files again.

The dropped files stay readable by the snapshots before the delete (time travel) and are deleted
from storage when the last of those expires (the expire step). Rows that arrive late for a dropped
partition land in a new file of it, which the next run drops.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _OverwriteFiles
from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, YearTransform
from pyiceberg.types import PrimitiveType

from streaming.maintenance import native
from streaming.maintenance.commits import Retrier, adopt, carry, current_snapshot_id
from streaming.maintenance.compaction import live_files
from streaming.maintenance.plan import (
    MaintenancePolicy,
    RetentionPlan,
    TimeField,
    partition_time_range_us,
    plan_retention,
)
from streaming.read.query import table_contract
from streaming.table.commit import single_attempt_view
from streaming.table.native import is_native

_TIME_TRANSFORMS = ((YearTransform, "year"), (MonthTransform, "month"), (DayTransform, "day"), (HourTransform, "hour"))


@dataclass(frozen=True)
class RetentionReport:
    retention_s: int
    horizon: str  # ISO 8601, UTC: rows older than this are gone (whole partitions at a time)
    column: str  # the time column the horizon is measured on
    partitions_dropped: int
    files_dropped: int
    rows_dropped: int
    bytes_dropped: int  # freed from storage when the snapshots before the drop expire
    partitions_partly_past: int  # the horizon cuts through them: kept whole for now
    files_undated: int  # neither a time partition nor a bound of the time column: kept
    snapshot_id: int | None  # the delete snapshot
    conflicts: int
    seconds: float


def _transform_name(transform) -> str | None:
    for kind, name in _TIME_TRANSFORMS:
        if isinstance(transform, kind):
            return name
    return None


def time_column(table: Table) -> int:
    """The field id of the column the table is partitioned by time on: the source of the year,
    month, day or hour fields of its current spec (else of an older one). Errors name the table."""
    name = ".".join(table.name())
    specs = table.specs()
    ordered = [specs[table.metadata.default_spec_id]] + [s for i, s in sorted(specs.items(), reverse=True)]
    for spec in ordered:
        sources = {f.source_id for f in spec.fields if _transform_name(f.transform)}
        if len(sources) > 1:
            columns = sorted(table.schema().find_column_name(s) or str(s) for s in sources)
            raise ValueError(f"retention: table {name} is partitioned by time on {columns}; which one is unclear")
        if sources:
            return sources.pop()
    shown = "; ".join(f"spec {i}: [{', '.join(str(f) for f in s.fields)}]" for i, s in sorted(specs.items()))
    raise ValueError(
        f"retention: table {name} has no time partition (year, month, day or hour of a timestamp column) to drop; "
        f"its partition specs: {shown}"
    )


def time_fields(table: Table, source_id: int) -> dict[int, tuple[TimeField, ...]]:
    """Each spec's time fields on the column, by spec id."""
    out: dict[int, tuple[TimeField, ...]] = {}
    for spec_id, spec in table.specs().items():
        fields = []
        for position, field in enumerate(spec.fields):
            transform = _transform_name(field.transform)
            if transform and field.source_id == source_id:
                fields.append(TimeField(position, transform))
        out[spec_id] = tuple(fields)
    return out


def retention_of(table: Table, policy: MaintenancePolicy) -> int | None:
    """Seconds rows are kept: the policy's (the `retention` setting), else the table contract's."""
    if policy.retention_s is not None:
        return policy.retention_s
    if "geoingest.contract" not in table.properties:
        return None
    return table_contract(table).retention_s


def plan_table_retention(table: Table, retention_s: int, now_ms: int) -> tuple[RetentionPlan, int, dict[str, DataFile]]:
    """What retention would drop from the table as last refreshed, the time column's id, and the
    manifest entries' data files of what it would drop, by path."""
    source_id = time_column(table)
    contract = table_contract(table)
    horizon_us = (now_ms - retention_s * 1000) * 1000
    fields = time_fields(table, source_id)
    files = live_files(table, contract, source_id, _may_hold_past_rows(table, fields, horizon_us))
    plan = plan_retention([live for live, _ in files], fields, horizon_us)
    drop = {f.path for f in plan.drop}
    return plan, source_id, {f.file_path: f for _, f in files if f.file_path in drop}


def _may_hold_past_rows(
    table: Table, fields: dict[int, tuple[TimeField, ...]], horizon_us: int
) -> Callable[[ManifestFile], bool]:
    """Whether a data manifest must be read: not when its partition summary shows that its oldest
    time partition starts at or after the horizon (and none is null), so its files are all kept.
    Manifests merged by partition, and the newest batches' manifests, are skipped so: retention
    reads the manifests of the old partitions, not the whole table's."""
    specs, schema = table.specs(), table.schema()

    def read(manifest: ManifestFile) -> bool:
        spec = specs.get(manifest.partition_spec_id)
        summaries = manifest.partitions or []
        for field in fields.get(manifest.partition_spec_id, ()):
            if spec is None or field.position >= len(summaries):
                return True
            summary = summaries[field.position]
            if summary.contains_null or summary.lower_bound is None:
                continue
            partition_field = spec.fields[field.position]
            result_type = partition_field.transform.result_type(schema.find_type(partition_field.source_id))
            oldest = from_bytes(cast(PrimitiveType, result_type), summary.lower_bound)
            if partition_time_range_us(field.transform, int(cast(int, oldest)))[0] >= horizon_us:
                return False
        return True

    return read


def apply_retention(
    table: Table,
    policy: MaintenancePolicy,
    dry_run: bool = False,
    now_ms: int | None = None,
    retrier: Retrier | None = None,
) -> RetentionReport | None:
    """Drop the partitions wholly past the horizon in one delete snapshot (None when no retention
    is set). Each attempt plans again on a freshly loaded table, so a conflict with an ingest
    commit only delays it."""
    started = time.monotonic()
    table.refresh()
    retention_s = retention_of(table, policy)
    if retention_s is None or table.current_snapshot() is None:
        return None
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    retrier = retrier or Retrier(table)
    planned = [plan_table_retention(table, retention_s, now_ms)]
    plan, source_id, _ = planned[0]
    attempts = [0]

    def attempt() -> int | None:
        attempts[0] += 1
        if attempts[0] > 1:  # the table changed since: plan again on it as it is now
            table.refresh()
            planned[0] = plan_table_retention(table, retention_s, now_ms)
        data_files = planned[0][2]
        if not data_files:
            return None
        view = single_attempt_view(table)
        if is_native(view):
            with retrier.native_fence(view) as fence:
                paths = [f.file_path for f in data_files.values()]
                snapshot_id = native.remove(view, paths, carry(view, "retention"), fence)
            table.refresh()
            return snapshot_id
        with retrier.transaction(view) as tx:
            # pyiceberg's overwrite producer, as a "delete" snapshot: it removes exactly the files
            # it is given (its own delete() decides by a row filter, and may rewrite files).
            delete = _OverwriteFiles(
                operation=Operation.DELETE,
                transaction=tx,
                io=view.io,
                snapshot_properties=carry(view, "retention"),
            )
            for data_file in data_files.values():
                delete.delete_data_file(data_file)
            delete.commit()
        adopt(table, view)
        return current_snapshot_id(view)

    snapshot_id, conflicts = (None, 0) if dry_run or not plan.drop else retrier.run("retention", attempt)
    plan = planned[0][0]
    return RetentionReport(
        retention_s=retention_s,
        horizon=dt.datetime.fromtimestamp(plan.horizon_us / 1e6, dt.UTC).isoformat(),
        column=table.schema().find_column_name(source_id) or str(source_id),
        partitions_dropped=len(plan.partitions),
        files_dropped=len(plan.drop),
        rows_dropped=plan.rows,
        bytes_dropped=plan.bytes,
        partitions_partly_past=len(plan.partly_past),
        files_undated=plan.undated,
        snapshot_id=snapshot_id,
        conflicts=conflicts,
        seconds=time.monotonic() - started,
    )
