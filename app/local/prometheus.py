"""Prometheus and promtool for the tests and dev work: Debian's `prometheus` package (the release
this machine's Debian ships), unpacked into the cache folder rather than installed, so nothing is
started by the package's scripts and no root is needed once it is there.

`ensure_binaries` runs `apt-get download prometheus=<version>` into
`<cache>/prometheus-<version>/`, extracts the package there with `dpkg-deb -x`, and keeps
`bin/prometheus` and `bin/promtool`; later calls reuse them. Both are static Go binaries.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import tempfile
from pathlib import Path

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
