"""Kafka administration the service needs: making the dead-letter topic, listing partitions.

The service's `kafka` settings are Java client options (Spark's source takes them as
`kafka.<key>`); `client_config` turns them into the same connection for kafka-python, which the
dead-letter producer and the calls below use.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from streaming.source.java_settings import (
    JAVA_TLS_SETTINGS,
    PASSWORD_LOGIN_MODULES,
    SASL_PROTOCOLS,
    TLS_PROTOCOLS,
    parse_jaas,
)

log = logging.getLogger("geoingest.kafka")

_KAFKA_PYTHON_CLIENTS = (KafkaAdminClient, KafkaConsumer, KafkaProducer)
_KafkaClient = type[KafkaAdminClient] | type[KafkaConsumer] | type[KafkaProducer]
# The Java client's defaults, where kafka-python's differ and the connection would change.
_JAVA_SASL_MECHANISM = "GSSAPI"
_JAVA_STORE_TYPE = "JKS"

# Options read below (and those only the Java client has a use for): never passed on by name.
_TRANSLATED = frozenset({"security.protocol", "sasl.mechanism", "sasl.jaas.config"}) | JAVA_TLS_SETTINGS


def client_config(kafka_options: Mapping[str, str], client: _KafkaClient | None = None) -> dict[str, object]:
    """kafka-python's settings for the connection that the Java client options `kafka_options`
    describe (the ones a user writes for Spark's Kafka source).

    kafka-python spells the options it shares with the Java client with underscores
    (max.poll.records -> max_poll_records); numbers and booleans are converted to the types
    kafka-python expects. Security options are translated (sasl.jaas.config -> username and
    password, a PEM truststore -> ssl_cafile, ...). Options kafka-python does not know are left
    out: those of `client` (KafkaAdminClient, KafkaConsumer or KafkaProducer) when given, else
    those no kafka-python client knows. Options kafka-python cannot honour in any form (a JKS or
    PKCS12 store, a login module other than PLAIN, SCRAM or Kerberos) raise ValueError naming the
    option."""
    known = _known_options(client)
    config: dict[str, object] = {}
    for key, value in kafka_options.items():
        name = key.replace(".", "_")
        if key not in _TRANSLATED and name in known:
            config[name] = _typed(key, name, value)
    config.update(_security_config(kafka_options))
    return {name: value for name, value in config.items() if name in known}


def _known_options(client: _KafkaClient | None) -> set[str]:
    clients = (client,) if client is not None else _KAFKA_PYTHON_CLIENTS
    return set().union(*(c.DEFAULT_CONFIG for c in clients))


# Shared options whose "unset" the Java client spells as a value and kafka-python as None.
_JAVA_NONE = {"compression_type": "none", "receive_buffer_bytes": "-1", "send_buffer_bytes": "-1"}
_NUMBERS_WITHOUT_DEFAULT = ("receive_buffer_bytes", "send_buffer_bytes")


def _typed(key: str, name: str, value: object) -> object:
    """The value as kafka-python wants it: a number or a boolean where its default is one."""
    if not isinstance(value, str):
        return value
    if _JAVA_NONE.get(name) == value.strip().lower():
        return None
    default = next((c.DEFAULT_CONFIG[name] for c in _KAFKA_PYTHON_CLIENTS if name in c.DEFAULT_CONFIG), None)
    if name in _NUMBERS_WITHOUT_DEFAULT:
        default = 0
    if isinstance(default, bool):
        if value.strip().lower() not in ("true", "false"):
            raise ValueError(f"kafka option {key}={value!r}: expected true or false")
        return value.strip().lower() == "true"
    try:
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        pass  # a word where the default is a number (acks=all): the client reads it
    return value


def _security_config(options: Mapping[str, str]) -> dict[str, object]:
    config: dict[str, object] = {}
    protocol = options.get("security.protocol", "PLAINTEXT").strip().upper()
    if "security.protocol" in options:
        config["security_protocol"] = protocol
    if protocol in SASL_PROTOCOLS:
        config["sasl_mechanism"] = options.get("sasl.mechanism", _JAVA_SASL_MECHANISM).strip()
        if "sasl.jaas.config" in options:
            config.update(_jaas_credentials(options["sasl.jaas.config"]))
    if protocol in TLS_PROTOCOLS:  # the Java client ignores the ssl.* options otherwise
        config.update(_tls_config(options))
    return config


def _tls_config(options: Mapping[str, str]) -> dict[str, object]:
    config: dict[str, object] = {}
    if "ssl.truststore.certificates" in options:
        raise ValueError(
            "kafka option ssl.truststore.certificates: kafka-python reads CA certificates from a file "
            "only; put them in a PEM file and set ssl.truststore.location to it "
            "(with ssl.truststore.type=PEM)"
        )
    if "ssl.truststore.location" in options:
        _require_pem(options, "truststore")
        config["ssl_cafile"] = options["ssl.truststore.location"]
    for inline in ("ssl.keystore.certificate.chain", "ssl.keystore.key"):
        if inline in options:
            raise ValueError(
                f"kafka option {inline}: kafka-python reads a client certificate and key from a file "
                "only; put the key and the certificate chain in one PEM file and set "
                "ssl.keystore.location to it (with ssl.keystore.type=PEM)"
            )
    if "ssl.keystore.location" in options:
        _require_pem(options, "keystore")
        # The Java client's PEM keystore file holds the key and the chain, as Python's ssl takes a certfile.
        config["ssl_certfile"] = options["ssl.keystore.location"]
        if options.get("ssl.key.password"):
            config["ssl_password"] = options["ssl.key.password"]
    if "ssl.endpoint.identification.algorithm" in options:
        algorithm = options["ssl.endpoint.identification.algorithm"].strip()
        if algorithm.lower() not in ("", "https"):
            raise ValueError(
                f"kafka option ssl.endpoint.identification.algorithm={algorithm!r}: kafka-python knows "
                "only https (check the broker's host name) and the empty value (do not check it)"
            )
        config["ssl_check_hostname"] = bool(algorithm)
    return config


def _require_pem(options: Mapping[str, str], store: str) -> None:
    store_type = options.get(f"ssl.{store}.type", _JAVA_STORE_TYPE).strip()  # the Java client's "PEM" is case-sensitive
    if store_type != "PEM":
        raise ValueError(
            f"kafka option ssl.{store}.location: a {store_type} {store} (ssl.{store}.type"
            f"{'' if f'ssl.{store}.type' in options else ', the Java default'}) cannot be read by "
            f"kafka-python; convert it to a PEM file and set ssl.{store}.type=PEM, which the Java "
            "client reads as well"
        )


_KERBEROS_MODULE = "Krb5LoginModule"


def _jaas_credentials(jaas: str) -> dict[str, str]:
    """sasl_plain_username/password from a PLAIN or SCRAM login module's options."""
    module, options = parse_jaas(jaas)
    if module.endswith(PASSWORD_LOGIN_MODULES):
        missing = [name for name in ("username", "password") if name not in options]
        if missing:
            raise ValueError(f"kafka option sasl.jaas.config: {module} has no {' and no '.join(missing)} option")
        return {"sasl_plain_username": options["username"], "sasl_plain_password": options["password"]}
    if module.endswith(_KERBEROS_MODULE):
        return {}  # kafka-python's GSSAPI logs in with the process's Kerberos credentials, not with JAAS options
    raise ValueError(
        f"kafka option sasl.jaas.config: kafka-python cannot log in with {module}; it takes a username "
        "and password from PlainLoginModule or ScramLoginModule, or Kerberos credentials (GSSAPI)"
    )


def ensure_topic(
    bootstrap_servers: str,
    topic: str,
    kafka_options: dict[str, str],
    partitions: int = 1,
    topic_config: dict[str, str] | None = None,
) -> None:
    """Create the topic if it is missing. Where the client lacks the rights, the broker's
    auto-creation or an operator must make it: that is logged, not fatal."""
    config = client_config(kafka_options, KafkaAdminClient)
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **config)
    except (KafkaError, TypeError, ValueError) as exc:
        log.warning("cannot check the dead-letter topic", extra={"summary": {"topic": topic, "error": str(exc)}})
        return
    try:
        if topic not in admin.list_topics():
            admin.create_topics(
                [NewTopic(topic, num_partitions=partitions, replication_factor=-1, topic_configs=topic_config or {})]
            )
    except TopicAlreadyExistsError:
        pass
    except KafkaError as exc:
        log.warning("cannot create the dead-letter topic", extra={"summary": {"topic": topic, "error": str(exc)}})
    finally:
        admin.close()


