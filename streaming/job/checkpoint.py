"""Spark's checkpoint location, and the writer id of a streaming query kept beside it.

A replayed batch is recognised by (writer id, batch id) in the table. Spark numbers batches from 0
for every new checkpoint, so the writer id must change exactly when the checkpoint does: it is made
once, at random, stored in the checkpoint location, and read back on every restart. A lost
checkpoint therefore gets a new writer id, and its batch 0 is never mistaken for an old one.

The checkpoint is a local path: a volume of the driver (the chart's PVC). With a foreachBatch sink
only the driver reads and writes it (offset and commit logs, no state store), so executors never
need it. On an object store Spark would need Hadoop's S3A jars and the AWS SDK bundle (over
500 MB) on the driver, and S3's listing of the offset log at every trigger; a volume is both
cheaper and simpler, so an object-store URI is refused at start with a line that says so.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

WRITER_ID_FILE = "geoingest-writer-id"


class CheckpointLocationError(ValueError):
    """The checkpoint location is not a local path."""


def checkpoint_path(checkpoint_location: str) -> Path:
    """The local folder of a checkpoint location given as a path or a file:// URI."""
    if "://" in checkpoint_location or checkpoint_location.startswith("file:"):
        scheme = checkpoint_location.split(":", 1)[0]
        if scheme != "file":
            raise CheckpointLocationError(
                f"checkpoint_location {checkpoint_location!r}: Spark's checkpoint must be a local path or a "
                f"mounted volume of the driver (the chart's checkpoint PVC), not {scheme}://; table, staging "
                "and dead-letter files go to the object store through the catalog's FileIO"
            )
        checkpoint_location = checkpoint_location.removeprefix("file://").removeprefix("file:")
    return Path(checkpoint_location)


def writer_id_for_checkpoint(checkpoint_location: str) -> str:
    folder = checkpoint_path(checkpoint_location)
    path = folder / WRITER_ID_FILE
    if path.is_file():
        return path.read_text().strip()
    folder.mkdir(parents=True, exist_ok=True)
    writer_id = f"geoingest-{uuid.uuid4().hex[:16]}"
    # Written aside and renamed: a crash never leaves an empty id that a restart would trust.
    partial = folder / f".{WRITER_ID_FILE}.{os.getpid()}"
    partial.write_text(writer_id)
    os.replace(partial, path)
    return writer_id


def checkpoint_has_progress(checkpoint_location: str) -> bool:
    """Whether Spark has recorded offsets there (a resumed query then ignores startingOffsets)."""
    offsets = checkpoint_path(checkpoint_location) / "offsets"
    return offsets.is_dir() and any(entry.is_file() for entry in offsets.iterdir())
