"""`geoingest table evolve`: a table changed to a new contract by field id, in one commit, and its
old data files read by field id afterwards (SQL catalog on SQLite, files written without Kafka or
Spark by GeoParquetWriter, as in test_query.py)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StructType

from streaming.contract import Contract, ContractError, parse_contract
from streaming.decode.decoder import HILBERT, REJECT_REASON, Decoder
from streaming.read.projection import PARQUET_FIELD_ID, FieldIdProjection
from streaming.read.query import query_bbox
from streaming.table.catalog import create_table, partition_layout, table_contract, unpartitioned_spec_id
from streaming.table.commit import to_data_file
from streaming.table.evolve import CONTRACT_PROPERTY, EvolutionError, apply_evolution, plan_evolution
from streaming.table.row_delta import RowDelta
from streaming.write.data_files import GeoParquetWriter
from streaming.write.upsert import equality_field_ids, write_equality_deletes

CONTRACT_PATH = Path(__file__).resolve().parents[3] / "schemas" / "demo_events.json"
WORLD = (-180.0, -90.0, 180.0, 90.0)
ROWS_PER_BATCH = 30


def base_raw() -> dict:
    """The demo contract with a float column (to widen) and a primary key (that must stay)."""
    raw = json.loads(CONTRACT_PATH.read_text())
    raw["columns"][4]["type"] = "float"  # speed
    raw["primary_key"] = ["event_id"]
    return raw


def evolved_raw() -> dict:
    """kind renamed to category, speed float -> double, source_partition int -> long and made
    optional, population dropped, heading added with the table's next id (its last is 14: bbox.ymax)."""
    raw = base_raw()
    columns = raw["columns"]
    columns[2]["name"] = "category"
    columns[4]["type"] = "double"
    columns[6].update(type="long", required=False)
    del columns[5]
    columns.append({"id": 15, "name": "heading", "type": "double", "from": ["properties.heading"]})
    raw["description"] = "evolved"
    return raw


def edited(edit: Callable[[dict], object]) -> dict:
    raw = evolved_raw()
    edit(raw)
    return raw


