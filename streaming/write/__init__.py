"""One input partition's pass and the batch's files: task.py (PartitionTask, MergeTask: decode, dead letters, Hilbert sort,
merge), data_files.py (GeoParquetWriter), dead_letter.py, upsert.py, schema evolution at ingest, freshness."""
