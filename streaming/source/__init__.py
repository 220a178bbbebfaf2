"""Reading Kafka: the Python Kafka source for Spark (python_source.py: KafkaDataSource) and its task-side reader
(read.py: read_range), their options (options.py), the Java client settings both read (java_settings.py), admin (admin.py)."""
