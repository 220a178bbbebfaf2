# syntax=docker/dockerfile:1.7
#
# The geoingest service image: `geoingest run` as a non-root user on a read-only root filesystem.
#
#   docker build -t geoingest:dev .
#   docker run --read-only --tmpfs /tmp --tmpfs /scratch:mode=1777 -v geoingest-data:/data \
#     -e GEOINGEST_BOOTSTRAP_SERVERS=kafka:9092 \
#     -e GEOINGEST_CATALOG__URI=sqlite:////data/catalog.db -e GEOINGEST_CATALOG__WAREHOUSE=file:///data/warehouse \
#     geoingest:dev
#
# (mode=1777 is Docker's default for a tmpfs; podman mounts one root-owned 0755 unless told, which
# the service's user cannot write.) The default command ingests the demo contract's table (schemas/demo_events.json), creating it
# first when the catalog does not have it. Without a Docker engine, `make image` builds this file
# with podman (docs/deploying.md).
#
# Everything the service needs at run time is in the image: the Python environment, Spark's Kafka
# connector (resolved at build time, on Spark's own classpath), a Java 17 runtime. Nothing is
# downloaded when the container starts. Writable paths, all meant to be volumes:
#   /scratch  HOME, the Spark local dir (shuffle, spills) and the working directory
#   /tmp      JVM and Python temporary files
#   /data     the default checkpoint location (/data/checkpoints)
#
# Bookworm, not trixie: Debian 13 no longer ships openjdk-17.

############################################################################################
# builder: the project and its dependencies in a venv, plus the Kafka connector's jars
############################################################################################
FROM python:3.11.14-slim-bookworm AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

RUN python -m venv /opt/geoingest/venv
ENV PATH=/opt/geoingest/venv/bin:$PATH

WORKDIR /src

# Dependencies first, in their own layer: the service's lock file (`make lock` compiles it from
# pyproject.toml's ranges), the versions the tests passed with, every file checked against its hash.
COPY pyproject.toml README.md ./
COPY requirements/service.txt ./requirements/service.txt
RUN pip install --require-hashes --requirement requirements/service.txt

# The project itself, non-editable (its dependencies are already there).
COPY app ./app
COPY streaming ./streaming
RUN pip install --no-deps . && pip check

# Spark's Kafka connector, resolved once here from Maven Central with the service's own code, so
# the artifact is `kafka_connector_package()`: spark-sql-kafka at exactly the installed
# pyspark.__version__. Its jars, minus the ones Spark already ships, go onto Spark's classpath
# (pyspark/jars), so that neither the driver nor Spark-on-Kubernetes executors need the network
# at run time: the service finds the connector there and resolves nothing.
ENV GEOINGEST_CACHE_DIR=/opt/geoingest/cache
RUN <<'EOF' python -
import shutil
from pathlib import Path

import pyspark
from app.spark import kafka_connector_jars, kafka_connector_package

cache = Path("/opt/geoingest/cache")
package = kafka_connector_package()
assert package.endswith(":" + pyspark.__version__), (package, pyspark.__version__)
spark_jars = Path(pyspark.__file__).parent / "jars"
jars = kafka_connector_jars(cache)
names = [jar.name.split("_", 1)[1] for jar in jars]  # resolved as <organisation>_<file>
connector = f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar"
assert connector in names, f"{package} did not resolve to {connector}: {names}"
for jar, name in zip(jars, names):
    shutil.copy2(jar, spark_jars / name)
    print(f"kafka connector: {name} -> {spark_jars}")
assert kafka_connector_jars(cache) == [], "the connector is on Spark's classpath now"
# The downloads are not needed any more; java-home (app/java.py's launcher) stays.
for folder in ("jars", "ivy-cache"):
    shutil.rmtree(cache / folder)
EOF

