"""The service image as a user runs it: built from the Dockerfile (`make image`, app/local/image.py),
run with podman on a read-only root as the Dockerfile's header says, ingesting from the tests'
broker on loopback (the container shares the host's network: nothing leaves the machine), and the
table read back with the image's own `geoingest query`.

These run under `make test-cluster` (marker `image`), not `make test`: the first build takes minutes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
import urllib.request
import uuid

import pytest
import shapely
from kafka import KafkaConsumer

from app.local.broker import free_port
from app.local.image import DEFAULT_TAG, ROOT, Podman
from tests.conftest import produce_records

pytestmark = pytest.mark.image

DOCKERFILE = ROOT / "Dockerfile"
UID = 10001


def header_run_flags() -> list[str]:
    """The flags of the `docker run` in the Dockerfile's header, continuation lines joined."""
    header = "\n".join(line[1:].strip() for line in DOCKERFILE.read_text().splitlines() if line.startswith("#"))
    match = re.search(r"docker run (.*?) geoingest:dev", header.replace("\\\n", " "), re.DOTALL)
    assert match, "the Dockerfile's header shows no `docker run ... geoingest:dev`"
    return shlex.split(match.group(1))


def root_flags() -> list[str]:
    """The header's flags for the root filesystem: read-only, and its tmpfs mounts."""
    flags = header_run_flags()
    out = [flag for flag in flags if flag == "--read-only"]
    out += [f"--tmpfs={flags[i + 1]}" for i, flag in enumerate(flags) if flag == "--tmpfs"]
    assert "--read-only" in out and len(out) >= 3, f"the header's docker run has no read-only root with tmpfs: {flags}"
    return out


def sh(podman: Podman, script: str, *flags: str) -> str:
    """A shell script in the image, as the image's user, on the header's read-only root."""
    result = podman.run(
        "run", "--rm", "--network=none", *root_flags(), *flags, "--entrypoint=bash", DEFAULT_TAG, "-c", script
    )
    return result.stdout


def test_the_image_runs_as_its_own_user_on_a_read_only_root(podman):
    out = sh(
        podman,
        "id -u; id -g; echo HOME=$HOME; pwd;"
        " touch /opt/geoingest/x 2>/dev/null && echo root-writable || echo root-read-only;"
        " touch /scratch/x /tmp/x && echo scratch-writable",
    ).split()
    assert out[:4] == [str(UID), str(UID), "HOME=/scratch", "/scratch"]
    assert out[4:] == ["root-read-only", "scratch-writable"]


def test_driver_and_executors_run_on_one_java(podman):
    # The driver's JVM is app/java.py's choice; an executor pod runs ${JAVA_HOME}/bin/java.
    out = sh(
        podman,
        "python -c 'from pathlib import Path; from app.java import java_executable;"
        ' print(java_executable(Path("/opt/geoingest/cache")))\'; echo $JAVA_HOME/bin/java;'
        " $JAVA_HOME/bin/java -version 2>&1 | head -1",
    ).splitlines()
    driver, executor, version = out[0], out[1], out[2]
    assert driver == executor == "/usr/lib/jvm/java-17/bin/java"
    assert re.search(r'version "17\.', version), version


