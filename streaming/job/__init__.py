"""The streaming query that ties the stages: processor.py (BatchProcessor: one micro-batch, decode to commit),
stream.py (start_query, the Kafka source options), checkpoint.py (the checkpoint and the writer id kept beside it),
routes.py (which table each topic, or each record of a shared topic, lands in), split.py (a shared
topic's micro-batch: its records to their tables' processors)."""
