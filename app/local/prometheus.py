"""Prometheus and promtool for the tests and dev work: Debian's `prometheus` package (the release
this machine's Debian ships), unpacked into the cache folder rather than installed, so nothing is
started by the package's scripts and no root is needed once it is there.

`ensure_binaries` runs `apt-get download prometheus=<version>` into
`<cache>/prometheus-<version>/`, extracts the package there with `dpkg-deb -x`, and keeps
`bin/prometheus` and `bin/promtool`; later calls reuse them. Both are static Go binaries.

`LocalPrometheus` runs one on loopback that scrapes the given targets every second and loads the
chart's alert rules, its data in its own folder; `query` and `alerts` ask its HTTP API.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.local.process import HOST, DetachedProcess, LocalProcessError, free_port, get_json

RULES_FILE = Path(__file__).resolve().parents[2] / "helm" / "geoingest" / "alerts" / "geoingest.rules.yaml"

# Debian 12's package; the alert rules and the dashboard's queries are checked with its promtool.
PROMETHEUS_DEB_VERSION = "2.42.0+ds-5+deb12u1"
_TIMEOUT_S = 600


class PrometheusUnavailable(RuntimeError):
    """The binaries could not be had; the message says which step failed."""


def ensure_binaries(cache_dir: Path) -> Path:
    """The folder holding `prometheus` and `promtool`, fetched once into the cache folder."""
    home = Path(cache_dir) / f"prometheus-{PROMETHEUS_DEB_VERSION.split('+')[0]}"
    out = home / "bin"
    if (out / "promtool").is_file() and (out / "prometheus").is_file():
        return out
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the suite's workers may ask at once
        if (out / "promtool").is_file() and (out / "prometheus").is_file():
            return out
        for tool in ("apt-get", "dpkg-deb"):
            if shutil.which(tool) is None:
                raise PrometheusUnavailable(f"{tool} is not available: Prometheus comes from Debian's package here")
        with tempfile.TemporaryDirectory(dir=home) as work:
            _run(["apt-get", "download", f"prometheus={PROMETHEUS_DEB_VERSION}"], Path(work), retry_after_update=True)
            (deb,) = Path(work).glob("prometheus_*.deb")
            _run(["dpkg-deb", "-x", str(deb), str(Path(work) / "root")], Path(work))
            staged = Path(work) / "bin"
            staged.mkdir()
            for name in ("prometheus", "promtool"):
                shutil.copy2(Path(work) / "root" / "usr" / "bin" / name, staged / name)
            staged.replace(out)
    return out


def _run(cmd: list[str], cwd: Path, retry_after_update: bool = False) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=_TIMEOUT_S)
    if done.returncode != 0 and retry_after_update:
        # A fresh machine has no package lists yet.
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True, timeout=_TIMEOUT_S)
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=_TIMEOUT_S)
    if done.returncode != 0:
        raise PrometheusUnavailable(
            f"'{' '.join(cmd)}' failed ({done.returncode}): {(done.stderr or done.stdout)[-1000:]}"
        )


class LocalPrometheus:
    """A Prometheus on loopback scraping `targets` (host:port) every second, with the chart's alert
    rules (or those of `rules_file`), evaluated every second."""

    def __init__(
        self,
        home: Path,
        cache_dir: Path,
        targets: Sequence[str],
        port: int | None = None,
        rules_file: Path = RULES_FILE,
    ):
        self.home = Path(home)
        self.rules_file = Path(rules_file)
        self.cache_dir = Path(cache_dir)
        self.targets = list(targets)
        self.port = port or free_port()
        self.process = DetachedProcess(self.home, "prometheus", "prometheus")

    def start(self, timeout_s: float = 60) -> LocalPrometheus:
        binary = ensure_binaries(self.cache_dir) / "prometheus"
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(self.rules_file)],
                    "scrape_configs": [{"job_name": "geoingest", "static_configs": [{"targets": self.targets}]}],
                }
            )
        )
        self.process.start(
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.home / 'data'}",
                f"--web.listen-address={HOST}:{self.port}",
                "--storage.tsdb.retention.time=1d",
            ],
            lambda: get_json(self.port, "/api/v1/status/buildinfo") is not None,
            timeout_s,
        )
        return self

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The series an instant query answers (at Unix time `at`, default now)."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        answer = get_json(self.port, f"/api/v1/query?{urllib.parse.urlencode(params)}", timeout_s=30)
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise LocalProcessError(f"Prometheus refused the query {expr!r}: {answer}")
        return list(answer["data"]["result"])

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """The series a range query answers: each with its labels ("metric") and [time, value] pairs."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        answer = get_json(self.port, f"/api/v1/query_range?{urllib.parse.urlencode(params)}", timeout_s=60)
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise LocalProcessError(f"Prometheus refused the query {expr!r}: {answer}")
        return list(answer["data"]["result"])

    def rules(self) -> list[dict[str, Any]]:
        """Every alert rule loaded, with its health ("ok", or "err" and lastError) at its last evaluation."""
        answer = get_json(self.port, "/api/v1/rules?type=alert", timeout_s=30)
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise LocalProcessError(f"Prometheus answered no rules: {answer}")
        return [rule for group in answer["data"]["groups"] for rule in group["rules"]]

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now."""
        answer = get_json(self.port, "/api/v1/alerts", timeout_s=30)
        if not isinstance(answer, dict):
            raise LocalProcessError(f"Prometheus answered no alerts: {answer}")
        return list(answer["data"]["alerts"])
