"""A real single-node Kubernetes cluster on this machine, for the chart's tests and for trying it.

The control plane (kube-apiserver, kube-controller-manager, kube-scheduler) and the node (kubelet,
containerd with Debian's runc, a CNI bridge) are the upstream programs, built once from the Go
module proxy into the cache folder; etcd, runc and the CNI plugins come from a Debian trixie root
made by mmdebstrap. Every process runs chrooted into that root inside one mount and PID namespace
(app/local/image.py's ChrootNamespace): stopping the cluster, or the death of the Python process
that started it, ends them all.

Networking stays on this machine: the API server, the kubelet and the pods live on a bridge this
launcher creates (BRIDGE, NODE_IP/24); pods reach the host at NODE_IP (where a test's broker
listens) and nothing routes further. There is no kube-proxy: the cluster's DNS (ClusterDNS, on
NODE_IP:53) answers a Service's name with the addresses of its ready endpoints, so names work as
long as a Service's port is its target port (true of the chart's Services and of `kubernetes`,
whose API server listens on 443). Any other name is NXDOMAIN: nothing is forwarded.

Cached under <cache_dir>/kubernetes: the binaries (bin-<version>, containerd-<version>), the pause
image, the node's root and Go's module cache. Each build step prints its time.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.local import image
from app.local.image import ChrootNamespace, ImageError, Podman, make_root


def log(message: str) -> None:
    image.log(message, "cluster")


def timed(step: str):
    return image.timed(step, "cluster")


KUBERNETES_VERSION = "v1.37.2"
# The staging modules (k8s.io/api, ...) are published as v0.<minor>.<patch>.
STAGING_VERSION = "v0.37.2"
CONTAINERD_VERSION = "v2.4.2"
NODE_SUITE = "trixie"
NODE_PACKAGES = (
    "etcd-server",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "iproute2",
    "ca-certificates",
    "mount",
    "util-linux",
)
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
NODE_NAME = "geoingest-node"
BRIDGE = "geoingest0"
NODE_IP = "10.244.0.1"
POD_SUBNET = "10.244.0.0/24"
SERVICE_RANGE = "10.96.0.0/24"
# The API server listens on the port of the `kubernetes` Service, since names resolve straight to
# endpoints here (ClusterDNS): https://kubernetes.default.svc reaches it as in any cluster.
API_PORT = 443
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"

PAUSE_SOURCE = """package main

// The pod sandbox's process: it holds the pod's namespaces and waits for its end.

import (
\t"os"
\t"os/signal"
\t"syscall"
)

