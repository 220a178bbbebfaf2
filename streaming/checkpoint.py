"""The writer id of a streaming query, kept beside its Spark checkpoint.

A replayed batch is recognised by (writer id, batch id) in the table. Spark numbers batches from 0
for every new checkpoint, so the writer id must change exactly when the checkpoint does: it is made
once, at random, stored in the checkpoint location, and read back on every restart. A lost
checkpoint therefore gets a new writer id, and its batch 0 is never mistaken for an old one.
"""

from __future__ import annotations

import uuid

from pyarrow import fs

WRITER_ID_FILE = "geoingest-writer-id"


def writer_id_for_checkpoint(checkpoint_location: str) -> str:
    filesystem, root = fs.FileSystem.from_uri(_as_uri(checkpoint_location))
    path = f"{root.rstrip('/')}/{WRITER_ID_FILE}"
    if filesystem.get_file_info(path).type == fs.FileType.File:
        with filesystem.open_input_stream(path) as stream:
            return stream.read().decode().strip()
    filesystem.create_dir(root, recursive=True)
    writer_id = f"geoingest-{uuid.uuid4().hex[:16]}"
    with filesystem.open_output_stream(path) as stream:
        stream.write(writer_id.encode())
    return writer_id


def checkpoint_has_progress(checkpoint_location: str) -> bool:
    """Whether Spark has recorded offsets there (a resumed query then ignores startingOffsets)."""
    filesystem, root = fs.FileSystem.from_uri(_as_uri(checkpoint_location))
    offsets = filesystem.get_file_info(fs.FileSelector(f"{root.rstrip('/')}/offsets", allow_not_found=True))
    return any(info.type == fs.FileType.File for info in offsets)


def _as_uri(location: str) -> str:
    return location if "://" in location else f"file://{location}"
