"""The local stack the demo, the tests and the benchmarks start, never the service: Kafka broker (broker.py), object store,
REST catalog, Spark cluster, schema registry, the lakehouse shape, the service image (image.py), a Kubernetes node, the demo."""
