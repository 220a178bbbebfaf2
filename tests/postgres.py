"""A throwaway PostgreSQL server for tests and benchmarks: Debian's server binaries, a fresh cluster.

The server is never the system service. `postgres_server()` runs `initdb` into a new temporary
directory, starts that cluster with `pg_ctl` on a free loopback port (its Unix socket in the same
directory), creates a database and a password-authenticated user, yields a SQLAlchemy URI for
pyiceberg's SQL catalog, and stops and deletes the cluster afterwards. Whatever cluster the
Debian package made (15/main on port 5432) is left alone and never used.

If the binaries are missing and the process runs as root with apt, the `postgresql` package is
installed from Debian's mirrors first; otherwise, and if anything about the server fails, the
`postgres_uri` fixture skips with the reason. PostgreSQL refuses to run as root, so as root the
cluster belongs to the `postgres` system user (which the package creates) and every server
command runs as that user.

    from tests.postgres import postgres_uri  # noqa: F401  (the fixture, in a test module)

    with postgres_server() as server:        # (elsewhere, e.g. a benchmark)
        server.uri
"""

from __future__ import annotations

import fcntl
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER_USER = "postgres"  # the OS user that owns the cluster when running as root
DB_NAME = "geoingest"
DB_USER = "geoingest"
INSTALL_TIMEOUT_S = 900


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be run here; the message says why."""


@dataclass(frozen=True)
class PostgresServer:
    uri: str  # postgresql+psycopg2://user:password@127.0.0.1:port/db
    host: str
    port: int
    database: str
    user: str
    password: str
    bin_dir: Path
    data_dir: Path
    socket_dir: Path
    version: str
    install_seconds: float | None  # time apt took, if this process installed the package


def find_bin_dir() -> Path | None:
    """The newest /usr/lib/postgresql/<major>/bin holding initdb and pg_ctl."""
    candidates = []
    for initdb in glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        bin_dir = Path(initdb).parent
        major = bin_dir.parent.name
        if (bin_dir / "pg_ctl").exists() and (bin_dir / "postgres").exists():
            candidates.append((int(major) if major.isdigit() else 0, bin_dir))
    return max(candidates)[1] if candidates else None


def install_postgresql() -> float:
    """Install Debian's `postgresql` package; returns the seconds it took."""
    return install_packages(["postgresql"], "PostgreSQL server binaries are not installed")


def install_packages(packages: list[str], why: str) -> float:
    """Install Debian packages with apt-get (as root); returns the seconds it took."""
    if os.geteuid() != 0:
        raise PostgresUnavailable(
            f"{why} and this process is not root, so it cannot install them (apt-get install {' '.join(packages)})"
        )
    if shutil.which("apt-get") is None:
        raise PostgresUnavailable(f"{why} and apt-get is not available")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    started = time.monotonic()
    # The suite's workers may want the same packages at once, and another apt-get may be running
    # (a build of the cluster's parts): one install at a time here, and apt waits for dpkg's lock.
    wait = ["-o", f"DPkg::Lock::Timeout={INSTALL_TIMEOUT_S}"]
    with _install_lock():
        for cmd in (["apt-get", *wait, "update", "-qq"], ["apt-get", *wait, "install", "-y", "-qq", *packages]):
            try:
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise PostgresUnavailable(f"'{' '.join(cmd)}' did not finish in {INSTALL_TIMEOUT_S} s") from None
            if done.returncode != 0:
                raise PostgresUnavailable(
                    f"'{' '.join(cmd)}' failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}"
                )
    return time.monotonic() - started


@contextmanager
def _install_lock() -> Iterator[None]:
    with open("/tmp/geoingest-tests-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_postgis(bin_dir: Path) -> None:
    """PostGIS 3 for the server in `bin_dir`, from Debian's postgresql-<major>-postgis-3 package."""
    major = bin_dir.parent.name
    if Path(f"/usr/share/postgresql/{major}/extension/postgis.control").exists():
        return
    install_packages([f"postgresql-{major}-postgis-3"], f"PostGIS is not installed for PostgreSQL {major}")


def ensure_bin_dir() -> tuple[Path, float | None]:
    bin_dir = find_bin_dir()
    if bin_dir is not None:
        return bin_dir, None
    seconds = install_postgresql()
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise PostgresUnavailable("apt-get installed postgresql, but no /usr/lib/postgresql/*/bin/initdb appeared")
    return bin_dir, seconds


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Runner:
    """Runs the server's commands as the cluster's owner: this user, or `postgres` when root."""

    def __init__(self) -> None:
        self.as_other = os.geteuid() == 0
        if self.as_other:
            try:
                entry = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root, and there is no '{SERVER_USER}' system user to "
                    f"own the cluster (initdb refuses root)"
                ) from None
            self.uid, self.gid, self.home = entry.pw_uid, entry.pw_gid, entry.pw_dir
        else:
            self.uid, self.gid, self.home = os.getuid(), os.getgid(), os.environ.get("HOME", "/tmp")

    def chown(self, path: Path) -> None:
        if self.as_other:
            os.chown(path, self.uid, self.gid)

    def run(self, cmd: list[str], timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C", "HOME": self.home}
        kwargs = dict(user=self.uid, group=self.gid, extra_groups=[]) if self.as_other else {}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd="/", **kwargs)
        if check and done.returncode != 0:
            raise PostgresUnavailable(
                f"'{' '.join(cmd)}' failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}"
            )
        return done


