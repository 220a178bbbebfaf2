"""The local object store, for real: S3Proxy from its jar, spoken to through pyiceberg's FileIO."""

from __future__ import annotations

import http.client
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyarrow import fs as pafs
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import PyArrowFileIO

from app.local.object_store import REQUEST_KINDS, LocalObjectStore, ObjectStoreError
from tests.conftest import CACHE_DIR

pytestmark = pytest.mark.integration

BUCKET = "warehouse"


@pytest.fixture(scope="module")
def no_aws_variables() -> Iterator[None]:
    """The store must be reachable through io_properties() alone, never through ambient AWS_* settings."""
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith("AWS_"):
                patch.delenv(name)
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory, no_aws_variables) -> Iterator[LocalObjectStore]:
    store = LocalObjectStore(tmp_path_factory.mktemp("object-store"), CACHE_DIR)
    try:
        store.start()
        store.create_bucket(BUCKET)
        yield store
    finally:
        store.stop()  # also after a failed assertion: never leak a JVM


def file_io(properties: dict[str, str]) -> PyArrowFileIO:
    io = load_file_io(properties, f"s3://{BUCKET}/x")
    assert isinstance(io, PyArrowFileIO)
    return io


def write(io: PyArrowFileIO, uri: str, data: bytes) -> None:
    with io.new_output(uri).create(overwrite=True) as out:
        out.write(data)


def read(io: PyArrowFileIO, uri: str) -> bytes:
    with io.new_input(uri).open() as stream:
        return stream.read()


def listing(io: PyArrowFileIO, prefix: str) -> dict[str, int]:
    filesystem = io.fs_by_scheme("s3", BUCKET)
    infos = filesystem.get_file_info(pafs.FileSelector(f"{BUCKET}/{prefix}", recursive=True))
    return {info.path: info.size for info in infos if info.type == pafs.FileType.File}


def spent(store: LocalObjectStore, before: dict[str, int]) -> dict[str, int]:
    return {kind: n - before.get(kind, 0) for kind, n in store.request_counts().items()}


