"""Other engines read the table as docs/reading.md says: DuckDB runs the page's own SQL.

The SQL is taken from docs/reading.md ("Reading with DuckDB") at test time, so the page cannot drift
from what works: its metadata location placeholder is replaced by that of a table the query
tests' fixture builds, and every statement runs on a real DuckDB with its iceberg and spatial
extensions. Then the opt-in flat bbox columns (`bbox.flat_columns`): DuckDB prunes files with
them, and every reader answers as before.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
import shapely

from streaming.contract import ContractError, parse_contract
from streaming.read.query import query_bbox
from streaming.table.catalog import check_table_matches, describe
from tests.conftest import duckdb_connection
from tests.streaming.read.test_query import (
    CONTRACT_PATH,
    Built,
    _append,
    _brute_force_ids,
    _catalog,
    _create_table,
    _decoded_rows,
    _read_all_rows,
    built,  # noqa: F401 (a fixture)
    contract,  # noqa: F401 (a fixture)
)

READING_PAGE = Path(__file__).resolve().parents[3] / "docs" / "reading.md"
METADATA_PLACEHOLDER = "<metadata_location>"
# The page's example window (Paris and around), which the fixture's Paris cluster fills.
PAGE_WINDOW = (2.0, 48.5, 3.0, 49.2)


def page_duckdb_sql() -> str:
    """The first ```sql block after the "Reading with DuckDB" heading of docs/reading.md."""
    text = READING_PAGE.read_text()
    heading = text.find("## Reading with DuckDB")
    assert heading >= 0, "docs/reading.md has no '## Reading with DuckDB' section"
    block = re.search(r"```sql\n(.*?)```", text[heading:], re.DOTALL)
    assert block, "docs/reading.md's 'Reading with DuckDB' section has no ```sql block"
    return block.group(1)


def run_page_sql(metadata_location: str) -> list[list[tuple]]:
    """Every statement of the page's block, in order; the rows of each SELECT."""
    sql = page_duckdb_sql()
    assert METADATA_PLACEHOLDER in sql, f"the page's DuckDB block has no {METADATA_PLACEHOLDER} to fill in"
    con = duckdb_connection()  # the extensions from their wheels: LOAD in the block finds them loaded
    results = []
    for statement in con.extract_statements(sql.replace(METADATA_PLACEHOLDER, metadata_location)):
        con.execute(statement)
        if statement.type == duckdb.StatementType.SELECT:
            results.append(con.fetchall())
    return results


def test_reading_page_duckdb_sql_reads_the_table(built: Built) -> None:
    metadata_location = describe(built.table)["metadata_location"]
    assert metadata_location == built.table.metadata_location

    results = run_page_sql(metadata_location)
    assert len(results) == 2, "the page's block: a row count, then a bbox query"
    (count,), *_ = results[0]
    assert count == built.rows.num_rows

    window_rows = results[1]
    expected = _brute_force_ids(built.rows, PAGE_WINDOW)
    assert len(expected) > 50, "the fixture's Paris cluster should fill the page's window"
    ids = [row[0] for row in window_rows]
    assert len(ids) == len(set(ids)) and set(ids) == expected

    written = dict(zip(built.rows.column("event_id").to_pylist(), built.rows.column("geometry").to_pylist()))
    for event_id, wkb, wkt in window_rows:
        assert wkb == written[event_id], f"{event_id}: DuckDB read other WKB bytes than were written"
        assert shapely.from_wkt(wkt).equals_exact(shapely.from_wkb(wkb), tolerance=0), event_id


# -- the flat bbox columns (opt-in) -------------------------------------------------------------
RAW = json.loads(CONTRACT_PATH.read_text())


def _flat_raw() -> dict:
    raw = copy.deepcopy(RAW)
    raw["bbox"]["flat_columns"] = True
    return raw


