"""The local Iceberg REST catalog server, for real: Iceberg's reference server over S3FileIO on the
local object store, spoken to with pyiceberg."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import requests
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import CommitFailedException

from app.local.object_store import LocalObjectStore
from app.local.process import port_answers
from app.local.rest_catalog import LocalRestCatalog, RestCatalogError
from tests.conftest import CACHE_DIR
from tests.lakehouse import WAREHOUSE_BUCKET

pytestmark = pytest.mark.integration

ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": pa.array(["a", "b", "c"])})


@pytest.fixture(scope="module")
def server(object_store: LocalObjectStore, tmp_path_factory) -> Iterator[LocalRestCatalog]:  # noqa: F811
    """A server of this module's own: the tests stop and freeze it, which the session's shared
    `rest_catalog` must not undergo. AWS_* variables set here must not reach it."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "not-the-store-key")
        env.setenv("AWS_SECRET_ACCESS_KEY", "not-the-store-secret")
        env.setenv("AWS_REGION", "eu-nowhere-1")
        catalog = LocalRestCatalog(
            tmp_path_factory.mktemp("rest-catalog"),
            CACHE_DIR,
            f"s3://{WAREHOUSE_BUCKET}/test-rest-catalog",
            object_store.io_properties(),
        )
        try:
            catalog.start()
            yield catalog
        finally:
            catalog.stop()


def client(server: LocalRestCatalog, timeout: float | None = None) -> Catalog:
    catalog = load_catalog(f"test-{uuid.uuid4().hex[:6]}", **server.catalog_properties())
    if timeout is not None:
        # pyiceberg's REST client sets no timeout of its own: a frozen server would hang it forever.
        session = catalog._session  # type: ignore[attr-defined]
        session.request = functools.partial(session.request, timeout=timeout)
    return catalog


def fresh_table(catalog: Catalog, **properties: str):
    catalog.create_namespace_if_not_exists("geo")
    return catalog.create_table(f"geo.t_{uuid.uuid4().hex[:8]}", schema=ROWS.schema, properties=properties)


def test_round_trip_through_s3_without_aws_variables(server: LocalRestCatalog, object_store: LocalObjectStore) -> None:  # noqa: F811
    environ = Path(f"/proc/{server._process.pid()}/environ").read_bytes().split(b"\0")
    assert not [v for v in environ if v.startswith(b"AWS_")], "the server must run on catalog properties alone"

    catalog = client(server)
    table = fresh_table(catalog)
    table.append(ROWS)

    loaded = client(server).load_table(table.name())
    assert loaded.location().startswith(f"s3://{WAREHOUSE_BUCKET}/test-rest-catalog/geo/")
    assert loaded.metadata_location.startswith(f"s3://{WAREHOUSE_BUCKET}/")  # written by the server's S3FileIO
    files = [task.file.file_path for task in loaded.scan().plan_files()]
    assert len(files) == 1 and files[0].startswith(f"s3://{WAREHOUSE_BUCKET}/test-rest-catalog/")
    assert loaded.scan().to_arrow().sort_by("id").equals(ROWS)
    # The store holds the metadata file the server wrote (through the object store's own data folder).
    key = loaded.metadata_location.removeprefix(f"s3://{WAREHOUSE_BUCKET}/")
    assert (object_store.data_dir / WAREHOUSE_BUCKET / key).is_file()


def test_tables_survive_a_restart_at_the_same_uri(server: LocalRestCatalog) -> None:
    table = fresh_table(client(server))
    table.append(ROWS)
    uri, port = server.uri, server.port

    server.stop()
    assert not server.running() and not port_answers(port)
    with pytest.raises(requests.exceptions.ConnectionError):
        client(server, timeout=5).load_table(table.name())

    again = LocalRestCatalog(server.home, CACHE_DIR, server.warehouse, server.io_properties)
    assert again.uri == uri, "a stopped server comes back at its port"
    server.start()
    assert client(server).load_table(table.name()).scan().to_arrow().sort_by("id").equals(ROWS)


def test_a_paused_server_times_calls_out_and_serves_after_resume(server: LocalRestCatalog) -> None:
    catalog = client(server, timeout=2)
    table = fresh_table(catalog)
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(requests.exceptions.Timeout):
            catalog.load_table(table.name())
        assert time.monotonic() - started < 10
    finally:
        server.resume()
    assert catalog.load_table(table.name()).scan().to_arrow().num_rows == 0


def test_conflicting_commits_raise_commit_failed(server: LocalRestCatalog) -> None:
    # pyiceberg retries a conflicting commit on fresh metadata by default; with no retries the
    # server's refusal (its assert-ref-snapshot-id check) reaches the caller.
    created = fresh_table(client(server), **{"commit.retry.num-retries": "0"})
    first = client(server).load_table(created.name())
    second = client(server).load_table(created.name())
    first.append(ROWS)
    with pytest.raises(CommitFailedException):
        second.append(ROWS)
    assert client(server).load_table(created.name()).scan().to_arrow().num_rows == len(ROWS)


def test_an_s3_warehouse_needs_region_and_keys(tmp_path: Path) -> None:
    with pytest.raises(RestCatalogError, match="s3.region, s3.access-key-id, s3.secret-access-key"):
        LocalRestCatalog(tmp_path, CACHE_DIR, "s3://warehouse/x", {"s3.endpoint": "http://127.0.0.1:1"})
