"""The local stack the demo, the tests and the benchmarks start, never the service: Kafka broker (broker.py), object store,
REST catalog, Spark standalone cluster, the lakehouse shape, the sample events and the demo (demo.py)."""
