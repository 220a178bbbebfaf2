"""The maintenance lease (streaming/maintenance/lease.py): maintainers racing on one table, on the embedded
SQLite catalog and on Iceberg's REST catalog server (whose own commit check decides the race)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from app.local.rest_catalog import LocalRestCatalog
from app.maven import configure_iceberg_java
from streaming.contract import parse_contract
from streaming.maintenance import native
from streaming.maintenance.lease import (
    ANCHOR_TAG,
    LEASE_PROPERTY,
    LeaseHeld,
    LeaseLost,
    LeaseState,
    MaintenanceLease,
    _change,
    generation_tag,
    lease_state,
)
from streaming.maintenance.maintain import maintain
from streaming.maintenance.plan import MaintenancePolicy
from streaming.table.catalog import create_table, open_catalog
from streaming.table.native import is_native
from tests.conftest import CACHE_DIR
from tests.lakehouse import WAREHOUSE_BUCKET
from tests.streaming.maintenance.test_maintain import (
    CONTRACT_PATH,
    EAGER,
    expected_ids,
    table_ids,
    write_batches,
)

configure_iceberg_java(CACHE_DIR)


@pytest.fixture(scope="module")
def lease_rest_catalog(object_store, tmp_path_factory):
    """One REST catalog server for the module: each test's table has a name of its own."""
    catalog = LocalRestCatalog(
        tmp_path_factory.mktemp("lease-rest"),
        CACHE_DIR,
        f"s3://{WAREHOUSE_BUCKET}/lease-{uuid.uuid4().hex[:8]}",
        object_store.io_properties(),
    )
    catalog.start()
    yield catalog
    catalog.stop()