def partitions_of(bootstrap_servers: str, topic: str, kafka_options: dict[str, str]) -> list[int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, **client_config(kafka_options, KafkaConsumer))
    try:
        partitions = consumer.partitions_for_topic(topic)
    finally:
        consumer.close()
    if not partitions:
        raise LookupError(f"topic {topic!r} has no partitions at {bootstrap_servers} (does it exist?)")
    return sorted(partitions)


def list_topics(bootstrap_servers: str, kafka_options: dict[str, str]) -> set[str]:
    """The topics the broker holds (its internal ones, such as __consumer_offsets, left out)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, **client_config(kafka_options, KafkaConsumer))
    try:
        return {topic for topic in consumer.topics() if not topic.startswith("__")}
    finally:
        consumer.close()


def offset_bounds(
    bootstrap_servers: str, topics: list[str], kafka_options: dict[str, str]
) -> dict[str, dict[int, tuple[int, int]]]:
    """Per topic and partition, the first offset the broker still holds and the next one it will write."""
    from kafka import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, **client_config(kafka_options, KafkaConsumer))
    try:
        partitions = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        first, end = consumer.beginning_offsets(partitions), consumer.end_offsets(partitions)
    finally:
        consumer.close()
    bounds: dict[str, dict[int, tuple[int, int]]] = {}
    for tp in partitions:
        bounds.setdefault(tp.topic, {})[tp.partition] = (first[tp], end[tp])
    return bounds
