"""A detached server process for dev work, the tests and the demos: the local Kafka broker, the
S3-compatible object store, the REST catalog and the Spark standalone cluster.

Each server keeps its state (pid file, output, its own files) in a home folder and runs in a
session of its own, so it outlives the Python process that started it and a later `stop` (from
another process, or the same one) finds it by its pid file. A recycled pid is told apart from the
server by a marker that must appear in the process's command line (its Java main class or jar).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

HOST = "127.0.0.1"
_LOG_TAIL_LINES = 40


class LocalProcessError(RuntimeError):
    """A local server could not be started or stopped."""


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (state T in /proc); a thread gone meanwhile counts."""
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            # The state follows the command name, which is in parentheses and may hold spaces.
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state not in ("T", "t"):
            return False
    return True


def free_port() -> int:
    """An unused loopback TCP port (free now; nothing reserves it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Java binds with SO_REUSEADDR, so a port in TIME_WAIT after a stop is free for it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def port_answers(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def get_json(port: int, path: str, timeout_s: float = 5.0, host: str = HOST) -> object | None:
    """The JSON body of a 200 answer to GET http://<host>:<port><path>; None for anything else
    (nothing listening, another status, not JSON): what a readiness check asks of a server."""
    if not port_answers(port, host):
        return None
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    if response.status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


class DetachedProcess:
    """One server process, found again through `<home>/<name>.pid`.

    `marker` is a word of its command line (a Java main class, a jar name) that proves a pid is
    still this server; `logs` are the files whose last lines an error quotes."""

    def __init__(self, home: Path, name: str, marker: str, logs: Sequence[Path] = ()):
        self.home = Path(home).resolve()
        self.name = name
        self.marker = marker
        self.pid_file = self.home / f"{name}.pid"
        self.out_file = self.home / f"{name}.out"
        self.logs = (*logs, self.out_file)

    def pid(self) -> int | None:
        """The server's pid while it runs, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if self._is_ours(pid) else None

    def start(
        self,
        command: Sequence[str],
        ready: Callable[[], bool],
        timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> int:
        """Start `command` detached (unless it runs already) and wait until `ready()` is true."""
        running = self.pid()
        if running is not None:
            self.wait_until_ready(running, None, ready, time.monotonic() + timeout)
            return running
        self.pid_file.unlink(missing_ok=True)  # stale: its process is gone
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.out_file, "ab") as out:
            process = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd or self.home,
                env=None if env is None else dict(env),
                start_new_session=True,  # own session: Ctrl-C or exit of the caller leaves it running
            )
        self.pid_file.write_text(f"{process.pid}\n")
        try:
            self.wait_until_ready(process.pid, process, ready, time.monotonic() + timeout)
        except LocalProcessError:
            self.stop()
            raise
        with warnings.catch_warnings():
            # Outliving this handle is the point; Popen would warn that its child still runs.
            warnings.simplefilter("ignore", ResourceWarning)
            del process
        return self.pid() or 0

    def wait_while_running(self, ready: Callable[[], bool], timeout: float) -> None:
        """Wait for a server started earlier (maybe by another process) to be ready."""
        pid = self.pid()
        if pid is None:
            raise LocalProcessError(f"{self.name} in {self.home} is not running")
        self.wait_until_ready(pid, None, ready, time.monotonic() + timeout)

    def wait_until_ready(
        self, pid: int, process: subprocess.Popen | None, ready: Callable[[], bool], deadline: float
    ) -> None:
        while True:
            if process is not None and process.poll() is not None:
                raise LocalProcessError(
                    f"{self.name} exited with code {process.returncode} during startup "
                    f"(home {self.home}); {self.log_tail()}"
                )
            if process is None and not self._is_ours(pid):
                raise LocalProcessError(f"{self.name} pid {pid} died during startup; {self.log_tail()}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise LocalProcessError(f"{self.name} pid {pid} was not ready in time; {self.log_tail()}")
            time.sleep(0.25)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server (a clean shutdown), SIGKILL it if it is still there after timeout."""
        pid = self.pid()
        if pid is not None:
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(pid, sig)  # its session: a launcher script's children go too
                except (ProcessLookupError, PermissionError):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        break
                if sig == signal.SIGTERM:
                    self._continue(pid)  # a paused server acts on SIGTERM only once it runs again
                deadline = time.monotonic() + wait
                while self._is_ours(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not self._is_ours(pid):
                    break
            else:
                raise LocalProcessError(f"{self.name} pid {pid} (home {self.home}) survived SIGKILL")
        self.pid_file.unlink(missing_ok=True)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections hang, as to a host that went away. Returns
        once every thread of it is stopped: kill() returns before a busy machine has stopped them,
        and a thread still running would answer a request sent right after."""
        self._signal(signal.SIGSTOP)
        pid = self.pid()
        deadline = time.monotonic() + 10
        while pid is not None and not _all_threads_stopped(pid):
            if time.monotonic() > deadline:
                raise LocalProcessError(f"{self.name} (pid {pid}) did not stop within 10 s of SIGSTOP")
            time.sleep(0.01)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def log_tail(self) -> str:
        parts = [
            f"last lines of {path}:\n{tail(path.read_text(errors='replace'))}"
            for path in self.logs
            if path.exists() and path.stat().st_size
        ]
        return "\n".join(parts) or f"no output in {', '.join(str(p) for p in self.logs)}"

    def _signal(self, sig: signal.Signals) -> None:
        pid = self.pid()
        if pid is None:
            raise LocalProcessError(f"{self.name} is not running (home {self.home})")
        os.killpg(pid, sig)

    def _continue(self, pid: int) -> None:
        for send in (os.killpg, os.kill):
            try:
                send(pid, signal.SIGCONT)
                return
            except (ProcessLookupError, PermissionError):
                continue

    def _is_ours(self, pid: int) -> bool:
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our exited child, so no zombie looks alive
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        cmdline = Path(f"/proc/{pid}/cmdline")
        if cmdline.parent.exists():  # Linux: a recycled pid is not our server
            try:
                if _state(pid) == "Z":  # exited, not yet reaped by a parent that is not us
                    return False
                return any(self.marker in part for part in cmdline.read_bytes().decode(errors="replace").split("\0"))
            except OSError:
                return False
        return True


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def tail(text: str, lines: int = _LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])
