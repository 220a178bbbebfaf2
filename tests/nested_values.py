"""Generated column types and values for the round-trip tests of nested and typed columns: a seeded
generator of contract types (structs, lists, maps, decimals, dates, times, timestamps, UUIDs, fixed
and binary, nested up to a depth) and of values of them, with each value's JSON spelling and the
value every reader must give back, in one plain form (`plain`) that readers' own forms reduce to."""

from __future__ import annotations

import base64
import datetime
import decimal
import uuid
from typing import Any

import numpy as np

PRIMITIVES = (
    "string",
    "int",
    "long",
    "double",
    "boolean",
    "date",
    "time",
    "timestamp",
    "timestamptz",
    "uuid",
    "decimal(12, 2)",
    "decimal(38, 9)",
    "fixed[4]",
    "binary",
)
EPOCH = datetime.datetime(1970, 1, 1)


def random_type(rng: np.random.Generator, depth: int, names: list[str] | None = None) -> Any:
    """A contract type spelling, nested at most `depth` levels."""
    roll = rng.random()
    if depth <= 0 or roll < 0.45:
        return PRIMITIVES[rng.integers(len(PRIMITIVES))]
    if roll < 0.7:
        count = int(rng.integers(1, 4))
        return {
            "type": "struct",
            "fields": [
                {"name": f"f{i}", "type": random_type(rng, depth - 1), "required": bool(rng.random() < 0.2)}
                for i in range(count)
            ],
        }
    if roll < 0.88:
        return {"type": "list", "element": random_type(rng, depth - 1)}
    return {"type": "map", "key": "string", "value": random_type(rng, depth - 1)}


def random_value(rng: np.random.Generator, kind: Any, null_share: float = 0.15) -> tuple[Any, Any]:
    """(the JSON value, the plain value a reader gives back) of a value of `kind`, null at times."""
    if rng.random() < null_share:
        return None, None
    if isinstance(kind, dict):
        if kind["type"] == "struct":
            sent, back = {}, {}
            for field in kind["fields"]:
                value, plain_value = random_value(rng, field["type"], 0.0 if field.get("required") else null_share)
                if value is not None or rng.random() < 0.5:
                    sent[field["name"]] = value
                back[field["name"]] = plain_value
            return sent, back
        if kind["type"] == "list":
            pairs = [random_value(rng, kind["element"]) for _ in range(int(rng.integers(0, 4)))]
            return [s for s, _ in pairs], [b for _, b in pairs]
        pairs = {f"k{i}": random_value(rng, kind["value"]) for i in range(int(rng.integers(0, 3)))}
        return {k: s for k, (s, _) in pairs.items()}, {k: b for k, (_, b) in pairs.items()}
    return _primitive(rng, kind)


def _primitive(rng: np.random.Generator, kind: str) -> tuple[Any, Any]:
    if kind == "string":
        text = "".join(rng.choice(list('abcé漢 z"\\'), size=int(rng.integers(0, 8))))
        return text, text
    if kind == "int":
        value = int(rng.integers(-(2**31), 2**31))
        return value, value
    if kind == "long":
        value = int(rng.integers(-(2**62), 2**62))
        return value, value
    if kind == "double":
        value = float(rng.normal(0, 1e6))
        return value, value
    if kind == "boolean":
        value = bool(rng.random() < 0.5)
        return value, value
    if kind == "date":
        day = datetime.date(1900, 1, 1) + datetime.timedelta(days=int(rng.integers(0, 80_000)))
        return day.isoformat(), day
    if kind == "time":
        micros = int(rng.integers(0, 86_400_000_000))
        value = (EPOCH + datetime.timedelta(microseconds=micros)).time()
        return value.isoformat(), value
    if kind in ("timestamp", "timestamptz"):
        micros = int(rng.integers(0, 4_000_000_000_000_000))
        value = EPOCH + datetime.timedelta(microseconds=micros)
        return value.isoformat() + ("Z" if kind == "timestamptz" else ""), value
    if kind == "uuid":
        value = uuid.UUID(bytes=rng.bytes(16))
        return str(value), value
    if kind.startswith("decimal"):
        precision, scale = (int(p) for p in kind[len("decimal(") : -1].split(","))
        # Whole digits from 64-bit draws: numpy draws no integer wider than that.
        digits = int("".join(str(d) for d in rng.integers(0, 10, precision))) * (1 if rng.random() < 0.5 else -1)
        value = decimal.Decimal(digits).scaleb(-scale)
        return str(value), value
    if kind == "fixed[4]":
        text = "".join(rng.choice(list("abcd"), size=4))
        return text, text.encode()
    text = "".join(rng.choice(list("xyz01"), size=int(rng.integers(0, 6))))
    return text, text.encode()