func main() {
\tsignals := make(chan os.Signal, 1)
\tsignal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
\tgo func() {
\t\tfor {
\t\t\tvar status syscall.WaitStatus
\t\t\tif _, err := syscall.Wait4(-1, &status, 0, nil); err != nil {
\t\t\t\tsignal.Ignore(syscall.SIGCHLD)
\t\t\t\treturn
\t\t\t}
\t\t}
\t}()
\t<-signals
}
"""


class ClusterError(RuntimeError):
    """The cluster could not be built or started; the message names the step and the log."""


def _go_env(home: Path) -> dict[str, str]:
    go = home / "go"
    return {
        **os.environ,
        "GOPATH": str(go),
        "GOMODCACHE": str(go / "pkg" / "mod"),
        "GOCACHE": str(go / "build-cache"),
        "GOFLAGS": "-modcacherw",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
        "XDG_CONFIG_HOME": str(go / "config"),
    }


def _go_binary(step: str) -> str:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        raise ClusterError(f"{step}: there is no `go` on PATH to build it with")
    return go


def _go(args: Sequence[str], cwd: Path, env: dict[str, str], step: str, timeout: float = 2400) -> None:
    go = _go_binary(step)
    result = subprocess.run(
        ["nice", "-n", "10", go, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise ClusterError(f"{step} failed:\n{(result.stdout + result.stderr)[-4000:]}")


def build_kubernetes(home: Path) -> Path:
    """kube-apiserver, kube-controller-manager, kube-scheduler and kubelet from k8s.io/kubernetes,
    in a module that pins each staging module to its published version."""
    out = home / f"bin-{KUBERNETES_VERSION}"
    if all((out / name).is_file() for name in COMPONENTS):
        return out
    env = _go_env(home)
    src = home / "src-kubernetes"
    src.mkdir(parents=True, exist_ok=True)
    with timed(f"go mod download k8s.io/kubernetes@{KUBERNETES_VERSION}"):
        info = subprocess.run(
            [_go_binary("go mod download"), "mod", "download", "-json", f"k8s.io/kubernetes@{KUBERNETES_VERSION}"],
            cwd=src,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if info.returncode != 0:
            raise ClusterError(f"go mod download k8s.io/kubernetes failed: {info.stdout[-2000:]}{info.stderr[-2000:]}")
    gomod = Path(json.loads(info.stdout)["GoMod"]).read_text()
    staging = sorted({line.split()[0] for line in gomod.splitlines() if "=> ./staging/src/" in line and line.strip()})
    lines = [
        "module geoingest.local/kubernetes",
        "",
        "go 1.26.0",
        "",
        f"require k8s.io/kubernetes {KUBERNETES_VERSION}",
        "",
    ]
    lines += [f"replace {module} => {module} {STAGING_VERSION}" for module in staging]
    (src / "go.mod").write_text("\n".join(lines) + "\n")
    imports = "\n".join(f'\t_ "k8s.io/kubernetes/cmd/{name}"' for name in COMPONENTS)
    (src / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")
    with timed("go mod tidy (kubernetes)"):
        _go(["mod", "tidy"], src, env, "go mod tidy for k8s.io/kubernetes", timeout=900)
    staging_out = Path(tempfile.mkdtemp(prefix="bin-", dir=home))
    version = KUBERNETES_VERSION.lstrip("v").split(".")
    ldflags = (
        f"-s -w -X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}"
        f" -X k8s.io/component-base/version.gitMajor={version[0]} -X k8s.io/component-base/version.gitMinor={version[1]}"
    )
    with timed(f"go build {' '.join(COMPONENTS)} {KUBERNETES_VERSION}"):
        _go(
            ["build", "-p", "2", "-trimpath", f"-ldflags={ldflags}", "-o", f"{staging_out}/"]
            + [f"k8s.io/kubernetes/cmd/{name}" for name in COMPONENTS],
            src,
            env,
            f"go build of Kubernetes {KUBERNETES_VERSION}",
        )
    os.replace(staging_out, out) if not out.exists() else shutil.rmtree(staging_out)
    return out


def build_containerd(home: Path) -> Path:
    out = home / f"containerd-{CONTAINERD_VERSION}"
    names = ("containerd", "ctr", "containerd-shim-runc-v2")
    if all((out / name).is_file() for name in names):
        return out
    env = _go_env(home)
    module = f"github.com/containerd/containerd/v2@{CONTAINERD_VERSION}"
    info = subprocess.run(
        [_go_binary("go mod download"), "mod", "download", "-json", module],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=home,
    )
    if info.returncode != 0:
        raise ClusterError(f"go mod download {module} failed: {info.stdout[-2000:]}{info.stderr[-2000:]}")
    src = Path(json.loads(info.stdout)["Dir"])
    staging_out = Path(tempfile.mkdtemp(prefix="containerd-", dir=home))
    with timed(f"go build containerd {CONTAINERD_VERSION}"):
        _go(
            ["build", "-p", "2", "-trimpath", "-tags=no_btrfs no_devmapper no_zfs"]
            + [f"-ldflags=-s -w -X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}"]
            + ["-o", f"{staging_out}/", *(f"./cmd/{name}" for name in names)],
            src,
            env,
            f"go build of containerd {CONTAINERD_VERSION}",
        )
    os.replace(staging_out, out) if not out.exists() else shutil.rmtree(staging_out)
    return out


def build_pause(home: Path, podman: Podman) -> Path:
    """The pod sandbox image: a static binary in a FROM scratch image, as a docker archive.
    `podman` must share the system's temporary folder (where the build context is made)."""
    archive = home / "pause.tar"
    if archive.is_file():
        return archive
    src = home / "src-pause"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text("module geoingest.local/pause\n\ngo 1.26.0\n")
    (src / "main.go").write_text(PAUSE_SOURCE)
    with timed("go build pause"):
        _go(["build", "-trimpath", "-ldflags=-s -w", "-o", str(src / "pause"), "."], src, _go_env(home), "pause")
    with tempfile.TemporaryDirectory(prefix="pause-") as folder:
        context = Path(folder)
        shutil.copy2(src / "pause", context / "pause")
        (context / "Containerfile").write_text(
            'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n'
        )
        with timed("podman build pause"):
            podman.run("build", "--pull=never", f"--tag={PAUSE_IMAGE}", f"--file={context / 'Containerfile'}", folder)
            podman.run("save", "--format=docker-archive", f"--output={context / 'pause.tar'}", PAUSE_IMAGE)
        shutil.move(context / "pause.tar", archive)
    return archive


