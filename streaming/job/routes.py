"""Routes: which table each topic, and each record of a shared topic, lands in.

A route takes a topic by its name (`topic`) or by a regular expression over names
(`topic_pattern`, whose named groups fill the table name: `fleet\\.(?<city>[a-z]+)\\.positions` ->
`fleet.positions_{city}`), and writes to the table its `table` names, with the contract file
`contract` as the template of every table it creates. A route with a `field` splits its topic's
records over tables by a value each record carries, a Kafka header (`header:kind`), the key
(`key`) or a member of a JSON value (`json:meta.kind`), the value naming the table through `{value}`.

Parsing refuses what can be refused before a record arrives, in one line naming the route: two
routes claiming one topic name, a pattern that does not compile, a table name that uses a group
the pattern lacks or that no value could make valid. What only a topic or a record decides (a
topic two patterns match, a value that makes no valid name, a record without the field) is
answered when it comes, as a `RouteError` or a reason a record's dead letter carries.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FIELD_KINDS = ("header", "key", "json")
# A member of a JSON value a route names: Spark's JSON path takes these unquoted.
_MEMBER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYS = frozenset({"name", "topic", "topic_pattern", "field", "table", "contract"})
# A part of a table name: what every catalog and engine takes without quoting, and never a path.
_NAME_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]*")
_NOT_A_NAME = "not a table name: expected 'namespace.name', each part letters, digits, '_' or '-'"
# Java's named group, which Kafka's subscribePattern reads, in Python's spelling.
_JAVA_GROUP = re.compile(r"\(\?<([A-Za-z][A-Za-z0-9]*)>")


class RouteError(ValueError):
    """A route that cannot be followed, its message naming the route."""


@dataclass(frozen=True)
class RecordField:
    """Where a field route finds the value that names a record's table."""

    kind: str  # one of FIELD_KINDS
    path: tuple[str, ...] = ()  # the header's name, or the JSON value's members from the top (json)

    @property
    def spelled(self) -> str:
        return self.kind if self.kind == "key" else f"{self.kind}:{'.'.join(self.path)}"


@dataclass(frozen=True)
class Route:
    name: str  # how errors and logs name it: its `name`, or `routes[i]`
    contract: str  # the contract file, the template of the tables the route writes
    table: str  # the table name, or its template ({group} of the pattern, {value} of the field)
    topic: str | None = None
    topic_pattern: str | None = None  # as written (Java's spelling, which the Kafka source reads)
    field: RecordField | None = None

    @cached_property
    def matcher(self) -> re.Pattern[str] | None:
        return None if self.topic_pattern is None else _compile(self.topic_pattern)

    def claims(self, topic: str) -> bool:
        if self.topic is not None:
            return topic == self.topic
        matcher = self.matcher
        return matcher is not None and matcher.fullmatch(topic) is not None

    def table_for_topic(self, topic: str) -> str:
        """The table a topic's records land in (a field route: the template, `{value}` unfilled)."""
        if self.field is not None:
            raise RouteError(f"route {self.name}: its tables are named by each record's {self.field.spelled}")
        matcher = self.matcher
        groups: dict[str, str] = {}
        if matcher is not None:
            match = matcher.fullmatch(topic)
            if match is None:
                raise RouteError(f"route {self.name}: topic {topic!r} does not match {self.topic_pattern!r}")
            groups = {k: v for k, v in match.groupdict().items() if v is not None}
        name = self.table.format(**groups)
        if not _is_table_name(name):
            raise RouteError(f"route {self.name}: topic {topic!r} makes the table name {name!r}, {_NOT_A_NAME}")
        return name

    def makes(self, table: str) -> bool:
        """Whether a field route's template makes the table name `table` from some value."""
        if self.field is None:
            raise RouteError(f"route {self.name}: it routes whole topics, not records")
        pieces = [
            re.escape(text) + ("(.+)" if name is not None else "")
            for text, name, _, _ in string.Formatter().parse(self.table)
        ]
        return re.fullmatch("".join(pieces), table) is not None

    def tables_for_values(self, values: pa.Array) -> tuple[np.ndarray, list[str], np.ndarray]:
        """Each record's table by its field's value (`field_values`), worked out once per distinct
        value: an index into the returned names (-1: no table), and the dead-letter detail of each
        record without one (None where it has one)."""
        if self.field is None:
            raise RouteError(f"route {self.name}: it routes whole topics, not records")
        encoded = pc.dictionary_encode(values.cast(pa.binary()))
        distinct = encoded.dictionary.to_pylist()
        # Slot 0 stands for a record without the field, slot i + 1 for the i-th distinct value.
        codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) + 1
        slots = np.full(len(distinct) + 1, -1, dtype=np.int64)
        details: list[str | None] = [f"{self.field.spelled}: the record has none, so route {self.name} names no table"]
        names: list[str] = []
        for i, raw in enumerate(distinct, start=1):
            try:
                value = raw.decode("utf-8")
            except UnicodeDecodeError:
                details.append(
                    f"{self.field.spelled}: {raw[:40]!r} is not UTF-8 text, so route {self.name} names no table"
                )
                continue
            name = self.table.format(value=value)
            if _is_table_name(name):
                slots[i] = len(names)
                names.append(name)
                details.append(None)
            else:
                details.append(
                    f"{self.field.spelled}: {value!r} makes {name!r} through route {self.name}, {_NOT_A_NAME}"
                )
        return slots[codes], names, np.array(details, dtype=object)[codes]


