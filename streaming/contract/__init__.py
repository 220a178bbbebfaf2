"""Table contracts: what a table holds and how events map onto it (schemas/*.json), seen by every stage.
core.py: Contract, parse_contract, load_contract; terms.py: vocabulary, ContractError; types.py: column types;
columns.py: columns and their ids; parts.py, partition.py, sources.py."""

from __future__ import annotations

from streaming.contract.core import (
    Contract,
    check_fresh_ids,
    crs_area_of_use,
    load_contract,
    parse_contract,
)
from streaming.contract.partition import parse_retention
from streaming.contract.parts import Column
from streaming.contract.sources import JsonFields
from streaming.contract.terms import (
    ASSET_KEY_SOURCE,
    BBOX_FIELDS,
    CELL_PROPERTY_PREFIX,
    DEBEZIUM_SOURCES,
    DEFAULT_TARGET_FILE_BYTES,
    EVENT_TIME_PROPERTY,
    FORMATS,
    JSON_SOURCE_PREFIX,
    ContractError,
)
from streaming.contract.types import PRIMITIVE_TYPES, primitive_type, regular_types, type_name

__all__ = [
    "ASSET_KEY_SOURCE",
    "BBOX_FIELDS",
    "CELL_PROPERTY_PREFIX",
    "Column",
    "PRIMITIVE_TYPES",
    "Contract",
    "ContractError",
    "DEBEZIUM_SOURCES",
    "DEFAULT_TARGET_FILE_BYTES",
    "EVENT_TIME_PROPERTY",
    "FORMATS",
    "JSON_SOURCE_PREFIX",
    "JsonFields",
    "check_fresh_ids",
    "crs_area_of_use",
    "load_contract",
    "parse_contract",
    "parse_retention",
    "primitive_type",
    "type_name",
    "regular_types",
]
