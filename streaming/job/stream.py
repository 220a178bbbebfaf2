"""Starting the streaming query: the Kafka source (Spark's, or the Python one) with the job's
options, the micro-batch processor behind foreachBatch, the checkpoint and the trigger."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from streaming.job.config import (
    JobConfig,
    kafka_source_options,
    python_source_options,
)
from streaming.job.processor import BatchProcessor
from streaming.source.python_source import python_kafka_stream


def kafka_stream(spark: SparkSession, config: JobConfig, until_idle: bool = False) -> DataFrame:
    if config.source == "python":
        parallelism = config.parallelism or spark.sparkContext.defaultParallelism
        return python_kafka_stream(spark, python_source_options(config, parallelism, until_idle))
    options = kafka_source_options(
        config.bootstrap_servers,
        config.topic,
        config.parallelism or spark.sparkContext.defaultParallelism,
        config.kafka_options,
    )
    return (
        spark.readStream.format("kafka")
        .options(**options)
        .option("startingOffsets", config.starting_offsets)
        .option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
        .load()
    )


def start_query(
    spark: SparkSession, processor: BatchProcessor, until_idle: bool, trigger_interval: str = "10 seconds"
) -> StreamingQuery:
    return start_stream(spark, processor, processor.config, processor.contract.table, until_idle, trigger_interval)


def start_stream(
    spark: SparkSession,
    for_each_batch: Callable[[DataFrame, int], None],
    config: JobConfig,
    name: str,
    until_idle: bool,
    trigger_interval: str = "10 seconds",
) -> StreamingQuery:
    """The query reading `config.topic` into `for_each_batch` (a BatchProcessor, or a split topic's
    RecordSplitter), named geoingest-<name>."""
    writer = (
        kafka_stream(spark, config, until_idle)
        .writeStream.foreachBatch(for_each_batch)
        .option("checkpointLocation", config.checkpoint_location)
        .queryName(f"geoingest-{name}")
    )
    if until_idle and config.source == "python":
        writer = writer.trigger(processingTime="0 seconds")  # until endingOffsets, then stopped by the service
    elif until_idle:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=trigger_interval)
    return writer.start()