def field_values(records: pa.RecordBatch, record_field: RecordField) -> pa.Array:
    """The bytes that name each Kafka record's table: its key, the value of its header's last
    occurrence, or the member of its JSON value (a string as its text, another value as compact
    JSON); null: the record has none (a value that is no JSON object has no member)."""
    if record_field.kind == "key":
        raw = records.column("key")
    elif record_field.kind == "json":
        raw = pa.array(
            [_member(value, record_field.path) for value in records.column("value").to_pylist()], pa.binary()
        )
    else:
        headers = records.column("headers")
        flat = headers.flatten()
        wanted = pc.equal(flat.field("key"), record_field.path[0]).fill_null(False).to_numpy(zero_copy_only=False)
        owner = np.repeat(np.arange(len(headers)), np.diff(headers.offsets.to_numpy()))
        position = np.full(len(headers), -1, dtype=np.int64)
        position[owner[wanted]] = np.flatnonzero(wanted)  # the last of a repeated header wins
        found = position >= 0
        if not found.any():  # then there may be no header at all to take from
            return pa.nulls(len(headers), pa.binary())
        taken = flat.field("value").cast(pa.binary()).take(pa.array(np.where(found, position, 0)))
        raw = pc.if_else(pa.array(found), taken, pa.nulls(len(headers), pa.binary()))
    return raw


def _member(value: bytes | None, path: tuple[str, ...]) -> bytes | None:
    """A JSON value's member, as Spark's get_json_object gives it (which the split query uses)."""
    try:
        found = json.loads(value) if value is not None else None
    except ValueError:
        return None
    for name in path:
        found = found.get(name) if isinstance(found, dict) else None
    if found is None:
        return None
    return (found if isinstance(found, str) else json.dumps(found, separators=(",", ":"))).encode()


@dataclass(frozen=True)
class Routes:
    routes: tuple[Route, ...]

    def __iter__(self):
        return iter(self.routes)

    def __len__(self) -> int:
        return len(self.routes)

    def route_of(self, topic: str) -> Route | None:
        """The route that takes a topic (None: none does); two that do are refused by name."""
        claiming = [route for route in self.routes if route.claims(topic)]
        if len(claiming) > 1:
            named = " and ".join(route.name for route in claiming)
            raise RouteError(f"topic {topic!r} is claimed by routes {named}: give it to one of them")
        return claiming[0] if claiming else None

    def subscription(self) -> str:
        """One pattern every routed topic matches, as Kafka's subscribePattern (Java) reads it."""
        parts = [re.escape(route.topic) for route in self.routes if route.topic is not None]
        parts += [route.topic_pattern for route in self.routes if route.topic_pattern is not None]
        return "|".join(f"(?:{part})" for part in parts)