def test_the_header_command_ingests_into_a_fresh_catalog(podman, kafka, topic, tmp_path):
    """The header's `docker run` flags as written, plus where the broker is; the default command."""
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, UID, UID)
    port = free_port()
    flags = header_run_flags()
    # The header's named volume becomes a folder the test can look into; its broker, ours.
    flags = [f"{data}:/data" if flag == "geoingest-data:/data" else flag for flag in flags]
    flags = [f"GEOINGEST_BOOTSTRAP_SERVERS={kafka.bootstrap}" if flag.startswith("GEOINGEST_BOOTSTRAP") else flag
             for flag in flags]  # fmt: skip
    assert f"{data}:/data" in flags and "--read-only" in flags
    name = f"geoingest-{uuid.uuid4().hex[:8]}"
    # No timer for the check (no systemd here); the test runs it itself, below.
    extra = [f"--name={name}", "--network=host", "--health-interval=disable"]
    extra += ["-e", f"GEOINGEST_TOPIC={topic}", "-e", f"GEOINGEST_METRICS_PORT={port}"]
    extra += ["-e", "GEOINGEST_TRIGGER_INTERVAL=1 second", "-e", "GEOINGEST_DRIVER_MEMORY=1g"]
    podman.run("run", "--detach", *extra, *flags, DEFAULT_TAG)
    try:
        good = [
            (f"e{i}".encode(), shapely.to_wkb(shapely.Point(10 + i * 0.001, 50 + i * 0.001)), []) for i in range(500)
        ]
        bad = [(f"bad{i}".encode(), b"not an event", []) for i in range(7)]
        assert produce_records(kafka.bootstrap, topic, good + bad) == 507

        committed = wait_for_metric(
            port, "geoingest_events_consumed_total", 507, timeout_s=300, podman=podman, name=name
        )
        assert committed == 507
        # The image's HEALTHCHECK as the image holds it, run beside the service in its network
        # with its environment. (`podman healthcheck run` execs into the container, and an exec
        # here does not enter the container's mount namespace: this machine's kernel is gVisor.)
        image = json.loads(podman.run("image", "inspect", DEFAULT_TAG).stdout)[0]
        check = image.get("Healthcheck") or image["Config"].get("Healthcheck")
        assert check["Test"][0] == "CMD-SHELL" and "/healthz" in check["Test"][1], check
        health = podman.run(
            "run", "--rm", "--network=host", *root_flags(), "-e", f"GEOINGEST_METRICS_PORT={port}",
            "--entrypoint=/bin/sh", DEFAULT_TAG, "-c", check["Test"][1], check=False,
        )  # fmt: skip
        assert health.returncode == 0, f"the image's HEALTHCHECK failed: {health.stdout}{health.stderr}"

        stop = podman.run("stop", "--time=90", name)
        assert stop.returncode == 0
        exit_code = podman.run("inspect", "--format={{.State.ExitCode}}", name).stdout.strip()
        logs = podman.run("logs", name).stderr
        assert exit_code == "0", f"the service exited {exit_code} on SIGTERM:\n{logs[-3000:]}"
        assert '"created": true' in podman.run("logs", name).stdout
    finally:
        podman.run("rm", "--force", name, check=False)

    # Read back as a user would, with the image's own CLI on the same volume.
    count = podman.run(
        "run", "--rm", "--network=none", *root_flags(), f"--volume={data}:/data",
        "-e", "GEOINGEST_CATALOG__URI=sqlite:////data/catalog.db",
        "-e", "GEOINGEST_CATALOG__WAREHOUSE=file:///data/warehouse",
        "--entrypoint=geoingest", DEFAULT_TAG,
        "query", "--table", "demo.events", "--bbox=-180,-90,180,90", "--format", "count",
    ).stdout  # fmt: skip
    rows = json.loads(count)["count"]
    dead = count_records(kafka.bootstrap, f"{topic}.dlq")
    assert (rows, dead) == (500, 7), f"table rows {rows} + dead letters {dead} != 507 produced"


def wait_for_metric(port: int, metric: str, want: float, timeout_s: float, podman: Podman, name: str) -> float:
    deadline = time.monotonic() + timeout_s
    value = 0.0
    while time.monotonic() < deadline:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            value = sum(float(v) for v in re.findall(rf"^{metric}{{[^}}]*}} (\S+)$", text, re.MULTILINE))
            if value >= want:
                return value
        except OSError:
            pass
        state = podman.run("inspect", "--format={{.State.Status}}", name, check=False).stdout.strip()
        if state not in ("running", "created"):
            logs = podman.run("logs", name, check=False)
            raise AssertionError(f"the container is {state}:\n{(logs.stdout + logs.stderr)[-3000:]}")
        time.sleep(2)
    logs = podman.run("logs", name, check=False)
    raise AssertionError(f"{metric} {value} < {want} after {timeout_s} s:\n{(logs.stdout + logs.stderr)[-3000:]}")


def count_records(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000, group_id=None
    )
    try:
        return sum(1 for _ in consumer)
    finally:
        consumer.close()
