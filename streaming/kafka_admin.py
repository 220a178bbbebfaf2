"""Kafka administration the service needs: making the dead-letter topic, listing partitions."""

from __future__ import annotations

import logging

from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

log = logging.getLogger("geoingest.kafka")


def client_config(kafka_options: dict[str, str]) -> dict[str, str]:
    """kafka-python spells Kafka's client options with underscores (sasl.mechanism -> sasl_mechanism)."""
    return {k.replace(".", "_"): v for k, v in kafka_options.items()}


def ensure_topic(bootstrap_servers: str, topic: str, kafka_options: dict[str, str], partitions: int = 1,
                 topic_config: dict[str, str] | None = None) -> None:
    """Create the topic if it is missing. Where the client lacks the rights, the broker's
    auto-creation or an operator must make it: that is logged, not fatal."""
    config = client_config(kafka_options)
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **config)
    except (KafkaError, TypeError, ValueError) as exc:
        log.warning("cannot check the dead-letter topic", extra={"summary": {"topic": topic, "error": str(exc)}})
        return
    try:
        if topic not in admin.list_topics():
            admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=-1,
                                          topic_configs=topic_config or {})])
    except TopicAlreadyExistsError:
        pass
    except KafkaError as exc:
        log.warning("cannot create the dead-letter topic", extra={"summary": {"topic": topic, "error": str(exc)}})
    finally:
        admin.close()


def partitions_of(bootstrap_servers: str, topic: str, kafka_options: dict[str, str]) -> list[int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, **client_config(kafka_options))
    try:
        partitions = consumer.partitions_for_topic(topic)
    finally:
        consumer.close()
    if not partitions:
        raise LookupError(f"topic {topic!r} has no partitions at {bootstrap_servers} (does it exist?)")
    return sorted(partitions)
