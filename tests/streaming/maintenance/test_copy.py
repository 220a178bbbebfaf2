"""`geoingest table copy` (streaming/maintenance/copy.py): a v2 table's live rows into a native-geometry
(v3) table, and the stream going on into the copy from where the v2 table stopped. Real broker,
Spark and SQLite catalog; checked against the reference of what was produced."""

from __future__ import annotations

import dataclasses
import json

import pytest

from app.cli import main
from app.maven import configure_iceberg_java
from app.service import run
from streaming.contract import parse_contract
from streaming.maintenance.copy import COPIED_FROM, CopyError, copy_table
from streaming.table.catalog import create_table, open_catalog
from streaming.table.native import is_native
from tests.conftest import CACHE_DIR, local_settings
from tests.streaming.job.test_matrix import (
    DEMO,
    Reference,
    differences,
    make_stream,
    new_topic,
    produce,
    read_by_duckdb,
)

pytestmark = pytest.mark.integration

configure_iceberg_java(CACHE_DIR)


def native(raw: dict, table: str) -> dict:
    return {**raw, "table": table, "geometry": {**raw["geometry"], "native": True}}


@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_a_v2_table_copied_to_a_native_one_goes_on_from_where_the_stream_stopped(
    kafka, spark, tmp_path, monkeypatch, capsys, mode
):
    topic = new_topic(kafka.bootstrap, 1)
    records = make_stream(n_keys=300, n_events=2_400, seed=17)
    half = len(records) // 2
    positions = produce(kafka.bootstrap, topic, records[:half])
    v2_raw = {**DEMO, "mode": mode}
    v2 = parse_contract(v2_raw)
    settings = local_settings(kafka, topic, tmp_path / "v2", max_offsets_per_trigger=300, maintenance_mode="off")
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    create_table(catalog, v2)
    run(settings, v2, until_idle=True, spark=spark)

    # The copy, by the CLI, into a native table of the same columns, partitioned by day as the demo.
    contract_file = tmp_path / "native.json"
    contract_file.write_text(json.dumps(native(v2_raw, "demo.events_v3")))
    for key, value in {
        "GEOINGEST_CATALOG__URI": settings.catalog["uri"],
        "GEOINGEST_CATALOG__WAREHOUSE": settings.catalog["warehouse"],
        "GEOINGEST_CATALOG_NAME": settings.catalog_name,
        "GEOINGEST_CACHE_DIR": str(CACHE_DIR),
        "GEOINGEST_METRICS_PORT": "0",
    }.items():
        monkeypatch.setenv(key, value)
    assert main(["table", "copy", "--table", v2.table, "--contract", str(contract_file)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    copy = catalog.load_table("demo.events_v3")
    assert is_native(copy) and report["files_written"] >= 1
    assert copy.current_snapshot().summary[COPIED_FROM] == v2.table
    first_half = Reference.of(mode, records[:half], positions)
    assert set(differences(first_half, read_by_duckdb(copy)).values()) == {0}, "the copy holds the v2 table's rows"
    assert report["rows"] == len(read_by_duckdb(catalog.load_table(v2.table)))

    # The stream goes on into the copy from the offsets the v2 table reached: a checkpoint of its
    # own, started from the table's records.
    positions += produce(kafka.bootstrap, topic, records[half:])
    native_contract = parse_contract(native(v2_raw, "demo.events_v3"))
    settings_v3 = dataclasses.replace(settings, checkpoint_location=str(tmp_path / "checkpoint-v3"))
    totals = run(settings_v3, native_contract, until_idle=True, spark=spark, resume_from_table=True)
    assert totals.commits.get("failed", 0) == 0
    copy.refresh()
    reference = Reference.of(mode, records, positions)
    assert set(differences(reference, read_by_duckdb(copy)).values()) == {0}, "every record once, none lost"

    with pytest.raises(CopyError, match="demo.events_v3: it holds data already"):
        copy_table(catalog.load_table(v2.table), copy, native_contract)
