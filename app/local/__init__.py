"""The local stack the demo and the tests start: the broker, the object store, the catalog, Spark,
the service image and a single-node Kubernetes cluster, all on this machine."""