class ClusterDNS:
    """A DNS server for the pods: `<service>.<namespace>.svc[.cluster.local]` A queries answered
    with the ready endpoint addresses of the Service (EndpointSlices, read from the API on each
    query), everything else NXDOMAIN. UDP only, in a thread of the process that started the cluster."""

    def __init__(self, cluster: Cluster, address: str = NODE_IP, port: int = 53):
        self.cluster = cluster
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, port))
        self.sock.settimeout(0.5)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="cluster-dns", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, peer = self.sock.recvfrom(4096)
            except (TimeoutError, OSError):
                continue
            try:
                self.sock.sendto(self.answer(query), peer)
            except (OSError, ValueError, IndexError, struct.error):
                continue

    def addresses(self, name: str) -> list[str] | None:
        """The A records of a name; None when the name is not the cluster's."""
        labels = name.lower().rstrip(".").removesuffix(".cluster.local").split(".")
        if len(labels) != 3 or labels[2] != "svc":
            return None
        service, namespace = labels[0], labels[1]
        try:
            slices = self.cluster.api(
                "GET",
                f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
                f"?labelSelector=kubernetes.io/service-name%3D{service}",
            )
        except (OSError, ValueError):
            return None
        found = [
            address
            for item in slices.get("items", [])
            for endpoint in item.get("endpoints") or []
            if (endpoint.get("conditions") or {}).get("ready", True)
            for address in endpoint.get("addresses", [])
        ]
        return sorted(set(found)) if slices.get("items") else None

    def answer(self, query: bytes) -> bytes:
        ident, flags = struct.unpack("!HH", query[:4])
        offset, labels = 12, []
        while query[offset]:
            length = query[offset]
            labels.append(query[offset + 1 : offset + 1 + length].decode("ascii", "replace"))
            offset += 1 + length
        question = query[12 : offset + 5]
        qtype = struct.unpack("!H", query[offset + 1 : offset + 3])[0]
        addresses = self.addresses(".".join(labels))
        rd = flags & 0x0100
        if addresses is None:
            return struct.pack("!HHHHHH", ident, 0x8403 | rd, 1, 0, 0, 0) + question
        records = [a for a in addresses if qtype == 1]
        header = struct.pack("!HHHHHH", ident, 0x8400 | rd, 1, len(records), 0, 0)
        body = b"".join(struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(a) for a in records)
        return header + question + body


