"""Jars from Maven Central, resolved once into the shared cache with Apache Ivy.

pyspark ships Ivy's standalone jar. Run on the project's Java with settings that name Maven
Central as the only repository, it resolves a list of coordinates with their dependencies and
copies the jars into `<cache>/jars/<name>/`, which later runs reuse without the network.

Why not Spark's own `spark.jars.packages`: it also asks repos.spark-packages.org, which prints an
error line per artifact where that host is unreachable, and it hands the resolved jars to the
Python workers as import paths, which pyspark 4.0 re-reads at every task (see app/spark_daemon.py).
"""

from __future__ import annotations

import fcntl
import glob
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from app.java import java_executable, trust_store_options

MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"

_SETTINGS = f"""<ivysettings>
  <settings defaultResolver="central"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" root="{MAVEN_CENTRAL}"/>
  </resolvers>
</ivysettings>
"""


class ResolveError(RuntimeError):
    """Maven coordinates could not be resolved."""


def resolve(
    coordinates: Sequence[str],
    cache_dir: Path,
    name: str,
    progress: Callable[[str], None] | None = None,
    exclude: Sequence[str] = (),
) -> list[Path]:
    """The jars of `coordinates` ("group:artifact:version") and their dependencies, downloaded
    once into <cache_dir>/jars/<name>/; returns their paths, sorted.

    "group:artifact:version:classifier" names one classified jar (such as a
    `jar-with-dependencies` bundle) and takes it alone, without the artifact's dependencies:
    the classified jars asked for by name are bundles that already hold them. `exclude` names
    dependencies ("group" or "group:artifact") left out wherever they are pulled: ones that are
    not on Maven Central and that the jars asked for do not need."""
    target = Path(cache_dir).resolve() / "jars" / name
    if any(target.glob("*.jar")):
        return sorted(target.glob("*.jar"))
    target.parent.mkdir(parents=True, exist_ok=True)
    # One resolution at a time per cache: Ivy's cache takes no lock of its own, and processes that
    # start on a fresh machine at once (a suite's workers, a build beside them) fetch the same jars.
    with open(target.parent / "resolve.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if any(target.glob("*.jar")):
            return sorted(target.glob("*.jar"))
        return _resolve(coordinates, cache_dir, name, target, progress, exclude)


def _resolve(
    coordinates: Sequence[str],
    cache_dir: Path,
    name: str,
    target: Path,
    progress: Callable[[str], None] | None,
    exclude: Sequence[str],
) -> list[Path]:
    report = progress or (lambda message: None)
    report(f"Downloading {', '.join(coordinates)} from Maven Central into {target} ...")
    # Retrieve into a staging dir and rename it into place, so an interrupted or concurrent
    # download never leaves a half-filled folder that later runs would trust.
    staging = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=target.parent))
    try:
        (staging / "ivysettings.xml").write_text(_SETTINGS)
        (staging / "ivy.xml").write_text(_ivy_module(name, coordinates, exclude))
        command = [
            str(java_executable(Path(cache_dir))),
            *trust_store_options(),
            "-jar",
            str(ivy_jar()),
            "-settings",
            str(staging / "ivysettings.xml"),
            "-ivy",
            str(staging / "ivy.xml"),
            "-confs",
            "default",
            "-retrieve",
            str(staging / "jars" / "[organisation]_[artifact]-[revision](-[classifier]).[ext]"),
            "-cache",
            str(Path(cache_dir).resolve() / "ivy-cache"),
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not any((staging / "jars").glob("*.jar")):
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
            raise ResolveError(
                f"Ivy could not resolve {', '.join(coordinates)} from Maven Central "
                f"(exit {result.returncode}): {shlex.join(command)}\n{tail}"
            )
        try:
            (staging / "jars").rename(target)
        except OSError:
            if not any(target.glob("*.jar")):  # not a concurrent download that won
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report(f"Ready: {target}")
    return sorted(target.glob("*.jar"))


def without_spark_jars(jars: Sequence[Path]) -> list[Path]:
    """The jars that Spark does not already ship (same artifact, any version): a second copy of
    a class on the classpath only shadows Spark's own."""
    shipped = {artifact_name(Path(p).name) for p in glob.glob(os.path.join(spark_home(), "jars", "*.jar"))}
    return [jar for jar in jars if artifact_name(jar.name.split("_", 1)[-1]) not in shipped]


def artifact_name(jar_name: str) -> str:
    """kafka-clients-3.9.0.jar -> kafka-clients (the version starts at the last '-<digit>')."""
    match = re.match(r"(.+?)-\d[^_]*\.jar$", jar_name)
    return match.group(1) if match else jar_name


def spark_home() -> str:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ResolveError("pyspark is not installed; its bundled Ivy jar resolves Maven artifacts")
    return spec.submodule_search_locations[0]


def ivy_jar() -> Path:
    jars = sorted(glob.glob(os.path.join(spark_home(), "jars", "ivy-*.jar")))
    if not jars:
        raise ResolveError(f"No ivy-*.jar in {spark_home()}/jars; it resolves Maven artifacts")
    return Path(jars[-1])


def _ivy_module(name: str, coordinates: Sequence[str], exclude: Sequence[str] = ()) -> str:
    lines = []
    for coordinate in coordinates:
        parts = coordinate.split(":")
        if len(parts) not in (3, 4) or not all(parts):
            raise ResolveError(f"{coordinate!r}: expected group:artifact:version or group:artifact:version:classifier")
        org, artifact, revision = parts[:3]
        if len(parts) == 3:
            lines.append(f'    <dependency org="{org}" name="{artifact}" rev="{revision}" conf="default->default"/>')
        else:
            lines.append(
                f'    <dependency org="{org}" name="{artifact}" rev="{revision}" conf="default->default" '
                f'transitive="false">\n'
                f'      <artifact name="{artifact}" type="jar" ext="jar" m:classifier="{parts[3]}"/>\n'
                f"    </dependency>"
            )
    for excluded in exclude:
        org, _, module = excluded.partition(":")
        lines.append(f'    <exclude org="{org}"' + (f' module="{module}"' if module else "") + "/>")
    body = "\n".join(lines)
    return f"""<ivy-module version="2.0" xmlns:m="http://ant.apache.org/ivy/maven">
  <info organisation="geoingest" module="{name}"/>
  <dependencies>
{body}
  </dependencies>
</ivy-module>
"""


# Iceberg Java for native-geometry tables (streaming/table/native.py). The runtime jar for Spark 4.1
# holds Iceberg 1.12's core, Parquet (shaded) and JDBC catalog in one jar, and there is none for
# Spark 4.0 of 1.12; only its `org.apache.iceberg` classes are used, never its Spark ones.
ICEBERG_JAVA = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"
SQLITE_JDBC = "org.xerial:sqlite-jdbc:3.50.3.0"
# The AWS SDK, shaded, for Iceberg's S3FileIO (an s3:// warehouse).
ICEBERG_AWS_BUNDLE = "org.apache.iceberg:iceberg-aws-bundle:1.12.0"


def iceberg_java_classpath(cache_dir: Path) -> list[Path]:
    """Iceberg Java's jars, the AWS SDK for its S3FileIO and SQLite's JDBC driver (resolved from Maven
    Central once), then Spark's own jars (Hadoop's file systems for the warehouse, py4j to reach the JVM)."""
    jars = resolve([ICEBERG_JAVA], cache_dir, "iceberg-java-1.12.0")
    jars += resolve([ICEBERG_AWS_BUNDLE], cache_dir, "iceberg-aws-bundle-1.12.0")
    jars += [j for j in resolve([SQLITE_JDBC], cache_dir, "sqlite-jdbc-3.50.3.0") if "sqlite-jdbc" in j.name]
    return [*jars, *sorted(Path(spark_home(), "jars").glob("*.jar"))]


def configure_iceberg_java(cache_dir: Path) -> None:
    """Native-geometry tables met by this process start Iceberg Java with these jars and java."""
    from streaming.table import native

    native.configure(lambda: (iceberg_java_classpath(cache_dir), java_executable(cache_dir)))
