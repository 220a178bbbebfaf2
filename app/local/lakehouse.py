"""The lakehouse shape on one machine, for `make demo-lakehouse` and the benchmark: an S3-compatible
object store (s3proxy), Iceberg's REST catalog server keeping its tables in a bucket there, a Spark
standalone cluster (master, worker, executor JVMs with their own Python workers) and the local
Kafka broker with a SASL_SSL listener (SCRAM-SHA-512 over TLS).

The service reaches them the way a deployment does, through its settings alone: the catalog's
properties (`type = rest`, `uri`, `warehouse = s3://...`, `s3.*`) are its only way to the bucket,
the Kafka options its only way to the broker, the master URL its only way to the executors.
Nothing is shared through the environment or a local folder but Spark's checkpoint, which is the
driver's own volume.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.local.broker import LocalBroker
from app.local.object_store import LocalObjectStore
from app.local.process import free_port
from app.local.rest_catalog import LocalRestCatalog
from app.local.spark_cluster import LocalSparkCluster
from app.settings import Settings

WAREHOUSE_BUCKET = "warehouse"


@dataclass
class Lakehouse:
    store: LocalObjectStore
    catalog: LocalRestCatalog
    cluster: LocalSparkCluster
    broker: LocalBroker

    @classmethod
    def in_folder(cls, home: Path, cache_dir: Path, cores: int = 2, executor_memory: str = "2g") -> Lakehouse:
        home = Path(home).absolute()
        store = LocalObjectStore(home / "object-store", cache_dir)
        catalog = LocalRestCatalog(
            home / "rest-catalog", cache_dir, f"s3://{WAREHOUSE_BUCKET}/lakehouse", store.io_properties()
        )
        cluster = LocalSparkCluster(home / "spark-cluster", cache_dir, cores=cores, memory=executor_memory)
        broker = LocalBroker(home / "broker", cache_dir, port=free_port(), secure_port=free_port())
        return cls(store, catalog, cluster, broker)

    def start(self, say: Callable[[str], None] = lambda message: None) -> None:
        """Start the four (their jars come from Maven Central on first use); a part that fails
        to start stops the ones started before it."""
        try:
            say(f"object store (s3proxy) at {self.store.endpoint}")
            self.store.start()
            self.store.create_bucket(WAREHOUSE_BUCKET)
            say(f"REST catalog at {self.catalog.uri}, warehouse {self.catalog.warehouse}")
            self.catalog.start()
            say("Spark standalone cluster (master and worker)")
            self.cluster.start()
            say(f"Kafka broker, SASL_SSL on {self.broker.secure_bootstrap}")
            self.broker.ensure_jars(progress=say)
            self.broker.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop all of them, each even when another one fails to stop."""
        errors = []
        for part in (self.broker, self.cluster, self.catalog, self.store):
            try:
                part.stop()
            except Exception as exc:  # noqa: BLE001 - the others must stop all the same
                errors.append(exc)
        if errors:
            raise errors[0]

    def settings_values(self) -> dict[str, Any]:
        """The settings that point the service at this lakehouse (what a deployment's config holds)."""
        return {
            "bootstrap_servers": self.broker.secure_bootstrap,
            "kafka": self.broker.client_options(),
            "catalog": self.catalog.catalog_properties(),
            "spark_master": self.cluster.master_url,
        }

    def settings(self, base: Settings) -> Settings:
        return dataclasses.replace(base, **self.settings_values())
