"""A local Iceberg REST catalog server for dev work, the tests and the demo.

It is Iceberg's reference REST server, the one behind the `apache/iceberg-rest-fixture` image that
pyiceberg's own integration tests run: `RESTCatalogServlet` over `RESTCatalogAdapter` (both in
`iceberg-core`'s tests jar) over a `JdbcCatalog` on SQLite, served by Jetty 12.1 with gzip
compression. Its jars come from Maven Central (app/maven.py) and it runs on the project's Java
(app/java.py).

Why not the image's main class, `org.apache.iceberg.rest.RESTCatalogServer` (in
`iceberg-open-api`'s test-fixtures jar): it binds Jetty to every interface, with no setting to
narrow it, and this server must listen on loopback alone. So Jetty's own XML launcher
(`org.eclipse.jetty.xml.XmlConfiguration`) assembles the same objects the way that class does,
with the connector on 127.0.0.1, from `<home>/rest-catalog.xml`. The one piece of that class left
out is its `include-credentials` option (handing the server's S3 keys to clients), which this
module never sets: clients get their keys from `catalog_properties()`.

What the server reads: the catalog properties written into that XML file on every start, and
nothing else. Its environment is built from scratch (no AWS_* or CATALOG_* variable reaches it),
the AWS SDK's profile files point into the home, where there are none, and the EC2 metadata
service is off, so its S3 client uses exactly these properties:

- `catalog-impl` = org.apache.iceberg.jdbc.JdbcCatalog, `uri` = jdbc:sqlite:<home>/catalog.db,
  `jdbc.schema-version` = V1 (views too), `jdbc.strict-mode` = true (as the image sets them);
- `warehouse` = the warehouse given (`s3://bucket/prefix` or `file:///abs/path`);
- for an `s3://` warehouse: `io-impl` = org.apache.iceberg.aws.s3.S3FileIO and, from the
  pyiceberg-style `io_properties`, `s3.endpoint`, `s3.access-key-id`, `s3.secret-access-key`,
  `s3.session-token`, `s3.path-style-access` under the same names, and `s3.region` as
  `client.region` (Iceberg's Java name for it). Other `io_properties` are for clients alone.
- for a `file://` warehouse: Iceberg's default HadoopFileIO on the local file system.

The catalog's state is the SQLite file in the home, and the port is kept in the XML file, so a
stopped server comes back at the same uri with the same tables.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from xml.etree import ElementTree
from xml.sax.saxutils import escape

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

ICEBERG_VERSION = "1.11.0"
# What Iceberg 1.11.0's own build pins (gradle/libs.versions.toml) for the fixture's dependencies.
# 1.11.0 is the newest release whose iceberg-core tests jar is on Maven Central (1.12.0 has none).
_JETTY_VERSION = "12.1.8"
_HADOOP_VERSION = "3.4.3"
_AWS_SDK_VERSION = "2.44.4"
_SQLITE_JDBC_VERSION = "3.53.0.0"
_SLF4J_VERSION = "2.0.17"

_SERVER_COORDINATES = (
    f"org.apache.iceberg:iceberg-aws:{ICEBERG_VERSION}",  # brings iceberg-core, -api, -common
    # Iceberg's catalogs and HadoopFileIO take a Hadoop Configuration; the shaded client carries
    # Hadoop's own dependencies relocated, where hadoop-common would drag in hundreds of jars.
    f"org.apache.hadoop:hadoop-client-api:{_HADOOP_VERSION}",
    f"org.apache.hadoop:hadoop-client-runtime:{_HADOOP_VERSION}",
    f"org.eclipse.jetty.ee10:jetty-ee10-servlet:{_JETTY_VERSION}",
    f"org.eclipse.jetty.compression:jetty-compression-server:{_JETTY_VERSION}",
    f"org.eclipse.jetty.compression:jetty-compression-gzip:{_JETTY_VERSION}",
    f"org.eclipse.jetty:jetty-xml:{_JETTY_VERSION}",
    f"org.xerial:sqlite-jdbc:{_SQLITE_JDBC_VERSION}",
    f"org.slf4j:slf4j-simple:{_SLF4J_VERSION}",
    # iceberg-aws declares no AWS SDK dependency. S3FileIO needs s3; Iceberg's AwsProperties
    # names KMS and STS model classes in its static initializer, so those two must be there as
    # well (glue and dynamodb need not). s3's pom brings its HTTP clients (apache-client, the
    # default Iceberg uses, and netty-nio-client, which stays unused).
    f"software.amazon.awssdk:s3:{_AWS_SDK_VERSION}",
    f"software.amazon.awssdk:kms:{_AWS_SDK_VERSION}",
    f"software.amazon.awssdk:sts:{_AWS_SDK_VERSION}",
)
# A classified jar resolves alone, and beside the plain artifact of the same module in one
# resolution Ivy keeps only one of the two, so the tests jar has a folder of its own.
_SERVLET_COORDINATES = (f"org.apache.iceberg:iceberg-core:{ICEBERG_VERSION}:tests",)

_LAUNCHER_CLASS = "org.eclipse.jetty.xml.XmlConfiguration"
_S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
# pyiceberg's name -> Iceberg Java's name, for what the server's S3FileIO must share with clients.
_S3_PROPERTIES = {
    "s3.endpoint": "s3.endpoint",
    "s3.access-key-id": "s3.access-key-id",
    "s3.secret-access-key": "s3.secret-access-key",
    "s3.session-token": "s3.session-token",
    "s3.path-style-access": "s3.path-style-access",
    "s3.region": "client.region",
}
_REQUIRED_S3_PROPERTIES = ("s3.region", "s3.access-key-id", "s3.secret-access-key")
# Variables passed through from the caller: what a JVM needs to run at all.
_PASSED_THROUGH = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


class RestCatalogError(RuntimeError):
    """The local REST catalog server could not be set up, started, stopped or reached."""


class LocalRestCatalog:
    def __init__(
        self,
        home: Path,
        cache_dir: Path,
        warehouse: str,
        io_properties: dict[str, str] | None = None,
        port: int | None = None,
        host: str = HOST,
    ) -> None:
        self.home = Path(home).resolve()
        self.cache_dir = Path(cache_dir).resolve()
        # Loopback, or an address of a bridge the caller made (app/local/kubernetes.py's pods).
        self.host = host
        self.warehouse = warehouse
        self.io_properties = dict(io_properties or {})
        self.config_file = self.home / "rest-catalog.xml"
        self.database = self.home / "catalog.db"
        _check_warehouse(warehouse, self.io_properties)
        self.port = port or self._persisted_port() or free_port()
        # The config path is in the JVM's command line and names this home alone.
        self._process = DetachedProcess(self.home, "rest-catalog", str(self.config_file))

    @property
    def uri(self) -> str:
        return f"http://{self.host}:{self.port}"

    def catalog_properties(self) -> dict[str, str]:
        """What a pyiceberg client passes to `load_catalog` to use this catalog."""
        return {"type": "rest", "uri": self.uri, "warehouse": self.warehouse, **self.io_properties}

    def server_properties(self) -> dict[str, str]:
        """The catalog properties the server's JdbcCatalog (and its FileIO) is built with."""
        properties = {
            "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            "uri": f"jdbc:sqlite:{self.database}",
            "jdbc.schema-version": "V1",
            "jdbc.strict-mode": "true",
            "warehouse": self.warehouse,
        }
        if self.warehouse.startswith("s3://"):
            properties["io-impl"] = _S3_FILE_IO
            properties.update(
                {
                    java_name: self.io_properties[name]
                    for name, java_name in _S3_PROPERTIES.items()
                    if name in self.io_properties
                }
            )
        return properties

    # -- jars ---------------------------------------------------------------------------------

    def ensure_jars(self, progress: Callable[[str], None] | None = None) -> list[Path]:
        """Download the server's jars once into the shared cache; returns the classpath."""
        try:
            return [
                *resolve(_SERVER_COORDINATES, self.cache_dir, f"iceberg-rest-{ICEBERG_VERSION}", progress=progress),
                *resolve(
                    _SERVLET_COORDINATES, self.cache_dir, f"iceberg-rest-{ICEBERG_VERSION}-servlet", progress=progress
                ),
            ]
        except ResolveError as exc:
            raise RestCatalogError(str(exc)) from exc

    # -- lifecycle ----------------------------------------------------------------------------

    def running(self) -> bool:
        return self._process.pid() is not None

    def start(self, timeout: float = 90.0) -> None:
        """Start the server detached (unless it runs already) and wait until GET /v1/config answers."""
        if self.running():
            persisted = self._persisted_port()
            if persisted != self.port:
                raise RestCatalogError(
                    f"The REST catalog in {self.home} already runs on port {persisted}, "
                    f"not on the port {self.port} asked for"
                )
            self._wait_until_ready(timeout)
            return
        jars = self.ensure_jars()
        if not port_is_free(self.port):
            raise RestCatalogError(
                f"Cannot start the REST catalog in {self.home}: port {HOST}:{self.port} is already in use"
            )
        self.home.mkdir(parents=True, exist_ok=True)
        self._write_config()
        command = [
            str(java_executable(self.cache_dir)),
            *trust_store_options(),  # an https S3 endpoint is checked against the machine's CAs
            "-Xmx512m",
            "-Djava.awt.headless=true",
            # The AWS SDK would read ~/.aws and ask the EC2 metadata service for what the catalog
            # properties leave out; make it use the properties alone.
            f"-Daws.configFile={self.home / 'aws' / 'config'}",
            f"-Daws.sharedCredentialsFile={self.home / 'aws' / 'credentials'}",
            "-Daws.disableEc2Metadata=true",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss.SSS",
            "-cp",
            os.pathsep.join(str(jar) for jar in jars),
            _LAUNCHER_CLASS,
            str(self.config_file),
        ]
        env = {key: os.environ[key] for key in _PASSED_THROUGH if key in os.environ}
        try:
            self._process.start(command, self._answers_config, timeout, env=env)
        except LocalProcessError as exc:
            raise RestCatalogError(f"The REST catalog at {self.uri} (home {self.home}) did not start: {exc}") from exc

    def stop(self) -> None:
        """Stop the server (a clean shutdown; a paused server is thawed to let it shut down)."""
        try:
            self._process.stop()
        except LocalProcessError as exc:
            raise RestCatalogError(str(exc)) from exc

    def pause(self) -> None:
        """Freeze the JVM: connections are accepted by the kernel but never answered."""
        try:
            self._process.pause()
        except LocalProcessError as exc:
            raise RestCatalogError(f"Cannot pause the REST catalog: {exc}") from exc

    def resume(self) -> None:
        try:
            self._process.resume()
        except LocalProcessError as exc:
            raise RestCatalogError(f"Cannot resume the REST catalog: {exc}") from exc

    def log_tail(self) -> str:
        return self._process.log_tail()

    # -- helpers ------------------------------------------------------------------------------

    def _wait_until_ready(self, timeout: float) -> None:
        try:
            self._process.wait_while_running(self._answers_config, timeout)
        except LocalProcessError as exc:
            raise RestCatalogError(f"The REST catalog at {self.uri} (home {self.home}) does not answer: {exc}") from exc

    def _answers_config(self) -> bool:
        config = get_json(self.port, "/v1/config", host=self.host)
        return isinstance(config, dict) and "defaults" in config

    def _persisted_port(self) -> int | None:
        if not self.config_file.exists():
            return None
        try:
            root = ElementTree.parse(self.config_file).getroot()
        except ElementTree.ParseError as exc:
            raise RestCatalogError(f"Cannot read the port from {self.config_file}: {exc}") from exc
        port = root.find("./Call[@name='addConnector']/Arg/New/Set[@name='port']")
        return int(port.text) if port is not None and port.text else None

    def _write_config(self) -> None:
        indent = " " * 28
        entries = "\n".join(
            f"{indent}<Entry><Item>{escape(key)}</Item><Item>{escape(value)}</Item></Entry>"
            for key, value in self.server_properties().items()
        )
        text = f"""<?xml version="1.0"?>
<!DOCTYPE Configure PUBLIC "-//Jetty//Configure//EN" "https://jetty.org/configure_10_0.dtd">
<!-- Written by app/local/rest_catalog.py on every start; edit LocalRestCatalog instead.
     The wiring of org.apache.iceberg.rest.RESTCatalogServer, with the connector on loopback. -->
<Configure id="Server" class="org.eclipse.jetty.server.Server">
  <Set name="stopAtShutdown">true</Set>
  <Call name="addConnector">
    <Arg>
      <New class="org.eclipse.jetty.server.ServerConnector">
        <Arg><Ref refid="Server"/></Arg>
        <Set name="host">{self.host}</Set>
        <Set name="port">{self.port}</Set>
      </New>
    </Arg>
  </Call>
  <Set name="handler">
    <New class="org.eclipse.jetty.ee10.servlet.ServletContextHandler">
      <Arg type="int">0</Arg><!-- NO_SESSIONS -->
      <Call name="addServlet">
        <Arg>
          <New class="org.eclipse.jetty.ee10.servlet.ServletHolder">
            <Arg>
              <New class="org.apache.iceberg.rest.RESTCatalogServlet">
                <Arg>
                  <New class="org.apache.iceberg.rest.RESTCatalogAdapter">
                    <Arg>
                      <Call class="org.apache.iceberg.CatalogUtil" name="buildIcebergCatalog">
                        <Arg>rest_backend</Arg>
                        <Arg>
                          <Map>
{entries}
                          </Map>
                        </Arg>
                        <Arg><New class="org.apache.hadoop.conf.Configuration"/></Arg>
                      </Call>
                    </Arg>
                  </New>
                </Arg>
              </New>
            </Arg>
          </New>
        </Arg>
        <Arg>/*</Arg>
      </Call>
      <Call name="insertHandler">
        <Arg>
          <New class="org.eclipse.jetty.compression.server.CompressionHandler">
            <Call name="putCompression">
              <Arg><New class="org.eclipse.jetty.compression.gzip.GzipCompression"/></Arg>
            </Call>
          </New>
        </Arg>
      </Call>
    </New>
  </Set>
</Configure>
"""
        # It holds the S3 secret key: readable by its owner alone, from its first byte on.
        tmp = self.config_file.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(text)
        os.replace(tmp, self.config_file)


def _check_warehouse(warehouse: str, io_properties: Mapping[str, str]) -> None:
    if warehouse.startswith("s3://"):
        if not warehouse[len("s3://") :].split("/", 1)[0]:
            raise RestCatalogError(f"Warehouse {warehouse!r} names no bucket")
        missing = [name for name in _REQUIRED_S3_PROPERTIES if not io_properties.get(name)]
        if missing:
            # Without them the server's AWS SDK would look for a region and keys in the
            # environment and on the EC2 metadata service, which this server is kept away from.
            raise RestCatalogError(f"An s3:// warehouse ({warehouse}) needs io_properties {', '.join(missing)}")
    elif warehouse.startswith("file:///"):
        pass
    else:
        raise RestCatalogError(f"Warehouse {warehouse!r}: expected s3://bucket/prefix or file:///absolute/path")