class Cluster:
    """The running cluster: its admin credentials, its API and the launcher's processes."""

    def __init__(self, cache_dir: Path, state: Path, podman: Podman, shared: Sequence[Path] = ()):
        self.home = Path(cache_dir) / "kubernetes"
        self.podman = podman
        self.state = Path(state).resolve()
        self.root = self.home / f"node-{NODE_SUITE}"
        self.shared = [Path(p).resolve() for p in shared]
        self.namespace: ChrootNamespace | None = None
        self.processes: dict[str, subprocess.Popen] = {}
        self.token = base64.b32encode(os.urandom(20)).decode().lower()
        self.server = f"https://{NODE_IP}:{API_PORT}"
        self.kubeconfig = self.state / "admin.kubeconfig"
        self.bin = Path()
        self.containerd_bin = Path()
        self.dns: ClusterDNS | None = None

    # -- building -------------------------------------------------------------------------------

    def build(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        make_root(self.root, NODE_SUITE, NODE_PACKAGES)
        self.bin = build_kubernetes(self.home)
        self.containerd_bin = build_containerd(self.home)
        build_pause(self.home, self.podman)

    # -- starting -------------------------------------------------------------------------------

    def start(self, timeout_s: float = 300) -> Cluster:
        self.build()
        started = time.monotonic()
        for name in ("pki", "etcd", "kubelet", "containerd", "cni", "logs", "volumes"):
            (self.state / name).mkdir(parents=True, exist_ok=True)
        self._bridge_up()
        self._write_files()
        self.namespace = ChrootNamespace(self.root, [self.state, self.home, *self.shared])
        self.namespace.start()
        try:
            self._spawn("etcd", ["etcd", *self._etcd_args()])
            self._spawn(
                "containerd", [str(self.containerd_bin / "containerd"), f"--config={self.state}/containerd.toml"]
            )
            self._spawn("kube-apiserver", [str(self.bin / "kube-apiserver"), *self._apiserver_args()])
            self._wait(lambda: self._api_ready(), "kube-apiserver to answer /readyz", 120, "kube-apiserver")
            self._write_kubeconfigs()
            self.dns = ClusterDNS(self)
            self.dns.start()
            self._spawn(
                "kube-controller-manager", [str(self.bin / "kube-controller-manager"), *self._controller_args()]
            )
            self._spawn(
                "kube-scheduler",
                [
                    str(self.bin / "kube-scheduler"),
                    f"--kubeconfig={self.state}/scheduler.kubeconfig",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    "--secure-port=0",
                ],
            )
            self.import_image(self.home / "pause.tar")
            self._spawn("kubelet", [str(self.bin / "kubelet"), *self._kubelet_args()])
            self._wait(self._node_ready, f"node {NODE_NAME} to be Ready", timeout_s, "kubelet")
        except BaseException:
            self.stop()
            raise
        log(f"cluster up in {time.monotonic() - started:.1f} s: {self.server}")
        return self

    def stop(self) -> None:
        if self.dns is not None:
            self.dns.stop()
            self.dns = None
        if self.namespace is not None:
            self.namespace.stop()
            self.namespace = None
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()
        self.processes.clear()
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _bridge_up(self) -> None:
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
        for command in (
            ["ip", "link", "add", BRIDGE, "type", "bridge"],
            ["ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE],
            ["ip", "link", "set", BRIDGE, "up"],
        ):
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise ClusterError(f"{' '.join(command)}: {result.stderr.strip()}")

    def _spawn(self, name: str, args: list[str]) -> None:
        assert self.namespace is not None
        logfile = (self.state / "logs" / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            self.namespace.command(*args), stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.state / "logs" / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _wait(self, ready, what: str, timeout_s: float, component: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise ClusterError(
                        f"{name} exited ({process.returncode}) waiting for {what}:\n{self.log_tail(name)}"
                    )
            try:
                if ready():
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(1)
        raise ClusterError(f"no {what} after {timeout_s:.0f} s:\n{self.log_tail(component)}")

    # -- configuration --------------------------------------------------------------------------

    def _write_files(self) -> None:
        pki = self.state / "pki"
        if not (pki / "sa.key").exists():
            subprocess.run(["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"], check=True, capture_output=True)
            subprocess.run(
                ["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")],
                check=True,
                capture_output=True,
            )
        # Static tokens: the admin (system:masters), the node, the controller manager, the scheduler.
        users = {
            "admin": ("admin", "system:masters"),
            "node": (f"system:node:{NODE_NAME}", "system:nodes"),
            "controller-manager": ("system:kube-controller-manager", ""),
            "scheduler": ("system:kube-scheduler", ""),
        }
        self.tokens = {
            name: (self.token if name == "admin" else base64.b32encode(os.urandom(20)).decode().lower())
            for name in users
        }
        (pki / "tokens.csv").write_text(
            "".join(f'{self.tokens[name]},{user},{user},"{group}"\n' for name, (user, group) in users.items())
        )
        (self.state / "containerd.toml").write_text(
            f"""version = 3
root = "{self.state}/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "/usr/sbin/runc"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{self.state}/cni/net.d"
"""
        )
        (self.state / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (self.state / "cni" / "net.d" / "10-geoingest.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "geoingest",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "dataDir": f"{self.state}/cni/ipam",
                                "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                            },
                        }
                    ],
                },
                indent=2,
            )
        )
        (self.state / "kubelet.yaml").write_text(
            f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: 10250
readOnlyPort: 0
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
failSwapOn: false
# This machine mounts cgroup v1 (kubelet refuses it unless told).
failCgroupV1: false
resolvConf: ""
clusterDomain: cluster.local
clusterDNS: [{NODE_IP}]
registerNode: true
serializeImagePulls: false
evictionHard:
  memory.available: 200Mi
  nodefs.available: 2%
  imagefs.available: 2%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: {self.state}/pod-logs
"""
        )

    def _etcd_args(self) -> list[str]:
        self.etcd_port = _free_port()
        peer = _free_port()
        return [
            f"--data-dir={self.state}/etcd",
            f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--quota-backend-bytes=1073741824",
        ]

    def _apiserver_args(self) -> list[str]:
        pki = self.state / "pki"
        return [
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--bind-address={NODE_IP}",
            f"--advertise-address={NODE_IP}",
            f"--secure-port={API_PORT}",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            f"--cert-dir={pki}/apiserver",
            f"--token-auth-file={pki}/tokens.csv",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki}/sa.pub",
            f"--service-account-signing-key-file={pki}/sa.key",
            "--enable-admission-plugins=NodeRestriction",
            "--kubelet-preferred-address-types=InternalIP",
        ]

    def _controller_args(self) -> list[str]:
        pki = self.state / "pki"
        return [
            f"--kubeconfig={self.state}/controller-manager.kubeconfig",
            f"--service-account-private-key-file={pki}/sa.key",
            f"--root-ca-file={self.ca_file}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
        ]

    def _kubelet_args(self) -> list[str]:
        return [
            f"--config={self.state}/kubelet.yaml",
            f"--kubeconfig={self.state}/node.kubeconfig",
            f"--root-dir={self.state}/kubelet",
            f"--cert-dir={self.state}/pki/kubelet",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
        ]

    @property
    def ca_file(self) -> Path:
        return self.state / "pki" / "apiserver" / "apiserver.crt"

    def _write_kubeconfigs(self) -> None:
        for name in ("admin", "node", "controller-manager", "scheduler"):
            config = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "geoingest",
                        "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                    }
                ],
                "users": [{"name": name, "user": {"token": self.tokens[name]}}],
                "contexts": [{"name": "geoingest", "context": {"cluster": "geoingest", "user": name}}],
                "current-context": "geoingest",
            }
            path = self.state / f"{name}.kubeconfig"
            path.write_text(json.dumps(config, indent=2))
            path.chmod(0o600)

    # -- the API --------------------------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def api(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        """One request to the API server as the admin; the decoded JSON answer (text when not JSON)."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", content_type)
        with urllib.request.urlopen(request, context=self._ssl(), timeout=30) as answer:
            text = answer.read().decode()
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text

    def _api_ready(self) -> bool:
        if not self.ca_file.exists():
            return False
        return self.api("GET", "/readyz") == "ok"

    def _node_ready(self) -> bool:
        node = self.api("GET", f"/api/v1/nodes/{NODE_NAME}")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])

    def ctr(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        assert self.namespace is not None
        command = self.namespace.command(
            str(self.containerd_bin / "ctr"), "--address=/run/containerd/containerd.sock", "--namespace=k8s.io", *args
        )
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise ClusterError(f"ctr {' '.join(args[:3])} failed: {(result.stdout + result.stderr)[-2000:]}")
        return result

    def import_image(self, archive: Path) -> None:
        """An image archive (docker or OCI) into the node's containerd, as if pulled."""
        deadline = time.monotonic() + 60
        while not (self.root / "run").exists() or self._ctr_ok() is False:
            if time.monotonic() > deadline:
                raise ClusterError(f"containerd did not answer:\n{self.log_tail('containerd')}")
            time.sleep(1)
        with timed(f"ctr images import {archive.name}"):
            self.ctr("images", "import", str(archive))

    def _ctr_ok(self) -> bool:
        try:
            self.ctr("version", timeout=10)
            return True
        except ClusterError:
            return False

    def add_volume(self, name: str, size: str = "10Gi") -> Path:
        """A PersistentVolume on the node's disk (no class: what a claim without one binds to),
        writable by any user, as a local-path provisioner would make it."""
        folder = self.state / "volumes" / name
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)
        self.api(
            "POST",
            "/api/v1/persistentvolumes",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "hostPath": {"path": str(folder), "type": "Directory"},
                },
            },
        )
        return folder


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m app.local.kubernetes [--image TAG]`: the cluster up until Ctrl-C, with the image
    imported; prints the kubeconfig to use with helm and kubectl. With --build-only: what the
    cluster needs built into the cache, and nothing started (CI builds it beside the suite)."""
    import argparse
    import signal

    from app.local.image import DEFAULT_TAG, ROOT
    from app.settings import load_settings

    parser = argparse.ArgumentParser(prog="python -m app.local.kubernetes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default=DEFAULT_TAG, help=f"image to build and import (default {DEFAULT_TAG})")
    parser.add_argument("--state", help="the cluster's folder (default: a new temporary one)")
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="build the image and the node's parts (root, Kubernetes, containerd, pause) into the cache, start nothing",
    )
    args = parser.parse_args(argv)
    cache_dir = Path(load_settings().cache_dir)
    state = Path(args.state or tempfile.mkdtemp(prefix="geoingest-node-"))
    try:
        with Podman(cache_dir, shared=[ROOT, Path(tempfile.gettempdir()), state]) as podman:
            podman.build(args.image)
            if args.build_only:
                Cluster(cache_dir, state, podman).build()
                return 0
            with Cluster(cache_dir, state, podman, shared=[Path(tempfile.gettempdir())]) as cluster:
                archive = state / "image.tar"
                podman.run("save", "--format=docker-archive", f"--output={archive}", args.image, timeout=900)
                cluster.import_image(archive)
                archive.unlink()
                print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
                signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    pass
    except (ClusterError, ImageError) as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1
    return 0


def _free_port() -> int:
    from app.local.process import free_port

    return free_port()


if __name__ == "__main__":
    sys.exit(main())
