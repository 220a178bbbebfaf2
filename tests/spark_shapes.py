"""The Spark session a test module runs on, by shape: local (`local[2]`: the tasks run in the
driver's own JVM) or a standalone cluster on this machine (app/local/spark_cluster.py: executors are
JVMs of their own with Python workers of their own).

One process holds one SparkContext at a time: pyspark refuses a second, and getOrCreate() hands
back the running one whatever master it runs on. So a session is made when a module asks for its
shape, after the session of another shape is stopped; asking again for the shape that runs costs
nothing. A module keeps one shape for all its tests (a module-scoped session would be stopped
under it otherwise); the next module on another shape pays for a new SparkContext, and a new
cluster for the cluster shape. A session made elsewhere (spark_session called directly, as a
session-scoped fixture may) is never stopped for another shape: the test asking is skipped.

Fixtures:
- `spark` (module): the local session, as the service's tests have always used it.
- `spark_cluster` (module): a started LocalSparkCluster in a temporary folder; its session is
  stopped before the cluster is.
- `cluster_spark` (module): the session on `spark_cluster`.
- `spark_sessions` (session): stops the session made here that is left when the run ends.
`session_for(master, extra_conf)` gives the session of any other shape (a master and its own
configuration), for a module that needs more than these.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from app.local.spark_cluster import LocalSparkCluster
from app.spark import spark_session

LOCAL_MASTER = "local[2]"
DRIVER_MEMORY = "2g"

# Launch options of the driver's JVM: they stay true of it whatever session runs in it.
_LAUNCH_KEYS = frozenset(
    {
        "spark.driver.memory",
        "spark.driver.extraJavaOptions",
        "spark.driver.extraClassPath",
        "spark.driver.extraLibraryPath",
        "spark.submit.deployMode",
    }
)

_current: tuple[tuple, SparkSession] | None = None


def session_for(master: str, extra_conf: Mapping[str, str] | None = None) -> SparkSession:
    """The session on `master` with `extra_conf` (app/spark.py spark_session): the running one if
    it is that, else a new one, after stopping the session of another shape made here. The test
    is skipped when a session of another shape that was made elsewhere runs."""
    global _current
    key = (master, frozenset((extra_conf or {}).items()))
    context = SparkContext._active_spark_context
    if context is not None:
        made_here = _current is not None and _current[1].sparkContext is context
        if made_here and _current[0] == key:
            return _current[1]
        if made_here:
            stop_active()
        elif context.master != master or extra_conf:
            # Made elsewhere (spark_session called directly): whoever made it still holds it and
            # would find it stopped under them. A plain one on this master spark_session hands back.
            pytest.skip(
                f"a Spark session on {context.master} made outside tests/spark_shapes.py is active; "
                f"its holder would lose it if it were stopped for one on {master}"
            )
    session = spark_session(master, str(_cache_dir()), driver_memory=DRIVER_MEMORY, extra_conf=dict(extra_conf or {}))
    _current = (key, session)
    return session


def stop_active() -> None:
    """Stop the process's session, whatever its shape, so that another can start."""
    global _current
    session = SparkSession._instantiatedSession
    if session is not None:
        session.stop()
    context = SparkContext._active_spark_context
    if context is not None:
        context.stop()
    _current = None
    _forget_session_conf()


def _cache_dir() -> Path:
    # Imported when used: tests/conftest.py may import this module for its fixtures.
    from tests.conftest import CACHE_DIR

    return CACHE_DIR


def _forget_session_conf() -> None:
    # pyspark launched the driver's JVM with the first session's configuration as system
    # properties, and every SparkConf made in that JVM starts from them: without this, a
    # spark.executorEnv.* or spark.driver.host of the first shape would reach all later ones.
    jvm = SparkContext._jvm
    if jvm is None:
        return
    for key in list(jvm.System.getProperties().stringPropertyNames()):
        if key.startswith("spark.") and key not in _LAUNCH_KEYS:
            jvm.System.clearProperty(key)


@pytest.fixture(scope="session")
def spark_sessions() -> Iterator[None]:
    yield
    if _current is not None:
        stop_active()


@pytest.fixture(scope="module")
def spark(spark_sessions) -> SparkSession:
    return session_for(LOCAL_MASTER)


@pytest.fixture(scope="module")
def spark_cluster(spark_sessions, tmp_path_factory) -> Iterator[LocalSparkCluster]:
    cluster = LocalSparkCluster(tmp_path_factory.mktemp("spark-cluster"), _cache_dir())
    cluster.start()
    try:
        yield cluster
    finally:
        context = SparkContext._active_spark_context
        if context is not None and context.master == cluster.master_url:
            # A driver whose master went away keeps trying to reach it.
            stop_active()
        cluster.stop()


@pytest.fixture(scope="module")
def cluster_spark(spark_cluster: LocalSparkCluster) -> SparkSession:
    return session_for(spark_cluster.master_url)
