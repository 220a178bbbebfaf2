"""A local S3-compatible object store for dev work, the tests and the demo.

It is S3Proxy (https://github.com/gaul/s3proxy) run from its `jar-with-dependencies` on Maven
Central, on the project's Java runtime (app/java.py), with its `filesystem` backend: buckets are
folders under `data_dir` and objects are files in them, so the data survives a stop and a start
of the same home. (S3Proxy 4 dropped jclouds; `filesystem` is now its own NIO.2 store, which the
older name `filesystem-nio2` also selects. Its `transient` store keeps nothing after a stop.)
It listens on one loopback port, kept in the home's `s3proxy.conf` so that a stopped store
comes back at the same endpoint, and it checks AWS signatures (V2 and V4) against one key pair.

Request counts come from S3Proxy's own request log: S3ProxyHandler logs every request it
receives at DEBUG as `request: <the servlet request>`, whose text holds the method and the URL,
before it authenticates or answers it. The logback configuration written here sends that logger
to `requests.log`, started afresh by every start of the JVM, and `request_counts` counts its
lines. The readiness probe asks `/healthz`, which S3Proxy answers before it logs a request, so
it is not counted. The log line is written before a response leaves,
so a client that has its answer finds its request counted. (S3Proxy's Prometheus endpoint,
`s3proxy.metrics.*`, counts by S3 operation too, but it records a request after its response may
already have reached the client, and leaves out the ones refused before their operation is known.)
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from app.java import java_executable, trust_store_options
from app.local.process import (
    HOST,
    DetachedProcess,
    LocalProcessError,
    free_port,
    get_json,
    port_is_free,
)
from app.maven import ResolveError, resolve

DEFAULT_S3PROXY_VERSION = "4.1.0"
DEFAULT_ACCESS_KEY = "geoingest"
# A fixed key for a store that only ever listens on loopback; nothing secret rests behind it.
DEFAULT_SECRET_KEY = "geoingest-local-secret"
DEFAULT_REGION = "us-east-1"

REQUEST_KINDS = ("PUT", "GET", "HEAD", "LIST", "DELETE", "POST")

_REQUEST_LOGGER = "org.gaul.s3proxy.S3ProxyHandler"
_REQUEST_PREFIX = "request: "
# Jetty's text for a request ends in "{<METHOD>@<hash> <URL> HTTP/<version>}".
_REQUEST_LINE = re.compile(r"\{([A-Z]+)@[0-9a-f]+ (\S+) HTTP/[0-9.]+\}")
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class ObjectStoreError(RuntimeError):
    """The local object store could not be set up, started, stopped or asked."""


class LocalObjectStore:
    def __init__(
        self,
        home: Path,
        cache_dir: Path,
        port: int | None = None,
        access_key: str = DEFAULT_ACCESS_KEY,
        secret_key: str = DEFAULT_SECRET_KEY,
        region: str = DEFAULT_REGION,
        version: str = DEFAULT_S3PROXY_VERSION,
        host: str = HOST,
    ) -> None:
        self.home = Path(home).resolve()
        # Loopback, or an address of a bridge the caller made (app/local/kubernetes.py's pods).
        self.host = host
        self.cache_dir = Path(cache_dir).resolve()
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self.version = version
        self.config_file = self.home / "s3proxy.conf"
        self.logback_file = self.home / "logback.xml"
        self.log_file = self.home / "s3proxy.log"
        self.request_log_file = self.home / "requests.log"
        self.port = port or self._persisted_port() or free_port()
        # The config path is in the JVM's command line and names this home alone.
        self._process = DetachedProcess(self.home, "s3proxy", str(self.config_file), logs=(self.log_file,))

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    def file_of(self, uri: str) -> Path:
        """The file behind an object's `s3://bucket/key`: its buckets are folders of data_dir."""
        return self.data_dir / uri.removeprefix("s3://")

    # -- jars ---------------------------------------------------------------------------------

    def ensure_jars(self, progress: Callable[[str], None] | None = None) -> list[Path]:
        """Download S3Proxy's self-contained jar once into the shared cache."""
        coordinate = f"org.gaul:s3proxy:{self.version}:jar-with-dependencies"
        try:
            return resolve([coordinate], self.cache_dir, f"s3proxy-{self.version}", progress=progress)
        except ResolveError as exc:
            raise ObjectStoreError(str(exc)) from exc

    # -- lifecycle ----------------------------------------------------------------------------

    def running(self) -> bool:
        return self._process.pid() is not None

    def start(self, timeout: float = 60.0) -> None:
        """Start the store detached (unless it runs already) and wait until it answers S3."""
        if self.running():
            persisted = self._persisted_port()
            if persisted != self.port:
                raise ObjectStoreError(
                    f"The object store in {self.home} already runs on port {persisted}, "
                    f"not on the port {self.port} asked for"
                )
            self._wait_until_ready(timeout)
            return
        jars = self.ensure_jars()
        if not port_is_free(self.port):
            raise ObjectStoreError(
                f"Cannot start the object store in {self.home}: port {HOST}:{self.port} is already in use"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_configs()
        self.request_log_file.unlink(missing_ok=True)  # the last run's requests are not this one's
        command = [
            str(java_executable(self.cache_dir)),
            *trust_store_options(),
            "-Xmx1g",
            "-Djava.awt.headless=true",
            f"-Dlogback.configurationFile={self.logback_file}",
            "-jar",
            str(jars[0]),
            "--properties",
            str(self.config_file),
        ]
        self._start_process(command, timeout)

    def stop(self) -> None:
        """Stop the store (a clean shutdown; a paused store is thawed to let it shut down)."""
        try:
            self._process.stop()
        except LocalProcessError as exc:
            raise ObjectStoreError(str(exc)) from exc

    def pause(self) -> None:
        """Freeze the JVM: connections are accepted by the kernel but never answered."""
        try:
            self._process.pause()
        except LocalProcessError as exc:
            raise ObjectStoreError(f"Cannot pause the object store: {exc}") from exc

    def resume(self) -> None:
        try:
            self._process.resume()
        except LocalProcessError as exc:
            raise ObjectStoreError(f"Cannot resume the object store: {exc}") from exc

    # -- use ----------------------------------------------------------------------------------

    def io_properties(self) -> dict[str, str]:
        """pyiceberg FileIO (and Iceberg S3FileIO) properties that reach this store."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": self.access_key,
            "s3.secret-access-key": self.secret_key,
            "s3.region": self.region,
            "s3.path-style-access": "true",
        }

    def create_bucket(self, name: str) -> None:
        """Create bucket `name` unless it exists."""
        if not _BUCKET_NAME.fullmatch(name) or ".." in name:
            raise ObjectStoreError(
                f"Bucket name {name!r}: expected 3-63 lowercase letters, digits, '.' or '-', "
                "starting and ending with a letter or digit"
            )
        from pyarrow import fs as pafs  # imported here: only bucket creation needs it

        filesystem = pafs.S3FileSystem(
            endpoint_override=self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
            scheme="http",
            allow_bucket_creation=True,
            connect_timeout=5,
            request_timeout=30,
        )
        try:
            filesystem.create_dir(name)
            created = filesystem.get_file_info(name).type == pafs.FileType.Directory
        except OSError as exc:
            raise ObjectStoreError(
                f"Cannot create bucket {name!r} at {self.endpoint} (access key {self.access_key!r}): {exc}"
            ) from exc
        if not created:
            raise ObjectStoreError(
                f"Bucket {name!r} is missing at {self.endpoint} after its creation; {self._process.log_tail()}"
            )

    def request_counts(self) -> dict[str, int]:
        """The requests the store received since it started, by kind: PUT, GET (of an object),
        HEAD, LIST (a GET of a bucket or of the bucket list), DELETE, POST (multipart uploads,
        multi-object deletes), and any other method by its name."""
        if not self.request_log_file.exists():
            raise ObjectStoreError(
                f"No request log {self.request_log_file}: the object store in {self.home} has not been started"
            )
        text = self.request_log_file.read_bytes().decode(errors="replace")
        counts: Counter[str] = Counter({kind: 0 for kind in REQUEST_KINDS})
        for line in text.splitlines():
            if not line.startswith(_REQUEST_PREFIX):
                continue  # the same logger's other messages
            match = _REQUEST_LINE.search(line)
            if match is None:
                raise ObjectStoreError(
                    f"Cannot read the request line {line!r} in {self.request_log_file}: "
                    f"S3Proxy {self.version} logs requests in a form this module does not know"
                )
            counts[_kind(*match.groups())] += 1
        return dict(counts)

    # -- helpers ------------------------------------------------------------------------------

    def _start_process(self, command: list[str], timeout: float) -> None:
        try:
            self._process.start(command, self._answers_s3, timeout)
        except LocalProcessError as exc:
            raise ObjectStoreError(
                f"The object store at {self.endpoint} (home {self.home}) did not start: {exc}"
            ) from exc

    def _wait_until_ready(self, timeout: float) -> None:
        try:
            self._process.wait_while_running(self._answers_s3, timeout)
        except LocalProcessError as exc:
            raise ObjectStoreError(
                f"The object store at {self.endpoint} (home {self.home}) does not answer: {exc}"
            ) from exc

    def _answers_s3(self) -> bool:
        # S3Proxy's handler answers /healthz itself, once its backend is open, before it logs a
        # request: the probe proves the S3 handler serves and is not counted as a request.
        health = get_json(self.port, "/healthz", host=self.host)
        return isinstance(health, dict) and health.get("status") == "OK"

    def _persisted_port(self) -> int | None:
        if not self.config_file.exists():
            return None
        for line in self.config_file.read_text().splitlines():
            if line.startswith("s3proxy.endpoint="):
                return int(line.rsplit(":", 1)[1])
        return None

    def _write_configs(self) -> None:
        settings = {
            "s3proxy.endpoint": self.endpoint,
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.access_key,
            "s3proxy.credential": self.secret_key,
            # S3Proxy 4 still reads its backend from the jclouds.* names of its earlier releases.
            "jclouds.provider": "filesystem",
            "jclouds.filesystem.basedir": str(self.data_dir),
        }
        header = "# Written by app/local/object_store.py on every start; edit LocalObjectStore instead.\n"
        self.config_file.write_text(header + "".join(f"{k}={v}\n" for k, v in settings.items()))
        self.logback_file.write_text(f"""<configuration>
  <!-- Written by app/local/object_store.py on every start. -->
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{self.log_file}</file>
    <encoder><pattern>%d{{yyyy-MM-dd HH:mm:ss.SSS}} %-5p %c{{30}} %m%n</pattern></encoder>
    <filter class="ch.qos.logback.classic.filter.ThresholdFilter"><level>INFO</level></filter>
  </appender>
  <!-- request_counts reads this one: a fresh file per start, one line per request. -->
  <appender name="REQUESTS" class="ch.qos.logback.core.FileAppender">
    <file>{self.request_log_file}</file>
    <append>false</append>
    <encoder><pattern>%m%n</pattern></encoder>
  </appender>
  <logger name="{_REQUEST_LOGGER}" level="DEBUG">
    <appender-ref ref="REQUESTS"/>
  </logger>
  <root level="INFO">
    <appender-ref ref="FILE"/>
  </root>
</configuration>
""")


def _kind(method: str, url: str) -> str:
    if method != "GET":
        return method
    key = urlsplit(url).path.lstrip("/").partition("/")[2]
    return "GET" if key else "LIST"