def test_flat_columns_follow_the_bbox_column_and_move_only_the_struct_fields() -> None:
    plain, flat = parse_contract(copy.deepcopy(RAW)), parse_contract(_flat_raw())
    assert not plain.flat_bbox_names and plain.bbox_field_ids == {"xmin": 11, "ymin": 12, "xmax": 13, "ymax": 14}
    assert flat.flat_bbox_field_ids == {"bbox_xmin": 11, "bbox_ymin": 12, "bbox_xmax": 13, "bbox_ymax": 14}
    assert flat.bbox_field_ids == {"xmin": 15, "ymin": 16, "xmax": 17, "ymax": 18}
    top = {f.field_id: f.name for f in flat.iceberg_schema.fields}
    assert {i: top[i] for i in range(1, 11)} == {f.field_id: f.name for f in plain.iceberg_schema.fields}
    # The decoder's rows are unchanged; the files add the four columns.
    assert flat.arrow_schema.names == plain.arrow_schema.names
    assert flat.data_file_schema.names == [*plain.arrow_schema.names, *flat.flat_bbox_names]
    plain_props, flat_props = plain.table_properties(), flat.table_properties()
    assert "geo.column.geometry.covering-flat-columns" not in plain_props
    assert flat_props["geo.column.geometry.covering-flat-columns"] == "bbox_xmin,bbox_ymin,bbox_xmax,bbox_ymax"
    assert json.loads(flat_props["geoingest.contract"])["bbox"]["flat_columns"] is True


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda raw: raw["bbox"].update(flat_columns="yes"), r"^bbox\.flat_columns: expected true or false, got 'yes'"),
        (lambda raw: raw["bbox"].update(flat_columns=1), r"^bbox\.flat_columns: expected true or false, got 1"),
        (
            lambda raw: raw["columns"][3].update(name="bbox_ymax"),
            r"^bbox\.flat_columns: the flat column 'bbox_ymax' would take the name of another column",
        ),
    ],
)
def test_flat_columns_errors_name_the_field(edit, message: str) -> None:
    raw = _flat_raw()
    edit(raw)
    with pytest.raises(ContractError, match=message):
        parse_contract(raw)


def _files_duckdb_reads(metadata_location: str, where: str) -> tuple[int, list[tuple]]:
    con = duckdb_connection()
    con.execute("SET enable_geoparquet_conversion = false")
    sql = f"SELECT event_id, geometry FROM iceberg_scan('{metadata_location}') WHERE {where} ORDER BY event_id"
    plan = "\n".join(row[1] for row in con.execute(f"EXPLAIN ANALYZE {sql}").fetchall())
    return int(re.search(r"Total Files Read: (\d+)", plan).group(1)), con.execute(sql).fetchall()


def test_flat_columns_let_duckdb_prune_files_with_equal_results(built: Built, tmp_path: Path) -> None:
    flat_contract = parse_contract(_flat_raw())
    catalog = _catalog(tmp_path)
    table = _create_table(catalog, flat_contract)
    check_table_matches(table, flat_contract)
    # The same rows as the fixture's table, written the same way.
    records = _append(table, flat_contract, _decoded_rows(flat_contract, np.random.default_rng(20240611)))
    table = catalog.load_table(flat_contract.table)
    assert len(records) >= 20

    # The files: GeoParquet as before, the flat columns equal to the covering, their manifest bounds set.
    stored = _read_all_rows(table, records)
    for name, field in zip(flat_contract.flat_bbox_names, ("xmin", "ymin", "xmax", "ymax")):
        assert stored.column(name).combine_chunks().equals(stored.column("bbox").combine_chunks().field(field))
        fid = flat_contract.flat_bbox_field_ids[name]
        assert all(fid in r.statistics()["lower_bounds"] and fid in r.statistics()["upper_bounds"] for r in records)
    geo = json.loads(pq.read_metadata(records[0].path.removeprefix("file://")).metadata[b"geo"])
    assert geo["columns"]["geometry"]["covering"]["bbox"]["xmin"] == ["bbox", "xmin"]

    x0, y0, x1, y1 = PAGE_WINDOW
    exact = f"ST_Intersects(ST_GeomFromWKB(geometry), ST_MakeEnvelope({x0}, {y0}, {x1}, {y1}))"
    nested_files, nested_rows = _files_duckdb_reads(
        built.table.metadata_location,
        f"bbox.xmin <= {x1} AND bbox.xmax >= {x0} AND bbox.ymin <= {y1} AND bbox.ymax >= {y0} AND {exact}",
    )
    flat_files, flat_rows = _files_duckdb_reads(
        table.metadata_location,
        f"bbox_xmin <= {x1} AND bbox_xmax >= {x0} AND bbox_ymin <= {y1} AND bbox_ymax >= {y0} AND {exact}",
    )
    assert nested_files == len(built.records), "DuckDB 1.5.5 prunes nothing on the struct's bounds"
    assert flat_files < nested_files / 4, (flat_files, nested_files)
    assert flat_rows == nested_rows and {r[0] for r in flat_rows} == _brute_force_ids(built.rows, PAGE_WINDOW)

    # pyiceberg and geoingest's own query read the table as they read one without the columns.
    ours = query_bbox(table, PAGE_WINDOW)
    assert set(ours.table.column("event_id").to_pylist()) == {r[0] for r in flat_rows}
    assert ours.stats.files_scanned == query_bbox(built.table, PAGE_WINDOW).stats.files_scanned
    assert table.scan().to_arrow().num_rows == built.rows.num_rows


def test_without_the_option_the_writer_writes_what_it_wrote_before(built: Built, contract) -> None:
    # No flat columns in the files or the schema of a table made without the option.
    assert contract == dataclasses.replace(contract, bbox_flat_columns=False)
    assert built.rows.column_names == contract.arrow_schema.names == contract.data_file_schema.names
