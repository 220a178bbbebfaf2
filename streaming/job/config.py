"""The job's settings as the streaming query takes them, and the options it gives the Kafka source:
Spark's Kafka source, or the Python one (streaming/source/python_source.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from streaming.decode.decoder import DecodeOptions
from streaming.write.dead_letter import DeadLetterConfig

CLUSTERING_MODES = ("batch", "task", "shuffle")


# Where the records come from: Spark's Kafka source (a JVM consumer, rows converted to Arrow for
# the Python tasks), or the Python one, whose tasks read their offset ranges with librdkafka.
SOURCES = ("spark-kafka", "python")


@dataclass(frozen=True)
class JobConfig:
    bootstrap_servers: str
    topic: str
    checkpoint_location: str
    writer_id: str
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int = 1_000_000
    # batch, task: the rows a task sorts at once (its memory bound), and of one merge range;
    # shuffle: the rows of one range partition.
    rows_per_partition: int = 1_000_000
    clustering: str = "batch"
    # batch: a batch of at most this many valid rows is merged by its last task, on as many
    # threads as the batch had tasks, not by a merge job (0: always a merge job). Measured in
    # bench/ingest.py at 400k events per batch on 2 cores: a merge job took 0.5-0.9 s, the last
    # task's merge on two threads 0.2-0.35 s. Above it a merge job spreads over the executors.
    merge_in_task_max_rows: int = 1_000_000
    # Tasks a batch runs in (0: Spark's default parallelism, the cores).
    parallelism: int = 0
    kafka_options: dict[str, str] = field(default_factory=dict)
    decode: DecodeOptions = field(default_factory=DecodeOptions)
    dead_letter: DeadLetterConfig | None = None  # None: rejects are counted, not sent
    # An Iceberg table (namespace.name) the rejects are written to as well, committed with their
    # batch (streaming/write/rejects_table.py); "": none.
    rejects_table: str = ""
    # Test hook: after a committed batch, write this file and hold, so a test can kill the
    # process between the Iceberg commit and Spark's checkpoint commit.
    hold_after_commit_file: str = ""
    # spark-kafka: Spark's Kafka source; python: streaming/source/python_source.py, whose tasks read their
    # offset ranges themselves (see SOURCES).
    source: str = "spark-kafka"


def python_source_options(config: JobConfig, parallelism: int, until_idle: bool) -> dict[str, str]:
    """The Python source's options: Spark's source's, offset ranges only (the tasks read them), and
    with until_idle the offsets at the start as the end (Spark runs no Trigger.AvailableNow for a
    Python source; the service stops the query once it has caught up, see caught_up)."""
    options = {
        **kafka_source_options(config.bootstrap_servers, config.topic, parallelism, config.kafka_options),
        "startingOffsets": config.starting_offsets,
        "maxOffsetsPerTrigger": str(config.max_offsets_per_trigger),
        "rangesOnly": "true",
    }
    if until_idle:
        options["endingOffsets"] = "latest"
    return options


def kafka_source_options(
    bootstrap_servers: str, topic: str, parallelism: int, kafka_options: dict[str, str] | None = None
) -> dict[str, str]:
    """Spark's Kafka source options for reading `topic` as the job does (the benchmark's stacks
    read it the same way); `kafka_options` (consumer settings) override FAST_FETCH."""
    options = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "subscribe": topic,
        "includeHeaders": "true",
        "failOnDataLoss": "true",
        # A topic with fewer partitions than cores still keeps every core busy.
        "minPartitions": str(parallelism),
    }
    # Bigger fetches than the Kafka client's defaults: measured by bench (`kafka read`), reading
    # small events went from 135k to 222k records/s on 2 cores. Settings override them.
    options.update({f"kafka.{key}": value for key, value in {**FAST_FETCH, **(kafka_options or {})}.items()})
    return options


FAST_FETCH = {
    "max.partition.fetch.bytes": str(16 * 1024 * 1024),
    "fetch.max.bytes": str(64 * 1024 * 1024),
    "max.poll.records": "20000",
    # A fetch that reaches the end of a partition (the whole of it fits in one) leaves the consumer
    # with a fetch in flight that the broker holds until fetch.max.wait.ms (500 ms) for new data;
    # the next batch's read on that pooled consumer waited for it, measured at 0.5-0.6 s in one
    # batch in five at 40k events per batch. Spark polls only for offsets that exist, so a short
    # wait costs nothing.
    "fetch.max.wait.ms": "10",
}