@contextmanager
def postgres_server(durable: bool = False, logical: bool = False, postgis: bool = False) -> Iterator[PostgresServer]:
    """A fresh PostgreSQL cluster on a free loopback port, stopped and deleted on exit.

    `logical=True` turns logical decoding on (wal_level=logical, replication slots and WAL
    senders) and gives the database user the REPLICATION attribute: what Debezium reads with.
    `postgis=True` installs PostGIS if needed and creates the extension in the database.

    `durable=False` turns fsync off: the cluster is thrown away, and the tests run on a shared
    machine. Commit semantics (row locks, isolation, UPDATE ... WHERE) are the same either way.
    """
    bin_dir, install_seconds = ensure_bin_dir()
    if postgis:
        ensure_postgis(bin_dir)
    runner = _Runner()
    base = Path(tempfile.mkdtemp(prefix="geoingest-pg-"))
    data_dir, socket_dir, log = base / "data", base / "sock", base / "server.log"
    started = False
    try:
        socket_dir.mkdir()
        for path in (base, socket_dir):
            runner.chown(path)
        runner.run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data_dir),
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
            ]
        )
        port = free_port()
        options = f"-p {port} -k {socket_dir} -c listen_addresses=127.0.0.1"
        if not durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        if logical:
            options += " -c wal_level=logical -c max_replication_slots=8 -c max_wal_senders=8"
        runner.run(
            [str(bin_dir / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(data_dir), "-l", str(log), "-o", options]
        )
        started = True
        password = secrets.token_hex(12)
        psql = [
            str(bin_dir / "psql"),
            "-h",
            str(socket_dir),
            "-p",
            str(port),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-qAt",
        ]
        replication = " REPLICATION" if logical else ""
        runner.run(psql + ["-c", f"CREATE ROLE {DB_USER} LOGIN{replication} PASSWORD '{password}'"])
        runner.run(psql + ["-c", f"CREATE DATABASE {DB_NAME} OWNER {DB_USER}"])
        if postgis:
            runner.run([*psql[:8], DB_NAME, *psql[9:], "-c", "CREATE EXTENSION postgis"])
        version = runner.run(psql + ["-c", "SHOW server_version"]).stdout.strip()
        yield PostgresServer(
            uri=f"postgresql+psycopg2://{DB_USER}:{password}@127.0.0.1:{port}/{DB_NAME}",
            host="127.0.0.1",
            port=port,
            database=DB_NAME,
            user=DB_USER,
            password=password,
            bin_dir=bin_dir,
            data_dir=data_dir,
            socket_dir=socket_dir,
            version=version,
            install_seconds=install_seconds,
        )
    except PostgresUnavailable as exc:
        if log.exists():
            raise PostgresUnavailable(f"{exc}\nserver log:\n{log.read_text()[-2000:]}") from None
        raise
    finally:
        if started:
            runner.run([str(bin_dir / "pg_ctl"), "stop", "-m", "fast", "-w", "-D", str(data_dir)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def _psycopg2_missing() -> str | None:
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return (
            "psycopg2 is not installed: pyiceberg's SQL catalog on PostgreSQL needs it "
            "(pip install 'pyiceberg[sql-postgres]')"
        )
    return None


@pytest.fixture(scope="session")
def postgres_server_info() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server; skips the tests that use it if none can be run."""
    if reason := _psycopg2_missing():
        pytest.skip(reason)
    try:
        with postgres_server() as server:
            yield server
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")


@pytest.fixture(scope="session")
def postgres_uri(postgres_server_info: PostgresServer) -> str:
    """SQLAlchemy URI of a fresh PostgreSQL database (one server per test session)."""
    return postgres_server_info.uri
