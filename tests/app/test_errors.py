"""The one line the CLI prints for a failure: the innermost cause, not the first line of a traceback."""

from __future__ import annotations

from app.errors import innermost, one_line

SPARK_TEXT = """An error occurred while calling o97.awaitTermination.
: org.apache.spark.sql.streaming.StreamingQueryException: [FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach batch sink. SQLSTATE: 39000
=== Streaming Query ===
Traceback (most recent call last):
  File "/app/streaming/job.py", line 150, in __call__
    results = self._clustered(batch, batch_id, timings, isolate_decoder=False)
  File "/app/streaming/partition.py", line 385, in files_under
    filesystem, root = pafs.FileSystem.from_uri(location)
OSError: When resolving region for bucket 'warehouse': AWS Error NETWORK_CONNECTION during HeadBucket operation: curlCode: 6, Couldn't resolve host name

\tat org.apache.spark.api.python.PythonException.<init>(PythonException.scala:12)
"""


def test_a_traceback_inside_a_message_gives_its_last_raised_line():
    line = one_line(RuntimeError(f"the streaming query failed: {SPARK_TEXT}"))
    assert line == (
        "OSError: When resolving region for bucket 'warehouse': AWS Error NETWORK_CONNECTION during "
        "HeadBucket operation: curlCode: 6, Couldn't resolve host name"
    )


def test_a_chained_cause_is_named_after_the_place():
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as exc:
            raise RuntimeError("committing batch 3 to demo.events") from exc
    except RuntimeError as outer:
        assert isinstance(innermost(outer), ConnectionRefusedError)
        assert (
            one_line(outer)
            == "committing batch 3 to demo.events: ConnectionRefusedError: [Errno 111] Connection refused"
        )


def test_an_error_that_names_its_input_is_its_own_line():
    assert one_line(ValueError("table create needs --contract")) == "table create needs --contract"


def test_a_long_cause_is_cut_to_one_bounded_line():
    line = one_line(ValueError("x" * 5000 + "\nsecond line"))
    assert len(line) == 600 and "\n" not in line and line.endswith("...")
