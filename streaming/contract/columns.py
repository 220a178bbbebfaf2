"""The contract's columns: each parsed and checked (its type, its sources), the nested ids it leaves
out numbered as Iceberg numbers a new table's, every id its field's own, and the primary key."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from streaming.contract.parts import Column
from streaming.contract.terms import (
    ASSET_KEY_SOURCE,
    DEBEZIUM_SOURCES,
    JSON_PATH,
    JSON_SOURCE_PREFIX,
    KAFKA_SOURCES,
    ContractError,
    known_keys_only,
    require,
)
from streaming.contract.types import assign_ids, nested_fields, parse_type


def parse_column(raw: Any, where: str, unassigned: Iterator[int]) -> Column:
    if not isinstance(raw, dict):
        raise ContractError(f"{where}: expected an object")
    known_keys_only(raw, "columns[]", f"{where}.")
    name = require(raw, "name", str, f"{where}.")
    if "type" not in raw:
        raise ContractError(f"{where}.type: missing")
    kind = parse_type(raw["type"], f"{where}.type", unassigned)
    required = raw.get("required", False)
    if not isinstance(required, bool):
        raise ContractError(f"{where}.required: expected true or false, got {required!r}")
    sources = tuple(require(raw, "from", list, f"{where}."))
    if not sources:
        raise ContractError(f"{where}.from: name at least one event field")
    for j, src in enumerate(sources):
        if not isinstance(src, str) or not is_source(src):
            raise ContractError(
                f"{where}.from[{j}]: {src!r} is not an event field "
                "(id, properties.<name>, json.<path>, kafka.key|timestamp|topic|partition|offset, "
                "kafka.headers.<name>, asset.key)"
            )
    return Column.of_type(require(raw, "id", int, f"{where}."), name, kind, required, sources)


def number_nested_fields(columns: tuple[Column, ...], top_level: int) -> tuple[Column, ...]:
    """The columns with the nested ids the contract left out assigned, as Iceberg numbers a new
    table's: from the first id after the `top_level` fields, skipping the ids the contract gave."""
    given = {fid for c in columns for fid, _ in nested_fields(c.iceberg_type) if fid > 0}
    counter = itertools.count(top_level + 1)

    def next_id() -> int:
        while (candidate := next(counter)) in given:
            pass
        return candidate

    return tuple(replace(c, nested=assign_ids(c.nested, next_id)) if c.nested is not None else c for c in columns)


def is_source(src: str) -> bool:
    if src in ("id", ASSET_KEY_SOURCE) or src in KAFKA_SOURCES or src in DEBEZIUM_SOURCES:
        return True
    for prefix in ("properties.", "kafka.headers."):
        if src.startswith(prefix) and len(src) > len(prefix):
            return True
    return src.startswith(JSON_SOURCE_PREFIX) and bool(JSON_PATH.match(src.removeprefix(JSON_SOURCE_PREFIX)))


def declared_ids(columns: tuple[Column, ...], geometry_id: int, bbox_id: int | None) -> list[tuple[str, int]]:
    """The top-level ids the contract states; `bbox_id` None: a covering the table does not store."""
    declared = [(f"columns[{i}].id", c.id) for i, c in enumerate(columns)]
    return declared + [("geometry.id", geometry_id)] + ([] if bbox_id is None else [("bbox.id", bbox_id)])


def check_unique_ids(columns: tuple[Column, ...], geometry_id: int, bbox_id: int | None) -> None:
    """Every id the contract states or leaves to be assigned, nested ones too, is its field's own.
    (The bbox's fields, flat columns, cells and raster take theirs from a new table's layout, or the
    table's: table_contract and `table evolve` check those against the table.)"""
    seen: dict[int, str] = {geometry_id: "geometry", **({} if bbox_id is None else {bbox_id: "bbox"})}
    for column in columns:
        for fid, path in [
            (column.id, column.name),
            *((i, f"{column.name}.{p}") for i, p in nested_fields(column.iceberg_type)),
        ]:
            if fid in seen and seen[fid] != path:
                raise ContractError(f"{path}: id {fid} is already the id of {seen[fid]}")
            seen[fid] = path


def parse_primary_key(raw: dict, columns: tuple[Column, ...], mode: str) -> tuple[str, ...]:
    """The primary key's columns: as named, or in upsert mode by default the columns the Kafka key feeds."""
    if "primary_key" not in raw:
        if mode != "upsert":
            return ()
        from_key = tuple(c.name for c in columns if "kafka.key" in c.sources)
        if not from_key:
            raise ContractError(
                "primary_key: missing, and no column comes from kafka.key to stand for it; "
                "name the columns that address a feature, or map one from kafka.key"
            )
        return from_key[:1]
    names = raw["primary_key"]
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ContractError(f"primary_key: expected a column name or a list of them, got {raw['primary_key']!r}")
    by_name = {c.name: c for c in columns}
    for i, name in enumerate(names):
        column = by_name.get(name)
        if column is None:
            raise ContractError(f"primary_key[{i}]: {name!r} is not one of the columns {list(by_name)}")
        if not column.required:
            raise ContractError(f"primary_key[{i}]: column {name!r} must be required (a key is never null)")
        if column.type not in ("string", "int", "long", "date", "timestamp", "timestamptz", "binary"):
            raise ContractError(f"primary_key[{i}]: column {name!r} is a {column.type}, which cannot address a feature")
    if len(set(names)) != len(names):
        raise ContractError(f"primary_key: a column is named twice in {names}")
    return tuple(names)
