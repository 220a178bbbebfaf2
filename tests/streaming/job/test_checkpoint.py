import pytest

from streaming.job.checkpoint import (
    WRITER_ID_FILE,
    CheckpointLocationError,
    checkpoint_has_progress,
    writer_id_for_checkpoint,
)


def test_writer_id_is_kept_with_the_checkpoint(tmp_path):
    first = writer_id_for_checkpoint(str(tmp_path / "a"))
    assert first.startswith("geoingest-")
    assert writer_id_for_checkpoint(str(tmp_path / "a")) == first, "a restart keeps its writer id"
    assert (tmp_path / "a" / WRITER_ID_FILE).read_text() == first


def test_a_new_checkpoint_gets_a_new_writer_id(tmp_path):
    # Spark restarts batch ids at 0 for a new checkpoint: reusing the id would skip real batches.
    assert writer_id_for_checkpoint(str(tmp_path / "a")) != writer_id_for_checkpoint(str(tmp_path / "b"))


def test_progress_means_spark_wrote_an_offset_file(tmp_path):
    assert not checkpoint_has_progress(str(tmp_path / "none"))
    (tmp_path / "ck" / "offsets").mkdir(parents=True)
    assert not checkpoint_has_progress(str(tmp_path / "ck"))
    (tmp_path / "ck" / "offsets" / "0").write_text("v1")
    assert checkpoint_has_progress(str(tmp_path / "ck"))


def test_a_file_uri_is_the_same_folder(tmp_path):
    first = writer_id_for_checkpoint(f"file://{tmp_path / 'a'}")
    assert writer_id_for_checkpoint(str(tmp_path / "a")) == first


@pytest.mark.parametrize("location", ["s3://bucket/checkpoints", "s3a://bucket/ck", "gs://b/ck", "hdfs://nn/ck"])
def test_an_object_store_checkpoint_is_refused_naming_the_location(location):
    with pytest.raises(CheckpointLocationError, match="must be a local path or a mounted volume") as refused:
        writer_id_for_checkpoint(location)
    assert location in str(refused.value)
