"""The one way the product reaches storage: through the table's FileIO.

Table, staging, marker, spill and orphan files may live on a local disk or in a bucket
(`s3://`, ...). pyiceberg's FileIO knows how to reach either with the catalog's properties
(`s3.endpoint`, `s3.access-key-id`, `s3.region`, ...), on the driver and, rebuilt from the same
properties, on the executors. pyarrow's `FileSystem.from_uri` does not: it ignores those properties
and asks AWS for the bucket. FileIO has no listing, so listings go through the very filesystem
object the FileIO reads and writes with (`fs_by_scheme`), built from the same properties. With no
keys configured, that filesystem falls back to the ambient credentials (instance role, IRSA,
AWS_* variables), as pyarrow's S3 client does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyarrow import fs as pafs
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.io.pyarrow import PyArrowFileIO

WRITE_DATA_PATH = "write.data.path"


@dataclass(frozen=True)
class StoredFile:
    uri: str  # in the scheme of the folder it was listed under
    size: int
    mtime_s: float | None  # seconds since the epoch, None where the store does not say


def file_io(properties: Mapping[str, str], location: str) -> FileIO:
    """A FileIO for `location` from catalog / table properties (what an executor rebuilds)."""
    return load_file_io(properties=dict(properties), location=location)


def filesystem_of(io: FileIO, location: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem `io` uses for `location`, and the location's path in it."""
    scheme, netloc, path = PyArrowFileIO.parse_location(location, io.properties)
    if isinstance(io, PyArrowFileIO):
        return io.fs_by_scheme(scheme, netloc), path
    get_fs = getattr(io, "get_fs", None)  # pyiceberg's FsspecFileIO
    if get_fs is None:
        raise ValueError(
            f"{type(io).__name__} cannot list {location}: set py-io-impl to "
            "pyiceberg.io.pyarrow.PyArrowFileIO or pyiceberg.io.fsspec.FsspecFileIO"
        )
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    return PyFileSystem(FSSpecHandler(get_fs(scheme))), path


def data_location(table) -> str:
    """Where a table's data files go: Iceberg's `write.data.path` property (another bucket or
    prefix, as other engines honour it), else <table location>/data."""
    return table.properties.get(WRITE_DATA_PATH) or f"{table.location().rstrip('/')}/data"


def list_files(io: FileIO, location: str) -> list[StoredFile]:
    """The files below a folder, recursively, sorted by URI; none when the folder is missing.
    Object stores have no folders: a prefix with nothing under it is an empty listing."""
    filesystem, root = filesystem_of(io, location)
    prefix = _uri_prefix(location, root)
    infos = filesystem.get_file_info(pafs.FileSelector(root.rstrip("/"), recursive=True, allow_not_found=True))
    return sorted(
        (
            StoredFile(f"{prefix}{info.path}", info.size or 0, info.mtime.timestamp() if info.mtime else None)
            for info in infos
            if info.type == pafs.FileType.File
        ),
        key=lambda f: f.uri,
    )


def delete_folder(io: FileIO, location: str) -> None:
    """Delete a folder and everything below it, if it is there. One call: deleting its files one by
    one leaves an object store's empty folder marker behind for each (pyarrow writes one back
    after every delete, so that the folder still "exists"), two per staged batch, forever."""
    filesystem, root = filesystem_of(io, location)
    if filesystem.get_file_info(root.rstrip("/")).type == pafs.FileType.NotFound:
        return
    filesystem.delete_dir(root.rstrip("/"))


def read_bytes(io: FileIO, uri: str) -> bytes:
    with io.new_input(uri).open() as stream:
        return stream.read()


def write_bytes(io: FileIO, uri: str, data: bytes) -> None:
    with io.new_output(uri).create(overwrite=True) as stream:
        stream.write(data)


def _uri_prefix(location: str, root: str) -> str:
    """What turns a path of the filesystem back into a URI like `location`: "s3://" for
    s3://bucket/..., "file://" for file:///..., nothing for a plain local path."""
    if "://" not in location:
        return ""
    scheme = location.split("://", 1)[0]
    return f"{scheme}://" if scheme != "file" or root.startswith("/") else f"{scheme}:///"
