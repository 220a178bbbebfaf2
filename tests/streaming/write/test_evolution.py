"""Schemas that evolve (contract `schema_evolution`): property names no column maps are counted
and logged ("off") or become new optional columns ("add-columns").

The pure parts on hard-coded values; the commit of new columns by two writers at once on the
SQLite catalog; then the real service (broker, Spark, catalog) over a stream whose producers add
20 properties over time, some with values of conflicting types."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.types import DecimalType

from app.service import run
from app.settings import load_settings
from streaming.contract import Column, parse_contract
from streaming.decode.properties import PropertySeen, merged_kind, unmapped_properties
from streaming.maintenance.maintain import maintain
from streaming.maintenance.plan import MaintenancePolicy
from streaming.read.predicate import Predicate
from streaming.read.query import query
from streaming.table.catalog import create_table, open_catalog, table_contract
from streaming.table.commit import BatchCommit, Committer
from streaming.write.evolution import ColumnPlan, SchemaMoved, add_columns, plan_new_columns
from tests.conftest import CACHE_DIR, duckdb_connection, produce_records

ROOT = Path(__file__).resolve().parents[3]
DEMO = json.loads((ROOT / "schemas" / "demo_events.json").read_text())
EVOLVING = {**DEMO, "schema_evolution": {"mode": "add-columns", "max_new_columns_per_batch": 8}}
# The demo table's ids: columns 1-8, geometry 9, bbox 10 and its fields 11-14.
LAST_DEMO_ID = 14


def feature(i: int, properties: dict) -> bytes:
    point = {"type": "Point", "coordinates": [round(-170 + (i * 7.3) % 340, 4), round(-80 + (i * 3.1) % 160, 4)]}
    return json.dumps({"type": "Feature", "id": f"e{i}", "geometry": point, "properties": properties}).encode()


# -- what a batch holds ---------------------------------------------------------------------------------
def order_of(n: int):
    return np.arange(n) * 10, np.zeros(n, dtype=np.int64), np.arange(n)


def test_unmapped_properties_name_type_and_first_record_whichever_way_the_block_reads():
    docs = [
        feature(0, {"speed": 1.0, "lanes": 2}),
        feature(1, {"lanes": 2.5, "note": "x", "tags": ["a"], "gone": None}),
        feature(2, {"open": True}),
    ]
    expected = {
        "lanes": PropertySeen("double", 2, (0, 0, 0)),  # a whole number beside a fraction: double
        "note": PropertySeen("string", 1, (10, 0, 1)),
        "tags": PropertySeen('{"type":"list","element":"string"}', 1, (10, 0, 1)),
        "open": PropertySeen("boolean", 1, (20, 0, 2)),
    }
    assert unmapped_properties(pa.array(docs), {"speed"}, order_of(3)) == expected
    # A property whose values change kind makes the block reader refuse the block: read one by one,
    # the first value's kind stands (the others are rejects of that column later).
    mixed = [*docs, feature(3, {"note": 7}), b"not json"]
    assert unmapped_properties(pa.array(mixed), {"speed"}, order_of(5))["note"] == PropertySeen("string", 2, (10, 0, 1))


def test_new_columns_take_the_next_ids_in_the_order_their_names_were_first_seen():
    contract = parse_contract({**EVOLVING, "schema_evolution": {"mode": "add-columns", "max_new_columns_per_batch": 2}})
    seen = {
        "zeta": PropertySeen("long", 5, (1, 0, 0)),
        "alpha": PropertySeen("string", 1, (3, 0, 4)),
        "Bad-Name": PropertySeen("long", 1, (2, 0, 1)),
        "shape": PropertySeen("nested", 1, (2, 1, 0)),
        "late": PropertySeen("double", 1, (9, 0, 9)),
        "speed_kmh": PropertySeen("double", 1, (4, 0, 0)),
    }
    plan = plan_new_columns(contract, seen, LAST_DEMO_ID)
    assert plan.added == (
        Column(15, "zeta", "long", False, ("properties.zeta",)),
        Column(16, "alpha", "string", False, ("properties.alpha",)),
    )
    assert set(plan.ignored) == {"Bad-Name", "shape", "late", "speed_kmh"}
    assert "name_pattern" in plan.ignored["Bad-Name"] and "empty objects or arrays" in plan.ignored["shape"]
    assert "max_new_columns_per_batch (2)" in plan.ignored["speed_kmh"]
    off = plan_new_columns(parse_contract(DEMO), seen, LAST_DEMO_ID)
    assert off.added == () and set(off.ignored.values()) == {"schema_evolution is off"}


# -- two writers ---------------------------------------------------------------------------------------
def test_two_writers_adding_the_same_column_at_once_both_commit_and_a_clash_is_refused(tmp_path):
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path / 'wh'}"}
    contract = parse_contract(EVOLVING)
    create_table(open_catalog("a", props), contract)
    first, second, third = (open_catalog("a", props).load_table(contract.table) for _ in range(3))
    lanes = Column(15, "lanes", "long", False, ("properties.lanes",))
    # Both planned "lanes" as id 15 on the same schema; the second commits on top of the first.
    for writer, table in (("a", first), ("b", second)):
        outcome = Committer(table).commit(
            BatchCommit(writer, 0, {"t": {0: (0, 9)}}, (), schema_change=ColumnPlan((lanes,)))
        )
        assert outcome.status == "committed"
    # The third planned id 15 for another name: its files would give the table's id 15 two meanings.
    with pytest.raises(SchemaMoved, match="'width'.*id 15.*next id is 16"):
        Committer(third).commit(
            BatchCommit(
                "c", 0, {"t": {0: (0, 9)}}, (), schema_change=ColumnPlan((Column(15, "width", "long", False, ()),))
            )
        )
    table = open_catalog("a", props).load_table(contract.table)
    assert [(f.field_id, f.name) for f in table.schema().fields][-1] == (15, "lanes")
    assert table_contract(table, contract).added_columns == (lanes,)


# -- through the broker, Spark and the catalog -------------------------------------------------------------
def numbered(k: int):
    return lambda i: i * k


def lettered(i: int) -> str:
    return f"v{i}"


def evolving_stream(seed: int) -> tuple[list[bytes], dict[str, object]]:
    """Three phases of 1,200 events; each phase's producers send properties the ones before did not.
    Returns the records and, per new property, the kind its first value has."""
    rng = random.Random(seed)
    values = {
        "lanes": lambda i: i % 5,
        "surface": lambda i: rng.choice(["asphalt", "gravel"]),
        "lit": lambda i: i % 2 == 0,
        "width_m": lambda i: round(rng.uniform(2, 9), 2),
        "osm_ref": lambda i: str(1000 + i),
        "tags": lambda i: ["a", "b"],  # an array: a list column
        "Max-Speed": lambda i: 50,  # a name the pattern refuses
    }
    phases = [
        ["lanes", "surface", "lit", "tags", "Max-Speed"],
        ["width_m", "osm_ref", *(f"p{k:02d}" for k in range(13))],
    ]
    for k in range(13):
        values[f"p{k:02d}"] = numbered(k) if k % 2 else lettered
    records, i = [], 0
    for phase in range(3):
        for _ in range(1_200):
            props = {"speed": 10.5, "kind": "road"}
            for names in phases[:phase]:
                for name in names:
                    props[name] = values[name](i)
            if phase == 2 and i % 100 == 0:
                props["lanes"] = "four"  # a string in a long column
            if phase == 2 and i % 100 == 1:
                props["width_m"] = 7  # a whole number in a double column: it fits
            records.append(feature(i, props))
            i += 1
    return records, values


def test_producers_add_properties_over_time_and_the_table_follows(kafka, spark, topic, tmp_path, caplog):
    records, _ = evolving_stream(seed=7)
    assert produce_records(kafka.bootstrap, topic, [(None, v, []) for v in records]) == len(records)
    catalog_props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": f"file://{tmp_path / 'wh'}"}
    settings = load_settings(
        env={},
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        catalog=catalog_props,
        checkpoint_location=str(tmp_path / "ck"),
        metrics_port=0,
        cache_dir=str(CACHE_DIR),
        max_offsets_per_trigger=1_200,
        maintenance_mode="off",
    )
    contract = parse_contract({**DEMO, "schema_evolution": "add-columns"})
    create_table(open_catalog(settings.catalog_name, settings.catalog), contract)
    reports = []
    with caplog.at_level(logging.WARNING, logger="geoingest.job"):
        totals = run(settings, contract, until_idle=True, spark=spark, observers=(reports.append,))
    assert totals.commits.get("failed", 0) == 0

    table = open_catalog(settings.catalog_name, settings.catalog).load_table(contract.table)
    added = [(f.field_id, f.name, str(f.field_type)) for f in table.schema().fields if f.field_id > LAST_DEMO_ID]
    assert added[:3] == [(15, "lanes", "long"), (16, "surface", "string"), (17, "lit", "boolean")]
    names = [name for _, name, _ in added]
    assert {"width_m", "osm_ref", "tags"} <= set(names) and len(names) == 19, names
    assert "Max-Speed" not in names, "a refused name is not a column"
    assert dict((n, t) for _, n, t in added)["width_m"] == "double"
    # An array is a list column; its element's id follows its own, as Iceberg numbers them.
    assert (18, "tags", "list<string>") in added and table.schema().find_field("tags.element").field_id == 19
    assert all(not f.required for f in table.schema().fields if f.field_id > LAST_DEMO_ID)
    ignored = {name: why for r in reports for name, why in r.ignored_properties.items()}
    assert "Max-Speed" in ignored and "tags" not in ignored
    logged = [r.batch["property"] for r in caplog.records if r.getMessage() == "property ignored"]
    assert sorted(logged) == sorted(set(logged)) and "Max-Speed" in logged, "once per name"

    # Every value is in its column or its record is a reject with the reason; the oldest rows read
    # null in the columns added after them, with every reader.
    rejected = sum(r.rejected.get("property_type_mismatch", 0) for r in reports)
    assert rejected == 12, "'four' in the long column lanes, once per 100 events of the last phase"
    rows = query(table, Predicate.from_bbox((-180.0, -90.0, 180.0, 90.0))).table
    assert rows.num_rows == len(records) - rejected
    by_id = {r["event_id"]: r for r in rows.select(["event_id", "lanes", "width_m", "surface"]).to_pylist()}
    assert by_id["e5"]["lanes"] is None and by_id["e1205"]["lanes"] == 1205 % 5
    assert by_id["e2401"]["width_m"] == 7.0
    assert "e2400" not in by_id
    scanned = table.scan(selected_fields=("event_id", "lanes")).to_arrow()
    assert scanned.num_rows == rows.num_rows and scanned.column("lanes").null_count == 1_200
    con = duckdb_connection()
    con.execute("SET enable_geoparquet_conversion = false")
    counted = con.execute(
        f"SELECT count(*), count(lanes), count(p11) FROM iceberg_scan('{table.metadata_location}')"
    ).fetchone()
    assert counted == (rows.num_rows, rows.num_rows - 1_200, 1_200 - 12), "DuckDB reads the old files as null too"

    # Compaction keeps the added columns' values (it reads the files by field id).
    report = maintain(
        table,
        MaintenancePolicy(min_file_age_s=0, snapshot_max_age_s=0, keep_snapshots=1, orphan_min_age_s=0),
        steps=("compact",),
    )
    assert report.compaction is not None and report.compaction.files_rewritten > 1
    table.refresh()
    compacted = query(table, Predicate.from_bbox((-180.0, -90.0, 180.0, 90.0))).table
    columns = ["event_id", *names]
    assert compacted.select(columns).sort_by("event_id") == rows.select(columns).sort_by("event_id")


def test_the_scan_survives_every_hostile_input_the_decoder_meets():
    from tests.streaming.decode.test_decoder import HOSTILE_CASES

    deep_property = b'{"type":"Feature","properties":{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    hostile = [case.values[0] for case in HOSTILE_CASES] + [deep_property, b"\xff\xfe{", b"{" * 5]
    docs = [feature(0, {"lanes": 2}), *hostile, feature(1, {"lanes": 3})]
    seen = unmapped_properties(pa.array(docs, pa.binary()), set(), order_of(len(docs)))
    assert seen["lanes"] == PropertySeen("long", 2, (0, 0, 0))


def test_nested_columns_and_members_take_the_ids_iceberg_gives_them_in_the_commit(catalog) -> None:
    """Objects become structs, arrays lists, new members join struct columns; each id is the one
    pyiceberg's UpdateSchema gives it when the commit adds them in the plan's order."""
    raw = {**EVOLVING}
    raw["columns"] = [
        *DEMO["columns"],
        {
            "id": 9,
            "name": "driver",
            "type": {"type": "struct", "fields": [{"name": "id", "type": "long"}]},
            "from": ["properties.driver"],
        },
    ]
    raw["geometry"], raw["bbox"] = {**DEMO["geometry"], "id": 10}, {**DEMO["bbox"], "id": 11}
    contract = parse_contract(raw)
    table, _ = create_table(catalog, contract)
    seen = {
        "trip": PropertySeen(
            '{"type":"struct","fields":[{"name":"legs","type":{"type":"list","element":{"type":"struct","fields":[{"name":"km","type":"double"}]}}},{"name":"paid","type":"boolean"}]}',
            3,
            (1, 0, 0),
        ),
        "driver": PropertySeen(
            '{"type":"struct","fields":[{"name":"id","type":"long"},{"name":"car","type":{"type":"struct","fields":[{"name":"plate","type":"string"}]}}]}',
            2,
            (2, 0, 0),
        ),
        "empty": PropertySeen("nested", 1, (3, 0, 0)),
    }
    last = table.metadata.last_column_id
    plan = plan_new_columns(contract, seen, last)
    assert [c.name for c in plan.added] == ["trip"] and plan.added[0].id == last + 1
    # trip (n+1), its members legs, paid (n+2, n+3), legs' element (n+4), the element's km (n+5);
    # then driver.car (n+6) and car.plate (n+7).
    assert str(plan.added[0].iceberg_type) == (
        f"struct<{last + 2}: legs: optional list<struct<{last + 5}: km: optional double>>, {last + 3}: paid: optional boolean>"
    )
    assert [(m.path, m.field_id) for m in plan.members] == [(("driver", "car"), last + 6)]
    assert "no column type can be told" in plan.ignored["empty"]

    grown = plan.applied(contract)
    files_schema = grown.iceberg_schema
    with table.transaction() as tx:
        add_columns(tx, table.schema(), last, plan)
    table = catalog.load_table(contract.table)
    # The batch's files and the service restarted on the grown table use the table's ids for every
    # field: the bbox's too, which a grown struct column once moved (its bounds then filed under the
    # ids of other fields, and spatial pruning skipped files it should have read).
    assert files_schema == table.schema()
    assert table_contract(table, contract).iceberg_schema == table.schema()


def test_members_join_the_structs_inside_a_lists_elements_and_a_maps_values(catalog) -> None:
    """A list of structs gains members in its element, a map of structs in its value (every key's
    value counts): each with the id Iceberg gives it, at its path through `element` and `value`."""
    raw = {**EVOLVING}
    raw["columns"] = [
        *DEMO["columns"],
        {
            "id": 9,
            "name": "legs",
            "type": {"type": "list", "element": {"type": "struct", "fields": [{"name": "km", "type": "double"}]}},
            "from": ["properties.legs"],
        },
        {
            "id": 10,
            "name": "stops",
            "type": {
                "type": "map",
                "key": "string",
                "value": {"type": "struct", "fields": [{"name": "eta", "type": "long"}]},
            },
            "from": ["properties.stops"],
        },
    ]
    raw["geometry"], raw["bbox"] = {**DEMO["geometry"], "id": 11}, {**DEMO["bbox"], "id": 12}
    table, _ = create_table(catalog, parse_contract(raw))
    contract = table_contract(table, parse_contract(raw))  # with the ids the table gave, as the service plans
    element = {"type": "struct", "fields": [{"name": "km", "type": "double"}, {"name": "mode", "type": "string"}]}
    at_a = {"type": "struct", "fields": [{"name": "eta", "type": "long"}, {"name": "gate", "type": "string"}]}
    at_b = {
        "type": "struct",
        "fields": [
            {"name": "eta", "type": "long"},
            {"name": "dock", "type": {"type": "struct", "fields": [{"name": "n", "type": "long"}]}},
        ],
    }
    seen = {
        "legs": PropertySeen(json.dumps({"type": "list", "element": element}), 3, (1, 0, 0)),
        "stops": PropertySeen(
            json.dumps({"type": "struct", "fields": [{"name": "a", "type": at_a}, {"name": "b", "type": at_b}]}),
            2,
            (2, 0, 0),
        ),
    }
    last = table.metadata.last_column_id
    plan = plan_new_columns(contract, seen, last)
    assert not plan.added
    assert [(m.path, m.field_id) for m in plan.members] == [
        (("legs", "element", "mode"), last + 1),
        (("stops", "value", "gate"), last + 2),
        (("stops", "value", "dock"), last + 3),  # and dock.n takes last + 4
    ]
    grown = plan.applied(contract).iceberg_schema
    km = contract.iceberg_schema.find_field("legs.element.km").field_id
    assert (
        str(grown.find_type("legs.element")) == f"struct<{km}: km: optional double, {last + 1}: mode: optional string>"
    )
    assert str(grown.find_type("stops.value.dock")) == f"struct<{last + 4}: n: optional long>"
    with table.transaction() as tx:
        add_columns(tx, table.schema(), last, plan)
    table = catalog.load_table(contract.table)
    assert grown == table.schema() and table.metadata.last_column_id == last + 4
    assert table_contract(table, parse_contract(raw)).iceberg_schema == table.schema()


def test_a_list_led_by_nulls_is_seen_with_its_element_type():
    """pyarrow's reader leaves such a list short of its nulls (apache/arrow#51305); reading its
    block crashed the service mid-stream (ArrowIndexError: array slice would exceed array length)."""
    docs = [
        feature(0, {"tags": [None, "x"]}),
        feature(1, {"tags": None, "sizes": {"l": [None, None, 1.5]}}),
        feature(2, {"tags": ["y"]}),
    ]
    seen = unmapped_properties(pa.array(docs), set(), order_of(3))
    assert seen == {
        "tags": PropertySeen('{"type":"list","element":"string"}', 2, (0, 0, 0)),
        "sizes": PropertySeen(
            '{"type":"struct","fields":[{"name":"l","type":{"type":"list","element":"double"}}]}', 1, (10, 0, 1)
        ),
    }


def test_declared_wider_types_widen_their_columns_by_icebergs_rules_in_the_commit(catalog) -> None:
    """What a registry topic's writer schema declares for mapped fields: int to long, float to
    double and a decimal's precision up widen their columns; narrower or other types change
    nothing; a table that another writer changed otherwise refuses the batch (SchemaMoved)."""
    raw = {**EVOLVING}
    raw["columns"] = [
        *DEMO["columns"],
        {"id": 9, "name": "count", "type": "int", "from": ["properties.count"]},
        {"id": 10, "name": "reading", "type": "float", "from": ["properties.reading"]},
        {"id": 11, "name": "price", "type": "decimal(6, 2)", "from": ["properties.price"]},
    ]
    raw["geometry"], raw["bbox"] = {**DEMO["geometry"], "id": 12}, {**DEMO["bbox"], "id": 13}
    contract = parse_contract(raw)
    table, _ = create_table(catalog, contract)
    declared = {
        "count": "long",
        "reading": "double",
        "price": "decimal(9, 2)",
        "speed": "float",  # narrower than its double column
        "population": "int",
        "name": "long",  # a string column: no rule widens it
    }
    seen = {name: PropertySeen(kind, 1, (i, 0, 0)) for i, (name, kind) in enumerate(declared.items())}
    plan = plan_new_columns(contract, seen, table.metadata.last_column_id)
    assert {name: str(kind) for name, kind in plan.widened} == {
        "count": "long",
        "reading": "double",
        "price": "decimal(9, 2)",
    }
    assert plan and not plan.added and not plan.members
    written = plan.applied(contract).iceberg_schema
    with table.transaction() as tx:
        add_columns(tx, table.schema(), table.metadata.last_column_id, plan)
    table = catalog.load_table(contract.table)
    for name in ("count", "reading", "price"):
        assert table.schema().find_field(name) == written.find_field(name)
    # The widened table still fits the contract the service started with; the batch again is a no-op.
    assert table_contract(table, contract).iceberg_schema.find_field("count") == written.find_field("count")
    with table.transaction() as tx:
        add_columns(tx, table.schema(), table.metadata.last_column_id, plan)
    with pytest.raises(SchemaMoved, match="'price'"):
        with table.transaction() as tx:
            clash = ColumnPlan(widened=(("price", DecimalType(9, 3)),))
            add_columns(tx, table.schema(), table.metadata.last_column_id, clash)
    assert (
        plan_new_columns(
            parse_contract({**raw, "schema_evolution": "off"}), seen, table.metadata.last_column_id
        ).widened
        == ()
    )


@pytest.mark.parametrize(
    ("earlier", "later", "merged"),
    [
        ("int", "long", "long"),
        ("long", "int", "long"),
        ("float", "double", "double"),
        ("decimal(6, 2)", "decimal(9, 2)", "decimal(9, 2)"),
        ("decimal(9, 2)", "decimal(6, 2)", "decimal(9, 2)"),
        ("decimal(6, 2)", "decimal(9, 3)", "decimal(6, 2)"),  # another scale: no rule, the earlier kept
        ("long", "double", "double"),
        ("string", "long", "string"),
    ],
)
def test_two_schemas_declaring_a_field_merge_to_the_type_both_fit(earlier, later, merged):
    assert merged_kind(earlier, later) == merged
