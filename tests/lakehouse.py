"""Fixtures for the lakehouse shape the tests run: an S3-compatible object store on loopback.

tests/conftest.py imports them: every test module can ask for them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.local.object_store import LocalObjectStore
from app.local.rest_catalog import LocalRestCatalog

WAREHOUSE_BUCKET = "warehouse"


@pytest.fixture(scope="session")
def object_store(tmp_path_factory) -> Iterator[LocalObjectStore]:
    """One object store for the test run, with the bucket `warehouse`."""
    # Imported here, not at the top: conftest imports this module's fixtures.
    from tests.conftest import CACHE_DIR

    store = LocalObjectStore(tmp_path_factory.mktemp("object-store"), CACHE_DIR)
    try:
        store.start()
        store.create_bucket(WAREHOUSE_BUCKET)
        yield store
    finally:
        store.stop()  # never leak a JVM, also when the start failed half-way


@pytest.fixture(scope="session")
def rest_catalog(object_store: LocalObjectStore, tmp_path_factory) -> Iterator[LocalRestCatalog]:
    """One Iceberg REST catalog server for the test run, its warehouse s3://warehouse/rest in
    `object_store`; clients connect with `rest_catalog.catalog_properties()`."""
    from tests.conftest import CACHE_DIR

    catalog = LocalRestCatalog(
        tmp_path_factory.mktemp("rest-catalog"),
        CACHE_DIR,
        f"s3://{WAREHOUSE_BUCKET}/rest",
        object_store.io_properties(),
    )
    try:
        catalog.start()
        yield catalog
    finally:
        catalog.stop()  # never leak a JVM, also when the start failed half-way
