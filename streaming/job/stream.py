"""Starting the streaming query: the Kafka source (Spark's, or the Python one) with the job's
options, the micro-batch processor behind foreachBatch, the checkpoint and the trigger."""

from __future__ import annotations

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
    writer = (
        kafka_stream(spark, processor.config, until_idle)
        .writeStream.foreachBatch(processor)
        .option("checkpointLocation", processor.config.checkpoint_location)
        .queryName(f"geoingest-{processor.contract.table}")
    )
    if until_idle and processor.config.source == "python":
        writer = writer.trigger(processingTime="0 seconds")  # until endingOffsets, then stopped by the service
    elif until_idle:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=trigger_interval)
    return writer.start()
