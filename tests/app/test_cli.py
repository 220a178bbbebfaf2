"""The `geoingest` command as a user runs it: table create/describe, run --until-idle, query; and the
command lines the docs show, as they show them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import shapely

from tests.conftest import CACHE_DIR, produce_records
from tests.test_docs import ROOT, geoingest_lines

pytestmark = pytest.mark.integration

CONTRACT = Path(__file__).resolve().parents[2] / "schemas" / "demo_events.json"
GEOINGEST = Path(sys.executable).parent / "geoingest"


def geoingest(
    env: dict[str, str], *args: str, check: bool = True, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    result = subprocess.run([str(GEOINGEST), *args], env=env, capture_output=True, text=True, timeout=600, cwd=cwd)
    if check and result.returncode != 0:
        raise AssertionError(f"geoingest {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


@pytest.fixture
def env(tmp_path, kafka, topic) -> dict[str, str]:
    return {
        **os.environ,
        "GEOINGEST_BOOTSTRAP_SERVERS": kafka.bootstrap,
        "GEOINGEST_TOPIC": topic,
        "GEOINGEST_CATALOG__URI": f"sqlite:///{tmp_path / 'catalog.db'}",
        "GEOINGEST_CATALOG__WAREHOUSE": f"file://{tmp_path / 'warehouse'}",
        "GEOINGEST_CHECKPOINT_LOCATION": str(tmp_path / "checkpoints"),
        "GEOINGEST_SPARK_MASTER": "local[2]",
        "GEOINGEST_DRIVER_MEMORY": "1g",
        "GEOINGEST_CACHE_DIR": str(CACHE_DIR),
        "GEOINGEST_METRICS_PORT": "0",
    }


def test_create_describe_run_and_query(env, kafka, topic):
    created = geoingest(env, "table", "create", "--contract", str(CONTRACT))
    described = json.loads(geoingest(env, "table", "describe", "--table", "demo.events").stdout)
    assert json.loads(created.stdout)["table"] == "demo.events"
    assert described["format_version"] == 2
    assert described["geometry"] == {
        "column": "geometry",
        "encoding": "wkb",
        "crs": "EPSG:4326",
        "covering": "bbox",
        "types": "Point,LineString,Polygon,MultiPoint,MultiLineString,MultiPolygon",
        "dimensions": "XY,XYZ",
    }
    assert [f["id"] for f in described["schema"]] == list(range(1, 11))

    features = [
        json.dumps(
            {
                "type": "Feature",
                "id": f"e{i}",
                "properties": {"kind": "ping"},
                "geometry": {"type": "Point", "coordinates": [10 + i * 0.01, 50 + i * 0.01]},
            }
        ).encode()
        for i in range(300)
    ]
    records = [(f"e{i}".encode(), v, []) for i, v in enumerate(features)]
    records.append((b"w1", shapely.to_wkb(shapely.Point(10.5, 50.5)), [("kind", b"site")]))
    records.append((b"bad", b"not an event", []))
    assert produce_records(kafka.bootstrap, topic, records) == len(records)

    ran = geoingest(env, "run", "--contract", str(CONTRACT), "--until-idle")
    summary = json.loads(ran.stdout)
    assert summary["consumed"] == 302
    log_lines = [json.loads(line) for line in ran.stderr.splitlines() if line.startswith('{"ts"')]
    batch_lines = [line["batch"] for line in log_lines if line["msg"] == "batch"]
    assert len(batch_lines) == summary["batches"], "one structured summary line per batch"
    assert sum(b["consumed"] for b in batch_lines) == 302 and batch_lines[0]["commit"] == "committed"
    assert summary["committed_rows"] == 301
    assert summary["rejected"] == {"unknown_format": 1}

    # A second run finds nothing new: the checkpoint holds the offsets.
    again = json.loads(geoingest(env, "run", "--contract", str(CONTRACT), "--until-idle").stdout)
    assert again["consumed"] == 0

    count = json.loads(
        geoingest(env, "query", "--table", "demo.events", "--bbox", "10,50,10.5,50.5", "--format", "count").stdout
    )
    # e0..e50 lie in the window (e50 on its corner), and so does the WKB point on the corner.
    assert count["count"] == 52
    assert count["files_scanned"] >= 1

    lines = geoingest(env, "query", "--table", "demo.events", "--bbox", "10,50,10.1,50.1", "--limit", "5").stdout
    found = [json.loads(line) for line in lines.splitlines()]
    assert len(found) == 5 and all(f["type"] == "Feature" for f in found)


def test_run_with_create_table_starts_on_a_fresh_catalog(env, kafka, topic):
    # The image's default command: no `table create` first.
    missing = geoingest(env, "run", "--contract", str(CONTRACT), "--until-idle", check=False)
    assert missing.returncode == 2 and "table demo.events does not exist" in missing.stderr
    records = [(b"p", shapely.to_wkb(shapely.Point(10 + i * 0.01, 50)), []) for i in range(20)]
    assert produce_records(kafka.bootstrap, topic, records) == 20
    ran = geoingest(env, "run", "--contract", str(CONTRACT), "--until-idle", "--create-table")
    created, summary = (json.loads(line) for line in ran.stdout.splitlines())
    assert created["table"] == "demo.events" and created["created"] is True
    assert summary["consumed"] == 20 and summary["committed_rows"] == 20
    # An existing table is checked against the contract and kept.
    again = geoingest(env, "run", "--contract", str(CONTRACT), "--until-idle", "--create-table")
    assert json.loads(again.stdout.splitlines()[0])["created"] is False


def test_errors_name_their_input(env):
    missing = geoingest(env, "table", "create", "--contract", "/no/such/contract.json", check=False)
    assert missing.returncode == 2 and "/no/such/contract.json" in missing.stderr
    bad_bbox = geoingest(env, "query", "--table", "demo.events", "--bbox", "1,2,3", check=False)
    assert bad_bbox.returncode == 2 and "1,2,3" in bad_bbox.stderr


def test_table_orphans_delete_holds_the_lease_and_refuses_an_age_below_the_commit_window(tmp_path):
    import time

    import numpy as np

    from streaming.contract import load_contract
    from streaming.maintenance.lease import MaintenanceLease, lease_state
    from streaming.table.catalog import open_catalog
    from tests.streaming.maintenance.test_maintain import table_ids, world_points, write_batches

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GEOINGEST_")},
        "GEOINGEST_CATALOG__URI": f"sqlite:///{tmp_path / 'catalog.db'}",
        "GEOINGEST_CATALOG__WAREHOUSE": f"file://{tmp_path / 'warehouse'}",
        "GEOINGEST_CACHE_DIR": str(CACHE_DIR),
    }
    geoingest(env, "table", "create", "--contract", str(CONTRACT))
    catalog = open_catalog(
        "geoingest", {"uri": env["GEOINGEST_CATALOG__URI"], "warehouse": env["GEOINGEST_CATALOG__WAREHOUSE"]}
    )
    table = catalog.load_table("demo.events")
    writer = write_batches(table, load_contract(CONTRACT), 2)
    dead, _, _ = writer.files(2, *world_points(np.random.default_rng(5), 50))  # a batch that died before its commit
    dead_paths = sorted(f.path.removeprefix("file://") for f in dead)
    two_hours_ago = time.time() - 2 * 3600
    for path in dead_paths:
        os.utime(path, (two_hours_ago, two_hours_ago))

    def orphans(*args: str) -> subprocess.CompletedProcess:
        return geoingest(env, "table", "orphans", "--table", "demo.events", *args, check=False)

    young = orphans("--delete", "--min-age-minutes", "5")
    assert young.returncode == 2 and len(young.stderr.strip().splitlines()) == 1, young.stderr
    assert young.stderr.startswith("geoingest: --min-age-minutes 5: 300 s is below 2466 s"), young.stderr
    assert "commit.retry.total-timeout-ms 1800000" in young.stderr
    listed = orphans("--min-age-minutes", "0")  # listing deletes nothing: any age
    assert sorted(json.loads(line)["path"] for line in listed.stdout.splitlines()) == dead_paths

    other = MaintenanceLease(catalog.load_table("demo.events"), 600)
    assert other.acquire()
    held = orphans("--delete")
    assert held.returncode == 2 and len(held.stderr.strip().splitlines()) == 1, held.stderr
    assert held.stderr.startswith(f"geoingest: table demo.events: maintenance lease held by {other.holder}")
    assert all(Path(p).exists() for p in dead_paths), "nothing deleted while another maintainer holds the lease"
    other.release()

    deleted = orphans("--delete")
    assert deleted.returncode == 0, deleted.stderr
    assert [json.loads(line)["path"] for line in deleted.stdout.splitlines()] == dead_paths
    assert not any(Path(p).exists() for p in dead_paths)
    table.refresh()
    assert lease_state(table).holder is None, "the command released the lease"
    assert len(table_ids(table)) == 200


def test_service_runs_until_sigterm_and_stops_after_the_batch(env, kafka, topic, tmp_path):
    import signal
    import time

    from pyiceberg.catalog import load_catalog

    geoingest(env, "table", "create", "--contract", str(CONTRACT))
    service = subprocess.Popen(
        [str(GEOINGEST), "run", "--contract", str(CONTRACT)],
        env={**env, "GEOINGEST_TRIGGER_INTERVAL": "1 second"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        catalog = load_catalog(
            "geoingest", uri=env["GEOINGEST_CATALOG__URI"], warehouse=env["GEOINGEST_CATALOG__WAREHOUSE"], type="sql"
        )
        table = catalog.load_table("demo.events")
        sent = 0
        for wave in range(2):  # the second wave arrives while the service is already running
            records = [
                (f"w{wave}-{i}".encode(), shapely.to_wkb(shapely.Point(i * 0.001, wave)), []) for i in range(200)
            ]
            sent += produce_records(kafka.bootstrap, topic, records)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                table.refresh()
                snapshot = table.current_snapshot()
                if (
                    snapshot
                    and int(snapshot.summary.additional_properties.get("geoingest.rows", 0))
                    and table.scan().to_arrow().num_rows == sent
                ):
                    break
                assert service.poll() is None, service.stderr.read()[-3000:]
                time.sleep(1)
            assert table.scan().to_arrow().num_rows == sent
        service.send_signal(signal.SIGTERM)
        out, err = service.communicate(timeout=120)
    finally:
        if service.poll() is None:
            service.kill()
    assert service.returncode == 0, err[-3000:]
    assert json.loads(out)["committed_rows"] == sent
    assert '"msg": "stop requested"' in err


# Pages whose `geoingest` command lines run here, in this order: the first makes the table and fills it.
RUN_PAGES = ("docs/cli.md", "README.md", "docs/reading.md")


def test_the_documented_commands_run(env, kafka, topic, tmp_path):
    """Every `geoingest` line of the fenced blocks of RUN_PAGES, as written, on a demo table of a few
    events (docs/cli.md makes it): each exits 0; a line shown twice runs once. The settings are the
    test's; relative paths (`schemas/...`, output files) are taken from a folder of the test's own."""
    lines = [(page, argv) for page in RUN_PAGES for argv in geoingest_lines(ROOT / page)]
    assert [argv[:2] for _, argv in lines[:2]] == [["table", "create"], ["run", "--contract"]], (
        "docs/cli.md's block starts by making the table and filling it"
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "schemas").symlink_to(ROOT / "schemas")
    features = [
        json.dumps(
            {
                "type": "Feature",
                "id": f"p{i}",
                "geometry": {"type": "Point", "coordinates": [2.2 + i * 0.01, 48.8 + i * 0.003]},
            }
        ).encode()
        for i in range(30)
    ]
    assert produce_records(kafka.bootstrap, topic, [(f"p{i}".encode(), v, []) for i, v in enumerate(features)]) == 30
    ran: set[tuple[str, ...]] = set()
    for page, argv in lines:
        if tuple(argv) in ran:  # the same line on another page
            continue
        ran.add(tuple(argv))
        result = geoingest(env, *argv, check=False, cwd=work)
        assert result.returncode == 0, f"{page}: geoingest {' '.join(argv)}: {result.stderr[-2000:]}"
    assert (work / "files.png").stat().st_size > 0 and (work / "window.parquet").stat().st_size > 0