def parse_routes(raw: Sequence[Mapping[str, Any]], where: str = "routes") -> Routes:
    """The routes of the settings, or a RouteError in one line naming the route and its key."""
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        raise RouteError(f"{where}: expected a list of routes, got {type(raw).__name__}")
    routes = tuple(_parse_route(entry, f"{where}[{i}]") for i, entry in enumerate(raw))
    names: dict[str, str] = {}
    for route in routes:
        if route.name in names:
            raise RouteError(f"{where}: two routes are named {route.name!r}")
        names[route.name] = route.name
    claimed: dict[str, Route] = {}
    for route in routes:
        if route.topic is None:
            continue
        if route.topic in claimed:
            raise RouteError(
                f"route {route.name}: topic {route.topic!r} is already routed by {claimed[route.topic].name}"
            )
        claimed[route.topic] = route
    for topic, route in claimed.items():
        for other in routes:
            if other is not route and other.topic_pattern is not None and other.claims(topic):
                raise RouteError(
                    f"route {other.name}: its pattern {other.topic_pattern!r} also takes topic {topic!r} "
                    f"of route {route.name}"
                )
    return Routes(routes)


def _parse_route(entry: Mapping[str, Any], where: str) -> Route:
    if not isinstance(entry, Mapping):
        raise RouteError(f"{where}: expected a table of keys, got {type(entry).__name__}")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise RouteError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    for key in entry:
        if not isinstance(entry[key], str) or not entry[key]:
            raise RouteError(f"{where}.{key}: expected a non-empty string, got {entry[key]!r}")
    name = entry.get("name", where)
    if "name" in entry:
        where = f"{where} ({name})"
    named_by = [key for key in ("topic", "topic_pattern") if key in entry]
    if len(named_by) != 1:
        raise RouteError(f"{where}: give exactly one of 'topic' and 'topic_pattern'")
    if "contract" not in entry:
        raise RouteError(f"{where}: 'contract' (the contract file of its tables) is missing")
    if "table" not in entry:
        raise RouteError(f"{where}: 'table' (the table name, or its template) is missing")
    pattern = entry.get("topic_pattern")
    groups: set[str] = set()
    if pattern is not None:
        try:
            groups = set(_compile(pattern).groupindex)
        except re.error as exc:
            raise RouteError(f"{where}.topic_pattern: {pattern!r} is no regular expression: {exc}") from None
    record_field = _parse_field(entry["field"], f"{where}.field") if "field" in entry else None
    if record_field is not None and pattern is not None:
        raise RouteError(f"{where}: a 'field' route takes one topic ('topic'), not a pattern")
    table = entry["table"]
    _check_template(table, groups | ({"value"} if record_field is not None else set()), f"{where}.table")
    return Route(
        name=name, contract=entry["contract"], table=table, topic=entry.get("topic"), topic_pattern=pattern,
        field=record_field,
    )  # fmt: skip


def _parse_field(spelled: str, where: str) -> RecordField:
    kind, _, rest = spelled.partition(":")
    if kind not in FIELD_KINDS:
        raise RouteError(f"{where}: {spelled!r} is none of key, header:<name>, json:<member>[.<member>...]")
    if kind == "key":
        if rest:
            raise RouteError(f"{where}: 'key' takes no name, got {spelled!r}")
        return RecordField("key")
    path = tuple(rest.split(".")) if kind == "json" else (rest,)
    if not rest or not all(path):
        raise RouteError(f"{where}: {spelled!r} names no {'member' if kind == 'json' else 'header'}")
    if kind == "json" and not all(_MEMBER.fullmatch(member) for member in path):
        raise RouteError(f"{where}: {spelled!r}: a member's name is letters, digits and '_', not starting with a digit")
    return RecordField(kind, path)


def _check_template(table: str, groups: set[str], where: str) -> None:
    """A table name's template: its fields are the given groups, and a value of letters makes it valid."""
    try:
        fields = [f for _, f, spec, conv in string.Formatter().parse(table) if f is not None]
    except ValueError as exc:
        raise RouteError(f"{where}: {table!r} is no name template: {exc}") from None
    for name in fields:
        if name not in groups:
            known = ", ".join(sorted(groups)) or "none"
            raise RouteError(f"{where}: {table!r} uses {{{name}}}, which the route does not give (it gives: {known})")
    example = table.format(**{g: "x" for g in groups})
    if not _is_table_name(example):
        raise RouteError(f"{where}: {table!r} makes names such as {example!r}, {_NOT_A_NAME}")


def _is_table_name(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and all(_NAME_PART.fullmatch(part) for part in parts)


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(_JAVA_GROUP.sub(r"(?P<\1>", pattern))