def unsigned_get(store: LocalObjectStore, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", store.port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_start_is_idempotent_and_buckets_are_folders(store: LocalObjectStore) -> None:
    assert store.running()
    assert store.endpoint == f"http://127.0.0.1:{store.port}"
    pid_file = store.home / "s3proxy.pid"
    pid = pid_file.read_text()
    store.start()
    store.create_bucket(BUCKET)
    assert pid_file.read_text() == pid, "a second start reuses the running store"
    assert (store.data_dir / BUCKET).is_dir()
    assert store.io_properties() == {
        "s3.endpoint": store.endpoint,
        "s3.access-key-id": "geoingest",
        "s3.secret-access-key": store.secret_key,
        "s3.region": "us-east-1",
        "s3.path-style-access": "true",
    }


def test_file_io_writes_reads_lists_and_deletes(store: LocalObjectStore) -> None:
    assert [name for name in os.environ if name.startswith("AWS_")] == []
    io = file_io(store.io_properties())
    small, big = b"geo" * 100, os.urandom(12 * 1024 * 1024)
    before = store.request_counts()
    write(io, "s3://warehouse/roundtrip/small.bin", small)
    write(io, "s3://warehouse/roundtrip/deep/big.bin", big)
    write(io, "s3://warehouse/roundtrip/deep/empty.bin", b"")
    uploads = spent(store, before)
    assert uploads["PUT"] >= 4, f"the 12 MiB file went up in several parts: {uploads}"

    assert read(io, "s3://warehouse/roundtrip/small.bin") == small
    assert read(io, "s3://warehouse/roundtrip/deep/big.bin") == big
    assert read(io, "s3://warehouse/roundtrip/deep/empty.bin") == b""
    assert listing(io, "roundtrip") == {
        "warehouse/roundtrip/small.bin": len(small),
        "warehouse/roundtrip/deep/big.bin": len(big),
        "warehouse/roundtrip/deep/empty.bin": 0,
    }
    assert (store.data_dir / "warehouse" / "roundtrip" / "deep" / "big.bin").stat().st_size == len(big)

    io.delete("s3://warehouse/roundtrip/deep/big.bin")
    assert not io.new_input("s3://warehouse/roundtrip/deep/big.bin").exists()
    assert set(listing(io, "roundtrip")) == {"warehouse/roundtrip/small.bin", "warehouse/roundtrip/deep/empty.bin"}


def test_request_counts_follow_the_requests_by_kind(store: LocalObjectStore) -> None:
    io = file_io(store.io_properties())
    counts = store.request_counts()
    assert set(REQUEST_KINDS) <= set(counts)

    # Unsigned requests, refused (or told the object is missing), are still requests the store
    # received: exact, known kinds.
    before = store.request_counts()
    assert unsigned_get(store, "/warehouse/counted/object.bin") in (403, 404)
    assert unsigned_get(store, "/warehouse?list-type=2&prefix=counted%2F") in (403, 404)
    assert unsigned_get(store, "/warehouse/") in (403, 404)
    assert spent(store, before) == {"PUT": 0, "GET": 1, "HEAD": 0, "LIST": 2, "DELETE": 0, "POST": 0}

    before = store.request_counts()
    write(io, "s3://warehouse/counted/a.bin", b"a" * 1000)
    step = spent(store, before)
    assert step["PUT"] + step["POST"] >= 1 and step["GET"] == step["LIST"] == step["DELETE"] == 0, step

    before = store.request_counts()
    assert read(io, "s3://warehouse/counted/a.bin") == b"a" * 1000
    step = spent(store, before)
    assert step["GET"] >= 1 and step["PUT"] == step["POST"] == step["LIST"] == step["DELETE"] == 0, step

    before = store.request_counts()
    assert list(listing(io, "counted")) == ["warehouse/counted/a.bin"]
    step = spent(store, before)
    assert step["LIST"] == 1 and step["GET"] == step["PUT"] == step["POST"] == step["DELETE"] == 0, step

    before = store.request_counts()
    io.delete("s3://warehouse/counted/a.bin")
    step = spent(store, before)
    assert step["DELETE"] == 1 and step["GET"] == step["LIST"] == step["POST"] == 0, step


def test_data_survives_a_stop_and_start_at_the_same_endpoint(tmp_path: Path, no_aws_variables) -> None:
    home = tmp_path / "store"
    first = LocalObjectStore(home, CACHE_DIR)
    try:
        first.start()
        first.create_bucket("kept")
        io = file_io(first.io_properties())
        write(io, "s3://kept/a/b.bin", b"still here")
        first.stop()
        assert not first.running()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", first.port), timeout=1).close()

        again = LocalObjectStore(home, CACHE_DIR)  # another process would know only the home
        assert again.endpoint == first.endpoint
        again.start()
        assert again.request_counts() == dict.fromkeys(REQUEST_KINDS, 0), "counted from this start on"
        assert read(file_io(again.io_properties()), "s3://kept/a/b.bin") == b"still here"
    finally:
        first.stop()  # the same home: whichever of the two started last


def test_a_paused_store_times_out_and_answers_once_resumed(store: LocalObjectStore) -> None:
    io = file_io(store.io_properties())
    write(io, "s3://warehouse/paused/a.bin", b"frozen")
    impatient = {**store.io_properties(), "s3.connect-timeout": "1", "s3.request-timeout": "1"}
    store.pause()
    try:
        started = time.monotonic()
        with pytest.raises(OSError):
            read(file_io(impatient), "s3://warehouse/paused/a.bin")
        assert time.monotonic() - started < 30
        assert store.running(), "paused, not gone"
    finally:
        store.resume()
    assert read(file_io(impatient), "s3://warehouse/paused/a.bin") == b"frozen"


def test_a_wrong_secret_key_is_refused_as_access_denied(store: LocalObjectStore) -> None:
    wrong = {**store.io_properties(), "s3.secret-access-key": "not-the-secret"}
    write(file_io(store.io_properties()), "s3://warehouse/denied/a.bin", b"x")
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        read(file_io(wrong), "s3://warehouse/denied/a.bin")
    with pytest.raises(OSError, match="SIGNATURE_DOES_NOT_MATCH"):
        write(file_io(wrong), "s3://warehouse/denied/b.bin", b"y")
    impostor = LocalObjectStore(store.home, CACHE_DIR, secret_key="not-the-secret")
    assert impostor.endpoint == store.endpoint
    with pytest.raises(ObjectStoreError, match=r"Cannot create bucket 'other'.*ACCESS_DENIED"):
        impostor.create_bucket("other")
    assert not (store.data_dir / "other").exists()


def test_errors_name_their_cause(tmp_path: Path) -> None:
    unused = LocalObjectStore(tmp_path / "never-started", CACHE_DIR)
    with pytest.raises(ObjectStoreError, match="has not been started"):
        unused.request_counts()
    with pytest.raises(ObjectStoreError, match="'Bad_Bucket'"):
        unused.create_bucket("Bad_Bucket")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ObjectStoreError, match=f"port 127.0.0.1:{port} is already in use"):
            LocalObjectStore(tmp_path / "busy", CACHE_DIR, port=port).start()
    with pytest.raises(ObjectStoreError, match="not running"):
        unused.pause()