# Spark-on-Kubernetes executors run this image with this command (see the chart's executor pod
# template); it does what Spark's own image entrypoint does for `executor`.
RUN <<'EOF' bash
set -euo pipefail
mkdir -p /opt/geoingest/bin
cat > /opt/geoingest/bin/spark-executor <<'SCRIPT'
#!/bin/bash
# Spark-on-Kubernetes executor: Spark sets the SPARK_* variables on the pod and appends the
# argument "executor".
set -euo pipefail
[ "${1:-}" = executor ] && shift
mapfile -t java_opts < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
classpath="${SPARK_CLASSPATH:+${SPARK_CLASSPATH}:}${SPARK_HOME}/jars/*"
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then classpath="${classpath}:${SPARK_EXTRA_CLASSPATH}"; fi
# The executors' Spark configuration files (log4j2.properties, ...), mounted by Spark.
if [ -n "${SPARK_CONF_DIR:-}" ]; then classpath="${SPARK_CONF_DIR}:${classpath}"; fi
exec "${JAVA_HOME}/bin/java" "${java_opts[@]}" \
  -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
  -cp "${classpath}" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "${SPARK_DRIVER_URL}" \
  --executor-id "${SPARK_EXECUTOR_ID}" \
  --cores "${SPARK_EXECUTOR_CORES}" \
  --app-id "${SPARK_APPLICATION_ID}" \
  --hostname "${SPARK_EXECUTOR_POD_IP}" \
  --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
  --podName "${SPARK_EXECUTOR_POD_NAME}" \
  "$@"
SCRIPT
chmod 0755 /opt/geoingest/bin/spark-executor
bash -n /opt/geoingest/bin/spark-executor
EOF

############################################################################################
# runtime
############################################################################################
FROM python:3.11.14-slim-bookworm AS runtime

# A Java 17 runtime from Debian (ca-certificates-java comes with it: the JVM trust store at
# /etc/ssl/certs/java/cacerts). /usr/lib/jvm/java-17 names it on any architecture.
# The slim image has no man pages folder, which the JRE's postinst needs for its alternatives.
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless; \
    rm -rf /var/lib/apt/lists/*; \
    ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17; \
    /usr/lib/jvm/java-17/bin/java -version; \
    groupadd --system --gid 10001 geoingest; \
    useradd --system --uid 10001 --gid 10001 --home-dir /scratch --no-create-home \
        --shell /usr/sbin/nologin geoingest; \
    mkdir -p /scratch /data; \
    chown 10001:10001 /scratch /data

COPY --from=builder /opt/geoingest /opt/geoingest
COPY schemas /opt/geoingest/schemas

# JAVA_HOME: Debian's Java 17, which the executor launcher uses. GEOINGEST_JAVA_HOME is the
# same runtime for the driver (app/java.py), so driver and executors run one Java.
# Environment beats the settings file: only settings tied to this image's layout are set here
# (a chart sets checkpoint_location and the like again, in the environment).
ENV PATH=/opt/geoingest/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/geoingest/venv \
    SPARK_HOME=/opt/geoingest/venv/lib/python3.11/site-packages/pyspark \
    JAVA_HOME=/usr/lib/jvm/java-17 \
    GEOINGEST_JAVA_HOME=/usr/lib/jvm/java-17 \
    HOME=/scratch \
    TMPDIR=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GEOINGEST_CACHE_DIR=/opt/geoingest/cache \
    GEOINGEST_CHECKPOINT_LOCATION=/data/checkpoints \
    GEOINGEST_SPARK__SPARK_LOCAL_DIR=/scratch/spark-local

USER 10001:10001
WORKDIR /scratch

# /metrics, /healthz, /readyz
EXPOSE 9108
# Spark driver RPC and block manager, used in Spark-on-Kubernetes mode only
EXPOSE 7078 7079

HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GEOINGEST_METRICS_PORT', '9108'), timeout=4)"

ENTRYPOINT ["geoingest", "run"]
CMD ["--contract", "/opt/geoingest/schemas/demo_events.json", "--create-table"]