def events(contract: Contract, first: int, n: int = ROWS_PER_BATCH) -> pa.Table:
    """Decoded, Hilbert-sorted GeoJSON points e<first>.. with every property either contract reads."""
    values = [
        json.dumps(
            {
                "type": "Feature",
                "id": f"e{i:03d}",
                "geometry": {"type": "Point", "coordinates": [2.0 + i * 0.01, 48.0 + i * 0.01]},
                "properties": {"kind": f"k{i}", "name": f"n{i}", "speed": i + 0.5, "population": i * 10, "heading": i},
            }
        ).encode()
        for i in range(first, first + n)
    ]
    batch = pa.record_batch(
        {
            "key": pa.nulls(n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array(["t"] * n),
            "partition": pa.array([3] * n, pa.int32()),
            "offset": pa.array(range(first, first + n), pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us")),
        }
    )
    decoded = pa.Table.from_batches([Decoder(contract).decode(batch)])
    valid = decoded.filter(pc.is_null(decoded.column(REJECT_REASON)))
    assert valid.num_rows == n
    return valid.sort_by(HILBERT)


def append(table: Table, contract: Contract, rows: pa.Table) -> None:
    writer = GeoParquetWriter(
        contract, table.properties, table.io.properties, table.location() + "/data", "t", partition_layout(table)
    )
    records = list(writer.write(rows.to_batches()))
    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as fast_append:
            for record in records:
                fast_append.append_data_file(to_data_file(record, table.metadata.default_spec_id))


@pytest.fixture
def table(catalog) -> Table:
    """The base contract's table, with one batch written under it."""
    contract = parse_contract(base_raw())
    table = create_table(catalog, contract)[0]
    append(table, contract, events(contract, 0))
    return catalog.load_table(contract.table)


def by_event_id(rows: pa.Table) -> pa.Table:
    return rows.sort_by("event_id")


def test_rename_widen_drop_and_add_in_one_commit(catalog, table: Table) -> None:
    before = table.metadata
    new = parse_contract(evolved_raw())
    changes = [c.to_json() for c in apply_evolution(table, new)]
    assert changes == [
        {"change": "drop", "id": 6, "column": "population"},
        {"change": "rename", "id": 3, "column": "kind", "to": "category"},
        {"change": "widen", "id": 5, "column": "speed", "from": "float", "to": "double"},
        {"change": "widen", "id": 7, "column": "source_partition", "from": "int", "to": "long"},
        {"change": "make-optional", "id": 7, "column": "source_partition"},
        {"change": "add", "id": 15, "column": "heading", "type": "double"},
        {"change": "contract", "property": CONTRACT_PROPERTY, "keys": ["columns", "description"]},
    ]
    after = catalog.load_table(new.table).metadata
    assert len(after.metadata_log) == len(before.metadata_log) + 1, "one commit"
    assert after.current_snapshot_id == before.current_snapshot_id, "no data rewritten"
    fields = {f.field_id: (f.name, f.field_type, f.required) for f in after.schema().fields}
    assert fields[3][0] == "category" and 6 not in fields
    assert fields[5] == ("speed", DoubleType(), False)
    assert fields[7] == ("source_partition", LongType(), False)
    assert fields[15] == ("heading", DoubleType(), False)
    assert after.properties[CONTRACT_PROPERTY] == new.table_properties()[CONTRACT_PROPERTY]
    # The service opens the table with the new contract as it is: nothing left over, nothing missing.
    assert table_contract(catalog.load_table(new.table), new).added_columns == ()


def test_old_files_read_by_field_id(catalog, table: Table) -> None:
    old = parse_contract(base_raw())
    first_snapshot = table.metadata.current_snapshot_id
    new = parse_contract(evolved_raw())
    apply_evolution(table, new)
    table = catalog.load_table(new.table)
    append(table, new, events(new, ROWS_PER_BATCH))
    table = catalog.load_table(new.table)

    result = by_event_id(query_bbox(table, WORLD).table)
    assert result.column_names == [f.name for f in table.schema().fields]
    assert result.num_rows == 2 * ROWS_PER_BATCH
    n = ROWS_PER_BATCH
    assert result.column("category").to_pylist() == [f"k{i}" for i in range(2 * n)]
    assert result.column("speed").type == pa.float64()
    assert result.column("speed").to_pylist() == [i + 0.5 for i in range(2 * n)]  # exact in float32 too
    assert result.column("source_partition").type == pa.int64()
    assert result.column("source_partition").to_pylist() == [3] * (2 * n)
    assert result.column("heading").to_pylist() == [None] * n + [float(i) for i in range(n, 2 * n)]
    assert "population" not in result.column_names and "kind" not in result.column_names

    # pyiceberg's own scan maps the files by field id too: the same rows, column by column.
    scanned = by_event_id(table.scan().to_arrow())
    assert scanned.column_names == result.column_names
    for name in result.column_names:
        assert scanned.column(name).to_pylist() == result.column(name).to_pylist(), name

    # Time travel reads a snapshot as its own schema had it.
    then = by_event_id(query_bbox(table, WORLD, snapshot_id=first_snapshot).table)
    assert then.column_names == [f.name for f in old.iceberg_schema.fields]
    assert then.column("kind").to_pylist() == [f"k{i}" for i in range(n)]
    assert then.column("population").to_pylist() == [i * 10 for i in range(n)]
    assert then.column("speed").type == pa.float32()


def test_a_column_added_under_a_dropped_ones_name_starts_empty(catalog, table: Table) -> None:
    raw = base_raw()
    del raw["columns"][5]  # population, id 6
    raw["columns"].append({"id": 15, "name": "population", "type": "long", "from": ["properties.population"]})
    changes = apply_evolution(table, parse_contract(raw))
    assert [(c.kind, c.id) for c in changes] == [("drop", 6), ("add", 15), ("contract", None)]
    table = catalog.load_table("demo.events")
    # Same name, another field id: the old files' values are not the new column's.
    assert query_bbox(table, WORLD).table.column("population").null_count == ROWS_PER_BATCH
    assert table.scan().to_arrow().column("population").null_count == ROWS_PER_BATCH


def _drop_the_key(raw: dict) -> None:
    del raw["columns"][0]
    raw["primary_key"] = ["source_offset"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # A rename planned before the refusal is not applied either.
        (lambda r: r["columns"][4].update(type="string"), "columns[4] 'speed': float -> string is not a type change"),
        (lambda r: r["columns"][1].update(type="long"), "columns[1] 'event_time': timestamptz -> long is not a type"),
        (lambda r: r["columns"][2].update(required=True), "columns[2] 'category': optional -> required"),
        (
            lambda r: r["columns"][7].update(id=16),
            "columns[7] 'heading': id 16 is not the table's; a new column takes the table's next free id, 15",
        ),
        (lambda r: r["columns"][7].update(id=12), "columns[7] 'heading': id 12 is the table's field 'bbox.ymin'"),
        (lambda r: r["columns"][7].update(required=True), "columns[7] 'heading': a new column must be optional"),
        (_drop_the_key, "column 'event_id' (id 1): a primary key column cannot be dropped"),
        (
            lambda r: r.update(primary_key=["source_offset"]),
            "primary_key: ['event_id' (id 1)] -> ['source_offset' (id 8)]",
        ),
        (lambda r: r["geometry"].update(name="geom"), "geometry.name: 'geometry' -> 'geom'"),
        (lambda r: r["geometry"]["types"].pop(), "geometry.types: "),
        (lambda r: r["bbox"].update(flat_columns=True), "bbox.flat_columns: False -> True"),
        (lambda r: r["clustering"].update(hilbert_bits=12), "clustering.hilbert_bits: 16 -> 12"),
        (lambda r: r.update(mode="upsert"), "mode: 'append' -> 'upsert'"),
        (lambda r: r.update(formats=["geojson"]), "formats: ['geojson', 'wkb', 'ewkb'] -> ['geojson']"),
        (lambda r: r.update(table="demo.other"), "table: the contract names demo.other, not demo.events"),
    ],
)
def test_each_refusal_names_its_column_and_changes_nothing(catalog, table: Table, edit, message: str) -> None:
    new = parse_contract(edited(edit))
    for attempt in (plan_evolution, apply_evolution):
        with pytest.raises(EvolutionError, match=re.escape(message)):
            attempt(table, new)
    assert catalog.load_table("demo.events").metadata_location == table.metadata_location


def test_a_dry_run_changes_nothing(catalog, table: Table) -> None:
    new = parse_contract(evolved_raw())
    planned = plan_evolution(table, new)
    assert catalog.load_table("demo.events").metadata_location == table.metadata_location
    assert apply_evolution(table, new) == planned
    # Once applied, the same contract has nothing left to change.
    assert plan_evolution(catalog.load_table("demo.events"), new) == []


def test_columns_schema_evolution_added_are_kept_and_counted(catalog, table: Table) -> None:
    # What ingest under schema_evolution "add-columns" does: an optional column no contract lists.
    with table.update_schema() as update:
        update.add_column("wind", DoubleType())
    table = catalog.load_table("demo.events")
    # Its id taken for a new column reads as a mistake, not as a rename of it.
    taken = "columns[7] 'heading': id 15 is the table's column 'wind', which schema evolution added"
    with pytest.raises(EvolutionError, match=re.escape(taken) + ".* next free id, 16"):
        plan_evolution(table, parse_contract(evolved_raw()))
    clash = edited(lambda r: r["columns"][7].update(id=16, name="wind"))
    with pytest.raises(EvolutionError, match=re.escape("columns[7] 'wind': the name is the table's column id 15")):
        plan_evolution(table, parse_contract(clash))

    new = parse_contract(edited(lambda r: r["columns"][7].update(id=16)))
    changes = apply_evolution(table, new)
    assert "wind" not in {c.column for c in changes}, "not a drop: no contract listed it"
    table = catalog.load_table("demo.events")
    assert [(c.id, c.name) for c in table_contract(table, new).added_columns] == [(15, "wind")]

    # A later contract lists it by its id and name; the one after may rename it.
    adopted = copy.deepcopy(new.source)
    adopted["columns"].append({"id": 15, "name": "wind", "type": "double", "from": ["properties.wind"]})
    assert [c.kind for c in apply_evolution(table, parse_contract(adopted))] == ["contract"]
    adopted["columns"][-1]["name"] = "wind_speed"
    renamed = apply_evolution(catalog.load_table("demo.events"), parse_contract(adopted))
    assert renamed[0].to_json() == {"change": "rename", "id": 15, "column": "wind", "to": "wind_speed"}


# -- the command ------------------------------------------------------------------------------------
# `geoingest` with the catalog under a test folder: test_query.py's helper.
from tests.streaming.read.test_query import _cli  # noqa: E402


def test_cli_evolve(
    catalog, table: Table, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "evolved.json"
    path.write_text(json.dumps(evolved_raw()))
    assert _cli(monkeypatch, tmp_path, "table", "evolve", "--contract", str(path), "--dry-run") == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["table"] == "demo.events" and planned["dry_run"] is True
    assert {"change": "add", "id": 15, "column": "heading", "type": "double"} in planned["changes"]
    assert catalog.load_table("demo.events").metadata_location == table.metadata_location

    assert _cli(monkeypatch, tmp_path, "table", "evolve", "--contract", str(path)) == 0
    applied = json.loads(capsys.readouterr().out)
    assert applied["changes"] == planned["changes"] and applied["dry_run"] is False
    assert applied["schema_id"] == catalog.load_table("demo.events").metadata.current_schema_id

    assert _cli(monkeypatch, tmp_path, "query", "--table", "demo.events", "--bbox=-180,-90,180,90") == 0
    features = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(features) == ROWS_PER_BATCH
    assert {f["properties"]["category"] for f in features} == {f"k{i}" for i in range(ROWS_PER_BATCH)}
    assert all(f["properties"]["heading"] is None and "kind" not in f["properties"] for f in features)

    path.write_text(json.dumps(edited(lambda r: r["columns"][4].update(type="string"))))
    assert _cli(monkeypatch, tmp_path, "table", "evolve", "--contract", str(path)) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "geoingest: columns[4] 'speed': double -> string is not a type change Iceberg allows (only float -> double, int -> long)\n"
    )

    assert _cli(monkeypatch, tmp_path, "table", "evolve") == 2
    assert capsys.readouterr().err == "geoingest: table evolve needs --contract (the table's new contract)\n"


def test_a_table_changed_meanwhile_is_not_evolved(catalog, table: Table) -> None:
    # Planned on the table as loaded, while an ingest adds a column: the commit's check of the
    # schema it was planned on fails, and nothing is changed.
    with catalog.load_table("demo.events").update_schema() as update:
        update.add_column("wind", DoubleType())
    changed = catalog.load_table("demo.events").metadata_location
    with pytest.raises(EvolutionError, match="demo.events: it changed while the evolve ran .* run it again"):
        apply_evolution(table, parse_contract(evolved_raw()))
    assert catalog.load_table("demo.events").metadata_location == changed


def test_an_upsert_tables_deletes_still_apply_to_files_read_by_field_id(catalog) -> None:
    raw = base_raw()
    raw["mode"] = "upsert"
    old = parse_contract(raw)
    table = create_table(catalog, old)[0]
    append(table, old, events(old, 0))
    new_raw = edited(lambda r: r.update(mode="upsert"))
    new = parse_contract(new_raw)
    apply_evolution(catalog.load_table(new.table), new)
    table = catalog.load_table(new.table)

    # A batch under the new contract that replaces e000..e009 (and adds nothing else).
    replacing = events(new, 0, 10)
    writer = GeoParquetWriter(
        new, table.properties, table.io.properties, table.location() + "/data", "u", partition_layout(table)
    )
    records = list(writer.write(replacing.to_batches()))
    deletes = write_equality_deletes(replacing, new, table.io, table.properties, table.location() + "/data", "u")
    spec_id = table.metadata.default_spec_id
    with table.transaction() as tx:
        delta = RowDelta(tx, delete_spec_id=unpartitioned_spec_id(table))
        for record in records:
            delta.append_data_file(to_data_file(record, spec_id))
        delta.add_delete_file(to_data_file(deletes, unpartitioned_spec_id(table) or 0, equality_field_ids(new)))
        delta.commit()

    rows = by_event_id(query_bbox(catalog.load_table(new.table), WORLD).table)
    assert rows.column("event_id").to_pylist() == [f"e{i:03d}" for i in range(ROWS_PER_BATCH)], "one row per key"
    # The new versions (heading set) replaced the old ones; the old file's rows (heading null) remain.
    assert rows.column("heading").to_pylist() == [float(i) for i in range(10)] + [None] * (ROWS_PER_BATCH - 10)
    assert rows.column("category").to_pylist() == [f"k{i}" for i in range(ROWS_PER_BATCH)]


def test_the_projection_finds_nested_fields_by_id_too() -> None:
    def with_id(name: str, type_: pa.DataType, field_id: int) -> pa.Field:
        return pa.field(name, type_, metadata={PARQUET_FIELD_ID: str(field_id).encode()})

    schema = Schema(
        NestedField(1, "count", LongType(), required=True),
        NestedField(2, "point", StructType(NestedField(3, "x", DoubleType()), NestedField(4, "y", DoubleType()))),
        NestedField(5, "later", IntegerType()),
    )
    old_point = pa.struct([with_id("old_x", pa.float32(), 3)])
    file_schema = pa.schema(
        [with_id("gone", pa.string(), 9), with_id("point", old_point, 2), with_id("old_count", pa.int32(), 1)]
    )
    rows = pa.table(
        [["a", "b"], pa.array([{"old_x": 1.5}, None], old_point), pa.array([7, 8], pa.int32())], schema=file_schema
    )
    projection = FieldIdProjection(schema)
    assert projection.columns_to_read(file_schema) == ["point", "old_count"]
    assert projection.paths_in_file(file_schema, [3, 4], ["point.x", "point.y"]) == ["point.old_x", None]
    projected = projection(rows.select(projection.columns_to_read(file_schema)), "file.parquet")
    assert projected.schema == projection.arrow_schema
    assert projected.to_pylist() == [
        {"count": 7, "point": {"x": 1.5, "y": None}, "later": None},
        {"count": 8, "point": None, "later": None},
    ]


CELL = "geoingest.partition.cell.geometry_geohash2"


def test_the_partition_spec_evolves_old_files_keep_theirs_and_queries_read_both(catalog) -> None:
    from pyiceberg.expressions import GreaterThanOrEqual

    from streaming.read.predicate import Predicate
    from streaming.read.query import query
    from tests.partitioned_tables import DAY_US, HOUR_US, rows

    raw = {**json.loads(CONTRACT_PATH.read_text()), "partition": []}
    table, _ = create_table(catalog, parse_contract(raw))

    def evolve_to(partition: list[str]) -> list[dict]:
        contract = parse_contract({**raw, "partition": partition})
        return [c.to_json() for c in apply_evolution(catalog.load_table(contract.table), contract)]

    def write(day: int, hour: int, partition: tuple, first: int) -> None:
        from tests.partitioned_tables import append

        table.refresh()
        append(table, parse_contract(raw), [(partition, rows(parse_contract(raw), day, "a", 10, first, first, hour))])

    day = 20_000
    assert evolve_to(["day(event_time)"]) == [
        {"change": "contract", "property": CONTRACT_PROPERTY, "keys": ["partition"]},
        {"change": "partition-add", "field": "event_time_day", "transform": "day"},
    ]
    write(day, 1, (day,), 0)
    changes = evolve_to(["hour(event_time)", "kind"])
    assert {"change": "partition-remove", "field": "event_time_day", "transform": "day"} in changes
    assert {"change": "partition-add", "field": "event_time_hour", "transform": "hour"} in changes
    assert {"change": "partition-add", "field": "kind", "transform": "identity"} in changes
    write(day, 5, (day * 24 + 5, "a"), 100)

    table = catalog.load_table(table.name())
    specs = {t.file.file_path: t.file.spec_id for t in table.scan().plan_files()}
    assert sorted(specs.values()) == [1, 2], "the old file keeps its spec, the new one takes the new spec"
    assert [str(f.transform) for f in table.spec().fields] == ["hour", "identity"]
    assert query(table, Predicate.from_bbox((-180, -90, 180, 90))).stats.rows_matched == 20, "both read"
    later = GreaterThanOrEqual("event_time", (day * DAY_US + 3 * HOUR_US))
    assert table.scan(row_filter=later).to_arrow().num_rows == 10
    assert len(list(table.scan(row_filter=later).plan_files())) == 1, "each file pruned by its own spec"
    assert evolve_to(["hour(event_time)", "kind"]) == [], "the same spec again: nothing to change"

    # A spatial cell: its column comes after the others, optional, with the table's next free id.
    next_id = catalog.load_table(table.name()).metadata.last_column_id + 1
    changes = evolve_to(["hour(event_time)", "geohash(geometry, 2)"])
    assert {"change": "partition-remove", "field": "kind", "transform": "identity"} in changes
    assert {"change": "partition-add", "field": "geometry_geohash2", "transform": "identity"} in changes
    cell = catalog.load_table(table.name()).schema().find_field("geometry_geohash2")
    assert {"change": "cell-add", "id": next_id, "column": "geometry_geohash2", "property": CELL} in changes
    assert (cell.field_id, cell.required) == (next_id, False)
    assert catalog.load_table(table.name()).properties[CELL] == "geohash:2:geometry"
    # The contract itself refuses a transform of a column it lacks, before evolve looks at the table.
    with pytest.raises(ContractError, match=r"^partition\[0\]: day\(nowhere\): 'nowhere' is not one of the columns"):
        evolve_to(["day(nowhere)"])


def test_a_batch_written_before_the_spec_evolved_is_committed_under_the_spec_it_was_written_with(catalog) -> None:
    """The service writes a batch's files with the spec it read at the batch's start; `table evolve`
    from day to hour lands before the batch commits. The files hold day values (day 20,000): read as
    hours they would place the batch in 1972, where a window over the hour they hold misses them."""
    from streaming.read.predicate import Predicate
    from streaming.read.query import query
    from streaming.table.commit import BatchCommit, Committer
    from tests.partitioned_tables import DAY_US, HOUR_US, rows

    raw = {**json.loads(CONTRACT_PATH.read_text()), "partition": ["day(event_time)"]}
    contract = parse_contract(raw)
    table, _ = create_table(catalog, contract)
    day = 20_000
    writer = GeoParquetWriter(
        contract, table.properties, table.io.properties, table.location() + "/data", "w", partition_layout(table)
    )
    written = list(writer.write(rows(contract, day, "a", 40, seed=1, hour_of_day=7).to_batches()))
    assert {r.partition_values for r in written} == {(day,)}

    hourly = parse_contract({**raw, "partition": ["hour(event_time)"]})
    apply_evolution(catalog.load_table(contract.table), hourly)
    Committer(table).commit(BatchCommit("w", 0, {"t": {0: (0, 39)}}, tuple(written)))

    table = catalog.load_table(contract.table)
    committed = {t.file.spec_id: t.file.partition for t in table.scan().plan_files()}
    day_spec = next(i for i, s in table.specs().items() if [str(f.transform) for f in s.fields] == ["day"])
    assert list(committed) == [day_spec], "the files keep the spec they were written with"
    hour = day * DAY_US + 7 * HOUR_US
    found = query(table, Predicate.from_bbox(WORLD), time_from=hour // 1000, time_to=(hour + HOUR_US) // 1000)
    assert found.stats.rows_matched == 40, "a window over the hour they hold finds all of them"