def plain(value: Any, kind: Any) -> Any:
    """A value as a reader gave it, in the form `random_value` gives back, by its type: maps as
    dicts (pyarrow gives key/value pairs), UUIDs as UUID (text or bytes elsewhere), binaries as
    bytes, zoned timestamps as naive UTC."""
    if value is None:
        return None
    if isinstance(kind, dict):
        if kind["type"] == "struct":
            value = value if isinstance(value, dict) else value.asDict()
            return {f["name"]: plain(value.get(f["name"]), f["type"]) for f in kind["fields"]}
        if kind["type"] == "list":
            return [plain(v, kind["element"]) for v in value]
        pairs = value.items() if isinstance(value, dict) else value
        return {k: plain(v, kind["value"]) for k, v in pairs}
    if kind == "uuid":
        return (
            value
            if isinstance(value, uuid.UUID)
            else uuid.UUID(**({"bytes": value} if isinstance(value, bytes) else {"hex": value}))
        )
    if kind in ("binary", "fixed[4]"):
        return bytes(value)
    if kind == "timestamptz" and value.tzinfo is not None:
        return value.astimezone(datetime.UTC).replace(tzinfo=None)
    return value


def empty_for_null(value: Any, kind: Any) -> Any:
    """`value` with its null lists and maps of structs made empty, on both sides of a comparison
    with pyiceberg 0.12's reader, which rebuilds those arrays from their offsets alone and reads
    some of their nulls as empty (apache/iceberg-python#3833); the data files hold the nulls,
    which the other readers give back."""
    if not isinstance(kind, dict):
        return value
    if kind["type"] == "struct":
        if value is None:
            return None
        return {f["name"]: empty_for_null(value[f["name"]], f["type"]) for f in kind["fields"]}
    inner = kind["element"] if kind["type"] == "list" else kind["value"]
    holds_structs = isinstance(inner, dict) and inner["type"] == "struct"
    if value is None:
        return ([] if kind["type"] == "list" else {}) if holds_structs else None
    if kind["type"] == "list":
        return [empty_for_null(v, inner) for v in value]
    return {k: empty_for_null(v, inner) for k, v in value.items()}


def as_geojson_out(value: Any, kind: Any) -> Any:
    """A plain value as `geoingest query` writes it in a GeoJSON property: nesting kept, a map an
    object, a date or time in ISO 8601, bytes in base64, a decimal or a UUID as text."""
    if value is None:
        return None
    if isinstance(kind, dict):
        if kind["type"] == "struct":
            return {f["name"]: as_geojson_out(value[f["name"]], f["type"]) for f in kind["fields"]}
        if kind["type"] == "list":
            return [as_geojson_out(v, kind["element"]) for v in value]
        return {k: as_geojson_out(v, kind["value"]) for k, v in value.items()}
    if isinstance(value, datetime.datetime) and kind == "timestamptz":
        return value.replace(tzinfo=datetime.UTC).isoformat()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, decimal.Decimal):
        scale = int(kind[len("decimal(") : -1].split(",")[1])
        exact = decimal.Context(prec=76)  # 38 digits need more than the default context's 28
        return str(value.quantize(decimal.Decimal(1).scaleb(-scale), context=exact))
    if isinstance(value, uuid.UUID):
        return str(value)
    return value