@pytest.fixture(params=["sqlite", "rest", "sqlite-native"])
def catalog_config(request, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The catalog; "-native": the table is a native-geometry (v3) one, its lease changed by Iceberg Java."""
    if request.param.startswith("sqlite"):
        return "lease", {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
            "warehouse": f"file://{tmp_path / 'warehouse'}",
        }
    return "lease", request.getfixturevalue("lease_rest_catalog").catalog_properties()


@pytest.fixture
def contract(request):
    raw = json.loads(CONTRACT_PATH.read_text())
    raw["table"] = f"lease_{uuid.uuid4().hex[:8]}.events"
    raw["geometry"]["native"] = request.node.callspec.params.get("catalog_config", "").endswith("-native")
    return parse_contract(raw)


@pytest.fixture
def table(catalog_config, contract) -> Table:
    table, created = create_table(open_catalog(*catalog_config), contract)
    assert created
    return table


def own_table(catalog_config, contract) -> Table:
    """The table through a connection of its own, as another maintainer process holds it."""
    return open_catalog(*catalog_config).load_table(contract.table)


def fenced_mark(lease: MaintenanceLease, view: Table, mark: str) -> None:
    """A commit fenced by `lease` that leaves `mark` in the table (`marked` reads it)."""
    if is_native(view):
        with lease.native_fence(view) as fence:
            native.carrier(view, {"written-by": mark}, fence)
    else:
        with lease.fenced(view) as tx:
            tx.set_properties({"written-by": mark})


def marked(table: Table) -> str | None:
    table.refresh()
    if is_native(table):
        return table.current_snapshot().summary.additional_properties.get("written-by")
    return table.properties.get("written-by")


def race(contenders: list[Callable[[], object]]) -> list[object]:
    """Run the callables at the same moment, one thread each; each result or the exception it raised."""
    start = threading.Barrier(len(contenders))
    results: list[object] = [None] * len(contenders)

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = contenders[i]()
        except Exception as exc:  # the race's losers raise; the test looks at which
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(contenders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


@pytest.mark.integration
def test_of_maintainers_racing_for_the_lease_exactly_one_holds_it(catalog_config, table, contract):
    write_batches(table, contract, 1)
    for round_ in range(4):
        leases = [MaintenanceLease(own_table(catalog_config, contract), 600) for _ in range(4)]
        results = race([lease.acquire for lease in leases])
        winners = [lease for lease, r in zip(leases, results) if r is True]
        losers = [r for r in results if r is not True]
        assert len(winners) == 1, f"round {round_}: {results}"
        assert all(isinstance(r, LeaseHeld) for r in losers), losers
        assert all(winners[0].holder in str(r) for r in losers), "the loser's message names the holder"
        table.refresh()
        state = lease_state(table)
        assert state.holder == winners[0].holder and state.generation == winners[0].held.generation
        lease_tags = sorted(name for name in table.metadata.refs if name.startswith(ANCHOR_TAG))
        assert lease_tags == [ANCHOR_TAG, generation_tag(state.generation)], "one generation tag and the anchor"
        winners[0].release()
        table.refresh()
        assert lease_state(table).holder is None


@pytest.mark.integration
def test_an_expired_lease_is_taken_over_and_its_old_holder_stops(catalog_config, table, contract):
    write_batches(table, contract, 1)
    now = [1_000_000.0]
    old = MaintenanceLease(own_table(catalog_config, contract), 60, clock=lambda: now[0])
    new = MaintenanceLease(own_table(catalog_config, contract), 60, clock=lambda: now[0])
    assert old.acquire()
    with pytest.raises(LeaseHeld, match=old.holder):
        new.acquire()
    now[0] += 61
    assert new.acquire(), "expired: taken over"
    with pytest.raises(LeaseLost, match=new.holder):
        old.renew()
    old.release()
    table.refresh()
    assert lease_state(table).holder == new.holder, "the old holder's release frees nothing of the new lease"
    new.renew()
    new.release()
    table.refresh()
    assert lease_state(table).holder is None


@pytest.mark.integration
def test_a_commit_fenced_by_a_lease_that_was_taken_over_is_refused_by_the_catalog(catalog_config, table, contract):
    write_batches(table, contract, 1)
    now = [1_000_000.0]
    old = MaintenanceLease(own_table(catalog_config, contract), 60, clock=lambda: now[0])
    assert old.acquire()
    read_while_held = own_table(catalog_config, contract)
    now[0] += 61
    new = MaintenanceLease(own_table(catalog_config, contract), 60, clock=lambda: now[0])
    assert new.acquire(), "expired: taken over"

    # The old holder's table was read before the takeover: only the catalog can tell, and refuses.
    with pytest.raises(CommitFailedException):
        fenced_mark(old, read_while_held, "old")
    # Its retry reads the table again and stops without asking.
    with pytest.raises(LeaseLost, match=new.holder):
        fenced_mark(old, own_table(catalog_config, contract), "old")
    fenced_mark(new, own_table(catalog_config, contract), "new")
    assert marked(table) == "new"
    fenced_mark(new, own_table(catalog_config, contract), "new again")  # the holder's fence followed its tag
    assert marked(table) == "new again"
    new.confirm()  # read afresh through a catalog connection of the lease's own
    new.release()


@pytest.mark.integration
def test_a_maintainer_that_read_the_table_before_any_lease_cannot_start_a_second_one(catalog_config, table, contract):
    write_batches(table, contract, 1)
    stale = own_table(catalog_config, contract)
    assert lease_state(stale) == LeaseState(0, None, 0)
    first = MaintenanceLease(own_table(catalog_config, contract), 600)
    assert first.acquire()
    first.release()
    assert first.acquire()  # generation 3, held; the stale reader still sees no lease at all
    with pytest.raises(CommitFailedException):
        _change(stale, LeaseState(0, None, 0), "stale", 2**62)
    table.refresh()
    assert lease_state(table).holder == first.holder


@pytest.mark.integration
def test_two_maintainers_racing_on_one_table_compact_once_and_lose_no_row(catalog_config, table, contract):
    write_batches(table, contract, 6)
    before = table_ids(table)
    tables = [own_table(catalog_config, contract) for _ in range(2)]
    reports = race([lambda t=t: maintain(t, EAGER, steps=("compact", "expire")) for t in tables])

    assert not [r for r in reports if isinstance(r, Exception)], reports
    ran = [r for r in reports if r.skipped is None]
    skipped = [r for r in reports if r.skipped is not None]
    assert len(ran) == 1 and len(skipped) == 1, [r.to_json() for r in reports]
    assert "maintenance lease held by" in skipped[0].skipped
    assert skipped[0].compaction is None and skipped[0].expiry is None, "the loser touched nothing"
    assert ran[0].compaction.files_rewritten > 0 and ran[0].compaction.bins_abandoned == 0
    assert table_ids(table) == before == expected_ids(range(6)), "every row once"
    table.refresh()
    assert lease_state(table).holder is None, "released after the run"
    assert LEASE_PROPERTY in table.metadata.properties


@pytest.mark.integration
def test_lease_tags_pin_no_old_snapshot_after_a_run(catalog_config, table, contract):
    policy = MaintenancePolicy(min_file_age_s=0, snapshot_max_age_s=0, keep_snapshots=1, orphan_min_age_s=0)
    writer = write_batches(table, contract, 3)
    maintain(own_table(catalog_config, contract), policy, steps=("compact", "expire"))
    rng = np.random.default_rng(8)
    from tests.streaming.maintenance.test_maintain import world_points

    for batch_id in range(3, 6):
        writer.commit(batch_id, *world_points(rng, 100))
    maintain(own_table(catalog_config, contract), policy, steps=("compact", "expire"))
    table.refresh()
    current = table.current_snapshot().snapshot_id
    pinned = {ref.snapshot_id for name, ref in table.metadata.refs.items() if name.startswith(ANCHOR_TAG)}
    assert pinned == {current}, "the lease tags follow the table"
    assert len(table.metadata.snapshots) <= 3, "expiry was not held back by the lease"
    assert table_ids(table) == expected_ids(range(6))


def test_a_lease_of_a_process_of_this_host_that_is_gone_does_not_hold():
    import socket
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        host = socket.gethostname()
        far_future = 2**62
        assert not LeaseState(3, f"{host}:{gone.pid}:abcd", far_future).held_by_other("me", 0), "killed: free"
        assert LeaseState(3, f"{host}:{alive.pid}:abcd", far_future).held_by_other("me", 0), "running: held"
        assert LeaseState(3, f"elsewhere:{gone.pid}:abcd", far_future).held_by_other("me", 0), "another host's"
    finally:
        alive.kill()
