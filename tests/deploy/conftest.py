"""Deployment artefacts: the Dockerfile, the Grafana dashboard and the Helm chart.

Helm is built from source with `go install` at a pinned version, once, into the cache folder
(<cache_dir>/tools, cache_dir being GEOINGEST_CACHE_DIR or ~/.cache/geoingest); Go's module and
build caches go there too. Without `go` and without a cached helm the chart tests are skipped.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import CACHE_DIR

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "geoingest"

# Bump together with nothing else: helm's Kubernetes version is read from its own go.mod.
HELM_VERSION = "v3.21.4"
HELM_MODULE = "helm.sh/helm/v3"
TOOLS = CACHE_DIR / "tools"
HELM = TOOLS / f"helm-{HELM_VERSION}" / "bin" / "helm"


def _go_env(go: str) -> dict[str, str]:
    """Go's environment with every cache under TOOLS; the user's go env file (proxy, flags) still applies."""
    user = json.loads(
        subprocess.run([go, "env", "-json", "GOENV", "GOFLAGS"], capture_output=True, text=True, check=True).stdout
    )
    gopath = TOOLS / "go"
    return {
        **os.environ,
        "GOENV": user["GOENV"],
        "GOFLAGS": f"{user['GOFLAGS']} -modcacherw".strip(),
        "GOPATH": str(gopath),
        "GOMODCACHE": str(gopath / "pkg" / "mod"),
        "GOCACHE": str(gopath / "build-cache"),
        # Go's telemetry counters live under the user config dir: keep them here too.
        "XDG_CONFIG_HOME": str(gopath / "config"),
        "CGO_ENABLED": "0",
    }


def _kubernetes_version(go: str, env: dict[str, str]) -> tuple[str, str]:
    """The Kubernetes version helm's Makefile stamps in (client-go v0.X.Y -> 1.X), from helm's go.mod."""
    info = json.loads(
        subprocess.run(
            [go, "mod", "download", "-json", f"{HELM_MODULE}@{HELM_VERSION}"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=900,
        ).stdout
    )
    match = re.search(r"^\s*k8s\.io/client-go v(\d+)\.(\d+)\.", Path(info["GoMod"]).read_text(), re.MULTILINE)
    assert match, f"no k8s.io/client-go in {info['GoMod']}"
    return str(int(match.group(1)) + 1), match.group(2)


def build_helm() -> Path:
    """Helm, built once: the test workers that want it at once wait for the first one's build
    (two builds at once would each take both cores for minutes)."""
    if HELM.is_file():
        return HELM
    HELM.parent.parent.mkdir(parents=True, exist_ok=True)
    with open(HELM.parent.parent / "helm-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return HELM if HELM.is_file() else _go_install_helm()


def _go_install_helm() -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip(f"helm {HELM_VERSION} is not in {HELM.parent} and there is no `go` on PATH to build it")
    env = _go_env(go)
    major, minor = _kubernetes_version(go, env)
    # What helm's Makefile sets: without it helm reports v3.x with no patch and templates for Kubernetes 1.20.
    ldflags = " ".join(
        [
            "-s -w",
            f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
            f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor={major}",
            f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={minor}",
            f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor={major}",
            f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={minor}",
        ]
    )
    HELM.parent.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="helm-build-", dir=HELM.parent.parent))
    started = time.monotonic()
    try:
        subprocess.run(
            [go, "install", "-trimpath", f"-ldflags={ldflags}", f"{HELM_MODULE}/cmd/helm@{HELM_VERSION}"],
            env={**env, "GOBIN": str(staging)},
            check=True,
            timeout=1800,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        HELM.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / "helm", HELM)
        print(f"helm: go install helm {HELM_VERSION}: {time.monotonic() - started:.1f} s", file=sys.stderr)
        # The compiled packages (~700 MB) serve no later build of another version; the module
        # cache stays, so the same version rebuilds without the network.
        shutil.rmtree(env["GOCACHE"], ignore_errors=True)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(
            f"building helm {HELM_VERSION} failed:\n{exc.stdout.decode(errors='replace')[-4000:]}"
        ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return HELM


class Helm:
    """The helm binary, with its own (empty) config, cache and data folders."""

    def __init__(self, binary: Path, home: Path):
        self.binary = binary
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        return result


@pytest.fixture(scope="session")
def helm(tmp_path_factory) -> Helm:
    return Helm(build_helm(), tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="session")
def podman():
    """The one podman of the test run (app/local/image.py; one at a time may use its storage),
    with the service image built: the build context and the temporary folder are shared with it."""
    from app.local.image import DEFAULT_TAG, Podman

    if os.geteuid() != 0:
        pytest.skip("podman here needs root (mount and PID namespaces, chroot)")
    with Podman(CACHE_DIR, shared=[ROOT, Path(tempfile.gettempdir())]) as podman:
        started = time.monotonic()
        podman.build(DEFAULT_TAG)
        print(f"image build (cached after the first): {time.monotonic() - started:.1f} s")
        yield podman
