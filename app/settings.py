"""One frozen, typed settings object, from defaults, an optional TOML file and the environment.

Precedence: environment (GEOINGEST_*) over the file (GEOINGEST_CONFIG or --config) over defaults.
Nested maps are set in the environment with a double underscore:
GEOINGEST_CATALOG__URI=postgresql+psycopg2://... or GEOINGEST_KAFKA__SASL_MECHANISM=PLAIN
(an upper-case key is translated, see _map_key: sasl.mechanism), a key spelled as the option
is kept as it is (GEOINGEST_SPARK__spark.executorEnv.TZ=UTC), and a whole map can be one JSON
object (GEOINGEST_CATALOG='{"s3.endpoint": "http://..."}').
Keys are case-sensitive: one that is a known catalog, Kafka or Spark property only when case is
ignored (GEOINGEST_CATALOG__S3.ENDPOINT, which pyiceberg would not read) is an error at start.
Values of keys that look secret are masked wherever settings are shown.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "GEOINGEST_"
_SECRET_MARKERS = (
    "password",
    "secret",
    "token",
    "jaas",
    "credential",
    "key.pem",
    "keystore",
    "truststore",
    "account-key",  # adls.account-key
    "account.key",  # spark.hadoop.fs.azure.account.key.<account>
    "connection-string",  # adls.connection-string
    "authorization",
)
# A map key under which every value is a secret: a REST catalog's extra HTTP headers (header.<name>).
_SECRET_PREFIXES = ("header.",)
_MASK = "***"
# Variables with the prefix that are read elsewhere than the settings: the file of settings, the
# Java the service runs on (app/java.py), the keystore password handed to keytool, the tests' knobs.
_OTHER_VARIABLES = frozenset({"CONFIG", "JAVA_HOME", "STORE_PASSWORD", "DEBEZIUM_ROWS", "DEBEZIUM_AVRO_ROWS"})
# What Kubernetes (service links, for a Service named geoingest) and Docker (container links) put
# into a container's environment: not settings, and no typo either.
_LINK_VARIABLES = re.compile(
    r"^(SERVICE_HOST|SERVICE_PORT(_.+)?|PORT(_\d+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?|NAME|ENV_.+)$"
)


def _default_cache_dir() -> str:
    return str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "geoingest")


@dataclass(frozen=True)
class Settings:
    # Kafka
    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = "geo-events"
    dlq_topic: str = ""  # default: "<topic>.dlq"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int = 1_000_000
    # Extra Kafka client options, passed to the Spark source as kafka.<key> (SASL, SSL, ...).
    kafka: dict[str, str] = field(default_factory=dict)
    # The schema registry of registry-encoded topics (contract format "avro"): its Confluent-compatible
    # API's base URL (`url`; Apicurio: .../apis/ccompat/v7), HTTP basic auth (`username`,
    # `password`, masked when shown), the CA file of an https registry (`ca_file`), `timeout_s`.
    # GEOINGEST_SCHEMA_REGISTRY__URL=https://... (docs/registry.md).
    schema_registry: dict[str, str] = field(default_factory=dict)
    # Topics and records routed to tables, each route a table of keys (TOML [[routes]]; in the
    # environment GEOINGEST_ROUTES, a JSON list): streaming/job/routes.py says which, docs/routing.md
    # how a service runs them. Empty: the one topic `topic` into the table of the run's contract.
    routes: tuple[dict[str, Any], ...] = ()
    # How often a service with pattern routes looks for new topics, in seconds.
    routes_refresh_s: int = 30
    # Where the records are read: "spark-kafka", Spark's Kafka source (a JVM consumer), or
    # "python", whose tasks read their offset ranges with librdkafka (docs/sources.md).
    source: str = "spark-kafka"
    # Iceberg catalog (pyiceberg properties)
    catalog_name: str = "geoingest"
    catalog: dict[str, str] = field(
        default_factory=lambda: {
            "type": "sql",
            "uri": f"sqlite:///{Path('.demo/catalog.db').absolute()}",
            "warehouse": f"file://{Path('.demo/warehouse').absolute()}",
        }
    )
    # Streaming
    checkpoint_location: str = field(default_factory=lambda: str(Path(".demo/checkpoints").absolute()))
    writer_id: str = ""  # default: made once and kept in the checkpoint location
    trigger_interval: str = "10 seconds"
    rows_per_partition: int = 1_000_000
    # How a micro-batch is clustered along the Hilbert curve (docs/flow.md):
    # "batch" sorts the whole batch without a Spark shuffle, "task" sorts each input partition on
    # its own (cheapest; files of one batch overlap), "shuffle" uses Spark's range exchange.
    clustering: str = "batch"
    # clustering "batch": a batch of at most this many valid rows is merged by the last of its
    # tasks rather than by a second Spark job (0: always the job)
    merge_in_task_max_rows: int = 1_000_000
    max_message_bytes: int = 1024 * 1024
    max_vertices: int = 100_000
    # Geometry work that is super-linear in a record's size (repairing an invalid polygon) gets at
    # most this many seconds per record; a record over it is rejected (time_budget_exceeded).
    max_record_seconds: float = 2.0
    # Geometries nested in geometries deeper than this are rejected: GEOS reads them recursively.
    max_nesting: int = 32
    # Rejected records (key + value + headers) above this are stored under the spill location and
    # dead-lettered as a pointer; the dead-letter topic is created to hold records up to this size.
    dead_letter_max_record_bytes: int = 8 * 1024 * 1024
    dead_letter_spill_location: str = ""  # default: <table location>/dead-letters
    # An Iceberg table (namespace.name, created if missing) the rejects are written to as well,
    # committed with their batch, for SQL over them (docs/rejects.md#the-rejects-table). "": none.
    rejects_table: str = ""
    # Spark
    spark_master: str = "local[*]"
    driver_memory: str = "2g"
    spark: dict[str, str] = field(default_factory=dict)  # any spark.* configuration
    # Local state
    cache_dir: str = field(default_factory=_default_cache_dir)
    hold_after_commit_file: str = ""  # test hook only: see streaming/job/processor.py JobConfig
    metrics_port: int = 9108  # /metrics, /healthz, /readyz; 0 turns the server off
    # /readyz fails when the query showed no batch or idle poll for this long
    ready_max_silence_s: int = 120
    # /healthz fails (the kubelet restarts the driver) when its watch loop stalls, a batch runs, or
    # no batch ends while records wait, for longer than this.
    live_max_stall_s: int = 900
    # Table maintenance (streaming/maintenance/maintain.py; docs/maintenance.md).
    # "beside" (default): a child process of the service runs it concurrently with ingest, never
    # in front of a micro-batch, at a lower priority and at most maintenance_cpu_percent of one core
    # (app/maintenance.py); "between-batches": the driver runs it after a batch commits, the next
    # batch waiting; "background": a thread of the driver runs it beside ingest;
    # "off": run `geoingest table maintain` in its own process (the chart's CronJob does).
    # Either way every maintenance_interval_s (all steps) and after every maintenance_interval_commits
    # batches (all but orphans, which list the whole table location): the count bounds metadata at
    # any trigger interval. A lease on the table (streaming/maintenance/lease.py) lets one maintainer run at a time.
    maintenance_mode: str = "beside"
    # "beside": the maintenance process's nice increment, and the share of one core it may use on
    # average over a run (it sleeps at each file it reads or deletes until it is within it)
    maintenance_nice: int = 10
    maintenance_cpu_percent: float = 25.0
    maintenance_interval_s: int = 3600
    maintenance_interval_commits: int = 10  # 0: by time alone
    # Runs the batch count starts come at least this many seconds apart: at a fast trigger ten
    # commits take seconds, and a run every few seconds races ingest's commits for nothing.
    maintenance_min_gap_s: int = 60
    maintenance_steps: str = "retention,compact,expire,orphans"  # some of retention, compact, expire, orphans
    # How long rows are kept, "N days" or "N hours" (docs/retention.md): maintenance drops whole time
    # partitions once past it. Empty: the table contract's "retention", else for ever.
    retention: str = ""
    maintenance_small_file_bytes: int = 0  # files below are compacted; 0: 3/4 of the contract's target
    maintenance_min_file_age_s: int = 3600  # younger files are not compacted
    maintenance_max_bin_bytes: int = 512 * 1024 * 1024  # input one rewrite holds in memory at most
    maintenance_max_manifests: int = 8  # more data manifests than this are merged
    maintenance_snapshot_max_age_s: int = 5 * 24 * 3600  # older snapshots expire ...
    maintenance_max_snapshots: int = 100  # ... and so do all beyond the newest this many (0: no limit) ...
    maintenance_keep_snapshots: int = 100  # ... except the newest this many
    # unreferenced files younger than this are kept; refused below the table's commit window plus 10 minutes
    maintenance_orphan_min_age_s: int = 3600
    maintenance_lease_s: int = 900  # a maintainer's hold on the table's lease, renewed while it works
    # upsert tables: rewrite the files deletes reach once their keys are this share of those rows
    maintenance_delete_ratio: float = 0.3

    @property
    def dead_letter_topic(self) -> str:
        return self.dlq_topic or f"{self.topic}.dlq"

    def checkpoint_for(self, table: str) -> str:
        return f"{self.checkpoint_location.rstrip('/')}/{table}"

    def shown(self) -> dict[str, Any]:
        """The settings as a user may see them: secrets masked."""
        return {k: _mask(k, v) for k, v in dataclasses.asdict(self).items()}

    def __repr__(self) -> str:
        return f"Settings({self.shown()!r})"


def _mask(key: str, value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _mask(k, v) for k, v in value.items()}
    lowered = key.lower()
    if any(marker in lowered for marker in _SECRET_MARKERS) or lowered.startswith(_SECRET_PREFIXES):
        return _MASK
    return mask_url(value) if isinstance(value, str) else value


def mask_url(value: str) -> str:
    """A URL's credentials masked: a password after the user (`user:***@`), or a user part alone,
    which is how a token rides in a URL (`***@`)."""
    if "://" not in value or "@" not in value:
        return value
    scheme, rest = value.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    if "/" in creds:  # an @ in the path, not in the authority
        return value
    return f"{scheme}://{creds.split(':')[0]}:{_MASK}@{host}" if ":" in creds else f"{scheme}://{_MASK}@{host}"


class SettingsError(ValueError):
    pass


def load_settings(
    config_file: str | Path | None = None, env: dict[str, str] | None = None, **overrides: Any
) -> Settings:
    env = dict(os.environ if env is None else env)
    values: dict[str, Any] = {}
    config_file = config_file or env.get(f"{ENV_PREFIX}CONFIG")
    if config_file:
        path = Path(config_file)
        try:
            values.update(tomllib.loads(path.read_text()))
        except FileNotFoundError:
            raise SettingsError(f"{path}: settings file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"{path}: not valid TOML ({exc})") from None
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    # Where each map entry was written, for the case check's message.
    origins: dict[tuple[str, str], str] = {}
    for name, value in values.items():
        if isinstance(value, dict):
            origins.update({(name, str(k)): f"{config_file} [{name}]" for k in value})
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX) or key == f"{ENV_PREFIX}CONFIG":
            continue
        head, _, sub = key.removeprefix(ENV_PREFIX).partition("__")
        name = head.lower()
        if name not in fields:
            if head in _OTHER_VARIABLES or _LINK_VARIABLES.match(key.removeprefix(ENV_PREFIX)):
                continue
            near = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.6)
            hint = f"did you mean {ENV_PREFIX}{near[0].upper()}?" if near else "docs/settings.md lists them"
            raise SettingsError(f"{key}: not a geoingest setting; {hint}")
        if isinstance(_default(fields[name]), dict):
            merged = values.setdefault(name, dict(_default(fields[name])))
            if not isinstance(merged, dict):
                raise SettingsError(f"{name}: expected a table of key = value, got {merged!r}")
            if sub:
                merged[_map_key(name, sub)] = raw
                origins[(name, _map_key(name, sub))] = key
            else:
                entries = _json_map(key, raw)
                merged.update(entries)
                origins.update({(name, k): key for k in entries})
        elif sub:
            raise SettingsError(f"{key}: {name} is a single value, not a map; drop the '__{sub}' part")
        else:
            values[name] = raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = set(values) - set(fields)
    if unknown:
        raise SettingsError(f"unknown settings: {sorted(unknown)}")
    typed = {name: _coerce(name, value, fields[name]) for name, value in values.items()}
    if typed.get("routes"):
        from streaming.job.routes import RouteError, parse_routes

        try:
            parse_routes(typed["routes"])
        except RouteError as exc:
            raise SettingsError(str(exc)) from None
    for name in ("catalog", "kafka", "spark"):
        for map_key in typed.get(name, {}):
            _check_case(name, map_key, origins.get((name, map_key), "the settings"))
    return Settings(**typed)


# Spark's own configuration keys that this project, its chart or its docs set; Spark reads keys
# case-sensitively, so these are the spellings that work. Prefixes take any suffix (its case kept).
_SPARK_KEYS = frozenset(
    {
        "spark.app.name",
        "spark.authenticate",
        "spark.authenticate.secret.driver.file",
        "spark.authenticate.secret.executor.file",
        "spark.blockManager.port",
        "spark.cores.max",
        "spark.default.parallelism",
        "spark.driver.bindAddress",
        "spark.driver.cores",
        "spark.driver.extraClassPath",
        "spark.driver.extraJavaOptions",
        "spark.driver.host",
        "spark.driver.maxResultSize",
        "spark.driver.memory",
        "spark.driver.memoryOverhead",
        "spark.driver.port",
        "spark.dynamicAllocation.enabled",
        "spark.dynamicAllocation.maxExecutors",
        "spark.dynamicAllocation.minExecutors",
        "spark.dynamicAllocation.shuffleTracking.enabled",
        "spark.executor.cores",
        "spark.executor.extraClassPath",
        "spark.executor.extraJavaOptions",
        "spark.executor.heartbeatInterval",
        "spark.executor.instances",
        "spark.executor.memory",
        "spark.executor.memoryOverhead",
        "spark.hadoop.fs.AbstractFileSystem.file.impl",
        "spark.jars",
        "spark.jars.packages",
        "spark.kubernetes.authenticate.driver.serviceAccountName",
        "spark.kubernetes.container.image",
        "spark.kubernetes.container.image.pullPolicy",
        "spark.kubernetes.container.image.pullSecrets",
        "spark.kubernetes.driver.pod.name",
        "spark.kubernetes.executor.deleteOnTermination",
        "spark.kubernetes.executor.limit.cores",
        "spark.kubernetes.executor.podNamePrefix",
        "spark.kubernetes.executor.podTemplateContainerName",
        "spark.kubernetes.executor.podTemplateFile",
        "spark.kubernetes.executor.request.cores",
        "spark.kubernetes.namespace",
        "spark.local.dir",
        "spark.master",
        "spark.memory.fraction",
        "spark.network.crypto.enabled",
        "spark.network.timeout",
        "spark.pyspark.python",
        "spark.python.daemon.module",
        "spark.python.worker.memory",
        "spark.python.worker.reuse",
        "spark.serializer",
        "spark.sql.adaptive.enabled",
        "spark.sql.execution.arrow.maxBytesPerBatch",
        "spark.sql.execution.arrow.maxRecordsPerBatch",
        "spark.sql.session.timeZone",
        "spark.sql.shuffle.partitions",
        "spark.sql.streaming.stopGracefullyOnShutdown",
        "spark.task.cpus",
        "spark.task.maxFailures",
        "spark.ui.enabled",
        "spark.ui.port",
        "spark.ui.showConsoleProgress",
    }
)
_SPARK_PREFIXES = (
    "spark.executorEnv.",
    "spark.kubernetes.driverEnv.",
    "spark.kubernetes.driver.label.",
    "spark.kubernetes.executor.label.",
    "spark.kubernetes.driver.annotation.",
    "spark.kubernetes.executor.annotation.",
    "spark.hadoop.",
    "spark.sql.catalog.",
)
_CONSUMERS = {"catalog": "pyiceberg", "kafka": "the Kafka client", "spark": "Spark"}
_PROPERTY_SHAPE = re.compile(r"^[a-z][a-z0-9_.-]*$")


def _known_keys(name: str) -> frozenset[str]:
    """The property names a map's consumer reads: pyiceberg's catalog and FileIO properties, the
    Java Kafka client's settings (all lower case), Spark's keys above."""
    if name == "spark":
        return _SPARK_KEYS
    if name == "catalog":
        import pyiceberg.catalog
        import pyiceberg.catalog.rest
        import pyiceberg.io

        modules: tuple[Any, ...] = (pyiceberg.io, pyiceberg.catalog, pyiceberg.catalog.rest)
        return frozenset(
            value
            for module in modules
            for constant, value in vars(module).items()
            if constant.isupper() and isinstance(value, str) and _PROPERTY_SHAPE.match(value)
        )
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    from streaming.source.java_settings import JAVA_TLS_SETTINGS

    python_names = {*KafkaConsumer.DEFAULT_CONFIG, *KafkaProducer.DEFAULT_CONFIG, *KafkaAdminClient.DEFAULT_CONFIG}
    java_names = {key.replace("_", ".") for key in python_names}
    return frozenset(java_names | JAVA_TLS_SETTINGS | {"sasl.jaas.config", "sasl.login.callback.handler.class"})


def _check_case(name: str, key: str, origin: str) -> None:
    """A key that names a known property only when case is ignored is a mistake the consumer would
    not report: pyiceberg, the Kafka client and Spark all ignore a key they do not know."""
    known = _known_keys(name)
    if key in known or any(key.startswith(prefix) for prefix in _SPARK_PREFIXES if name == "spark"):
        return
    meant = next((k for k in known if k.lower() == key.lower()), None)
    if meant is None and name == "spark":
        prefix = next((p for p in _SPARK_PREFIXES if key.lower().startswith(p.lower())), None)
        meant = prefix + key[len(prefix) :] if prefix else None
    if meant is not None:
        raise SettingsError(
            f"{origin}: {name} key {key!r} is {meant!r} spelled in another case, and keys are case-sensitive "
            f"({_CONSUMERS[name]} would ignore {key!r}); write {meant!r}"
        )


def _map_key(name: str, sub: str) -> str:
    """The key of a map entry set as GEOINGEST_<MAP>__<SUB>. A key written as the option is spelled
    (any lower-case letter, a dot or a hyphen: GEOINGEST_SPARK__spark.executorEnv.TZ) is kept as it
    is, since Spark's keys are case-sensitive; a shell-style upper-case one is translated: for kafka
    and spark each underscore is a dot (SASL_MECHANISM -> sasl.mechanism), for catalog pyiceberg's
    own rule applies where there is a double underscore (S3__ACCESS_KEY_ID -> s3.access-key-id)."""
    if sub != sub.upper() or "." in sub or "-" in sub:
        return sub
    sub = sub.lower()
    if name in ("kafka", "spark"):
        return sub.replace("_", ".")
    if name == "catalog":
        # pyiceberg's properties join words with hyphens (py-io-impl, s3.access-key-id), as its own
        # PYICEBERG_CATALOG__<NAME>__<KEY> variables spell them.
        return sub.replace("__", ".").replace("_", "-")
    return sub


def _json_map(key: str, raw: str) -> dict[str, str]:
    """A whole map in one variable, as a JSON object: GEOINGEST_SPARK='{"spark.executorEnv.TZ": "UTC"}'."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{key}: expected a JSON object of key: value ({exc})") from None
    if not isinstance(value, dict):
        raise SettingsError(f"{key}: expected a JSON object of key: value, got {raw!r}")
    return {str(k): str(v) for k, v in value.items()}


def _list_of_maps(name: str, value: Any) -> tuple[dict[str, Any], ...]:
    """A list of tables of keys: TOML's [[name]] entries, or a JSON list in one variable."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{ENV_PREFIX}{name.upper()}: expected a JSON list of objects ({exc})") from None
    if not isinstance(value, list | tuple) or not all(isinstance(entry, dict) for entry in value):
        raise SettingsError(f"{name}: expected a list of tables of key = value, got {value!r}")
    return tuple({str(k): v for k, v in entry.items()} for entry in value)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _coerce(name: str, value: Any, f: dataclasses.Field) -> Any:
    kind = type(_default(f))
    if kind is tuple:
        return _list_of_maps(name, value)
    if kind is dict:
        if not isinstance(value, dict):
            raise SettingsError(f"{name}: expected a table of key = value, got {value!r}")
        return {str(k): str(v) for k, v in value.items()}
    if kind is int:
        if isinstance(value, bool | float):
            raise SettingsError(f"{name}: expected a whole number, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise SettingsError(f"{name}: expected a whole number, got {value!r}") from None
    if kind is float:
        if isinstance(value, bool):
            raise SettingsError(f"{name}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise SettingsError(f"{name}: expected a number, got {value!r}") from None
    return str(value)
