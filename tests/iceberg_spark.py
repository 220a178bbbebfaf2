"""Spark with Iceberg's own runtime, for the tests that check what Iceberg's Java side makes of a
table geoingest wrote: a script run in a Python process of its own (a Spark session needs Iceberg's
runtime jar on its classpath from the start), its answers as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from app.maven import resolve, without_spark_jars
from tests.conftest import CACHE_DIR

ROOT = Path(__file__).resolve().parents[1]
ICEBERG_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.2"
# How a conversing script marks the line that answers a request (Spark may print lines of its own).
ANSWER = "ANSWER "


def _command(path: Path, *args: str) -> list[str]:
    jars = without_spark_jars(resolve([ICEBERG_RUNTIME], CACHE_DIR, "iceberg-spark-runtime-4.0-1.10.2"))
    return [sys.executable, str(path), str(CACHE_DIR), ",".join(str(j) for j in jars), *args]


def run_with_iceberg_spark(script: str, tmp_path: Path, *args: str):
    """Run `script` with the arguments: the cache folder, the runtime's jars, `args`, then a file for
    its answer; returns the JSON it wrote there."""
    path, out = tmp_path / "iceberg_spark_script.py", tmp_path / "iceberg_spark_answer.json"
    path.write_text(script)
    done = subprocess.run(_command(path, *args, str(out)), timeout=600, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@contextmanager
def iceberg_spark_conversation(script: str, tmp_path: Path, *args: str) -> Iterator[Callable[[str], object]]:
    """Start `script` with the arguments (the cache folder, the runtime's jars, `args`) and yield
    `ask(request)`: the request written as a line to its stdin, the JSON of the next line it prints
    that starts with ANSWER returned. One Spark session serves every request of a test."""
    path, log = tmp_path / "iceberg_spark_script.py", tmp_path / "iceberg_spark_stderr.log"
    path.write_text(script)
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            _command(path, *args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT
        )

    def ask(request: str) -> object:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(request + "\n")
        process.stdin.flush()
        for line in process.stdout:
            if line.startswith(ANSWER):
                return json.loads(line[len(ANSWER) :])
        raise AssertionError(f"the Spark script exited {process.wait()}:\n{log.read_text()[-3000:]}")

    try:
        yield ask
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
