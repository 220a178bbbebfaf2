"""pyspark's Python worker daemon, started without pyspark's bundled archives on sys.path.

Spark puts pyspark.zip, py4j's zip and the spark-core jar (5,000 entries) on the workers' path,
and pyspark 4.0's worker calls importlib.invalidate_caches() before every task, which since
Python 3.10 re-reads the directory of every zip on the path: measured here, 0.13-0.28 s of CPU
per task, whatever the task does (SPARK-54744, fixed after 4.0). The same pyspark is installed as
a package, so the daemon imports it from there and the archives are never opened.

It also imports the modules every task of the service runs before it forks the workers: each
worker starts with them in memory instead of importing them itself (0.8 s of CPU per worker,
measured), in the first micro-batch after a start.

Spark starts it as `spark.python.daemon.module` (app/spark.py).
"""

import importlib.util
import os
import sys


def _drop_bundled_archives() -> None:
    bundled = [p for p in sys.path if p.endswith((".zip", ".jar")) and f"{os.sep}pyspark{os.sep}" in p]
    kept = [p for p in sys.path if p not in bundled]
    saved = sys.path[:]
    sys.path[:] = kept
    if importlib.util.find_spec("pyspark") is None:  # a Spark install without the pyspark package
        sys.path[:] = saved
        return
    # invalidate_caches() walks the importer cache, not sys.path: forget the archives there too.
    for path in list(sys.path_importer_cache):
        if any(path == archive or path.startswith(archive + os.sep) for archive in bundled):
            del sys.path_importer_cache[path]


# Nothing here starts a thread at import (librdkafka's start with a client, pyarrow's pool with its
# first use), so the forked workers inherit no thread that is not theirs.
_PRELOADED = ("streaming.write.task", "streaming.source.read", "streaming.write.evolution")


def _preload() -> None:
    for name in _PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:  # a Spark job that is not the service's (this daemon serves every job)
            return


if __name__ == "__main__":
    _drop_bundled_archives()
    _preload()
    from pyspark import daemon

    daemon.manager()
