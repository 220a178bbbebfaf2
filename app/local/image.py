"""The service image, built from the project's Dockerfile on a machine without a Docker engine.

`python -m app.local.image` (`make image`) builds it with podman 5 (buildah inside it parses the
Dockerfile's `RUN <<EOF` heredocs; Debian bookworm's podman 4.3 does not). podman comes from a
Debian trixie root made by mmdebstrap, kept in the cache folder and entered with chroot in a mount
and PID namespace of its own (`Podman`): nothing is installed on the machine but mmdebstrap.

Where the Dockerfile's base (python:3.11.14-slim-bookworm) cannot be pulled, a stand-in made by
mmdebstrap from Debian bookworm (python3.11, venv, pip) is imported under that name. It carries
the machine's trust roots (/usr/local/share/ca-certificates, /etc/pip.conf, the Java trust store)
so that pip, apt and the Maven download inside the build reach the registries as the machine does.

Everything is cached under <cache_dir>/image: the podman root, the base's archive and podman's
storage (layers), so a second build takes seconds. Each step's time is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DEFAULT_TAG = "localhost/geoingest:dev"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# podman 5.4 (trixie) with Debian's runc: crun did not start containers on this kind of machine.
PODMAN_SUITE = "trixie"
PODMAN_PACKAGES = ("podman", "runc", "ca-certificates", "iptables", "netavark", "aardvark-dns", "passt", "uidmap")
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageError(RuntimeError):
    """The image or its tools could not be built; the message names the step."""


def log(message: str, prefix: str = "image") -> None:
    print(f"{prefix}: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def timed(step: str, prefix: str = "image") -> Iterator[None]:
    """Prints how long the step took (each build step's time, to quote)."""
    start = time.monotonic()
    yield
    log(f"{step}: {time.monotonic() - start:.1f} s", prefix)


def _run(command: Sequence[str], step: str, timeout: float = 1800, **kwargs) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise ImageError(f"{step}: no end after {timeout:.0f} s ({' '.join(command[:4])} ...)") from None
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-30:])
        raise ImageError(f"{step} failed (exit {result.returncode}):\n{tail}")
    return result


def ensure_mmdebstrap() -> str:
    """mmdebstrap from Debian's packages, installed with apt-get where it is missing (as root)."""
    found = shutil.which("mmdebstrap")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ImageError(
            "mmdebstrap is not installed and this is no root shell with apt-get: apt-get install mmdebstrap"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with timed("apt-get install mmdebstrap"):
        # Another apt-get may be running (a test suite installing PostgreSQL beside the build): wait for dpkg's lock.
        wait = ["-o", "DPkg::Lock::Timeout=600"]
        install = ["apt-get", *wait, "install", "-y", "-q", "--no-install-recommends", "mmdebstrap"]
        if subprocess.run(install, capture_output=True, env=env).returncode != 0:
            _run(["apt-get", *wait, "update", "-q"], "apt-get update", env=env)
            _run(install, "apt-get install mmdebstrap", env=env)
    found = shutil.which("mmdebstrap")
    if not found:
        raise ImageError("apt-get installed mmdebstrap but it is not on PATH")
    return found


def make_root(target: Path, suite: str, packages: Sequence[str], hooks: Sequence[str] = ()) -> Path:
    """A Debian root (a folder, or a tarball when target ends in .tar) made by mmdebstrap, atomically."""
    if target.exists():
        return target
    mmdebstrap = ensure_mmdebstrap()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(target.name + ".partial")
    if staging.is_dir():
        shutil.rmtree(staging)
    staging.unlink(missing_ok=True)
    command = [mmdebstrap, "--variant=minbase", f"--include={','.join(packages)}"]
    command += [f"--customize-hook={hook}" for hook in hooks]
    # mmdebstrap picks the output format from the name: keep the tarball's .tar suffix.
    out = staging.with_suffix(".partial.tar") if target.suffix == ".tar" else staging
    with timed(f"mmdebstrap {suite} -> {target.name}"):
        _run([*command, suite, str(out), DEBIAN_MIRROR], f"mmdebstrap {suite}", timeout=1200)
    os.replace(out, target)
    return target


def _trust_hooks() -> list[str]:
    """mmdebstrap hooks copying the machine's trust configuration into a root ($1)."""
    hooks = []
    local_cas = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    if local_cas:
        hooks.append(f'cp {" ".join(str(p) for p in local_cas)} "$1/usr/local/share/ca-certificates/"')
        hooks.append('chroot "$1" update-ca-certificates')
    if Path("/etc/pip.conf").is_file():
        hooks.append('cp /etc/pip.conf "$1/etc/pip.conf"')
    if Path("/etc/ssl/certs/java/cacerts").is_file():
        hooks.append('mkdir -p "$1/etc/ssl/certs/java" && cp /etc/ssl/certs/java/cacerts "$1/etc/ssl/certs/java/"')
    return hooks


def base_images(dockerfile: Path = DOCKERFILE) -> list[str]:
    """The images the Dockerfile's stages start FROM (stage names excluded)."""
    stages: set[str] = set()
    bases: list[str] = []
    # Upper-case FROM only: a heredoc's Python lines start with "from" too.
    for match in re.finditer(r"^FROM\s+(\S+)(?:\s+(?:AS|as)\s+(\S+))?", dockerfile.read_text(), re.MULTILINE):
        image, stage = match.group(1), match.group(2)
        if image not in stages and image not in bases:
            bases.append(image)
        if stage:
            stages.add(stage)
    return bases


def qualified(image: str) -> str:
    """An image reference as the Dockerfile's short name resolves on Docker Hub."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if "/" in image else f"docker.io/library/{image}"


class ChrootNamespace:
    """A Debian root entered with chroot in a mount and PID namespace that a holder process keeps
    while this object is open: every process started in it ends when it closes (or when the Python
    process that opened it dies). Host folders listed in `shared` appear at the same path inside;
    /run inside is a fresh tmpfs."""

    def __init__(self, root: Path, shared: Sequence[Path] = (), mounts: dict[str, Path] | None = None):
        self.root = Path(root)
        self.shared = [Path(p).resolve() for p in shared]
        # Host folders at another path inside: {path inside: host folder}.
        self.mounts = {inside: Path(host).resolve() for inside, host in (mounts or {}).items()}
        self._holder: subprocess.Popen | None = None
        self.pid = 0

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        mounts = "\n".join(
            f'mkdir -p "$R{inside}" && mount --rbind "{host}" "$R{inside}" && mount --make-rslave "$R{inside}"'
            for inside, host in [*((str(p), p) for p in self.shared), *self.mounts.items()]
        )
        script = f"""
set -e
R={self.root}
mount --bind "$R" "$R"
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys" && mount --make-rslave "$R/sys"
mount --rbind /dev "$R/dev" && mount --make-rslave "$R/dev"
mount -t tmpfs tmpfs "$R/run"
{mounts}
cp /etc/resolv.conf /etc/hosts "$R/etc/"
echo ready
read -r _ || true
"""
        # The holder is PID 1 of the namespace: when it ends (stdin closed), every process in it ends.
        self._holder = subprocess.Popen(
            ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "bash", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self._holder.stdout is not None
        line = self._holder.stdout.readline().strip()
        if line != "ready":
            err = self._holder.stderr.read() if self._holder.stderr else ""
            raise ImageError(f"the namespace of {self.root} did not start: {err.strip()[-2000:]}")
        children = Path(f"/proc/{self._holder.pid}/task/{self._holder.pid}/children").read_text().split()
        self.pid = int(children[0])

    def stop(self) -> None:
        if self._holder is None:
            return
        with contextlib.suppress(OSError):
            assert self._holder.stdin is not None
            self._holder.stdin.close()
        try:
            self._holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._holder.kill()
            self._holder.wait()
        self._holder = None
        self.pid = 0

    def command(self, *args: str, env: Sequence[str] = ()) -> list[str]:
        """A command line that runs `args` inside, with a clean environment plus `env`."""
        if not self.pid:
            raise ImageError(f"the namespace of {self.root} is not started")
        inner = ["chroot", str(self.root), "env", "-i", f"PATH={_PATH}", "HOME=/root", *env, *args]
        return ["nsenter", f"--target={self.pid}", "--mount", "--pid", "--", *inner]


class Podman:
    """podman 5 from the cached trixie root (see ChrootNamespace): containers started by it stop
    when it closes. Host folders in `shared` appear at the same path inside, so
    `-v /host/path:/in/container` and the build context work as on the host."""

    def __init__(self, cache_dir: Path, shared: Sequence[Path] = ()):
        self.home = Path(cache_dir) / "image"
        self.root = self.home / f"podman-{PODMAN_SUITE}"
        self.storage = self.home / "storage"
        self.namespace = ChrootNamespace(self.root, shared, {"/var/lib/containers/storage": self.storage})
        self._lock: int | None = None

    def __enter__(self) -> Podman:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        make_root(self.root, PODMAN_SUITE, PODMAN_PACKAGES)
        self._write_config()
        self.storage.mkdir(parents=True, exist_ok=True)
        # One namespace at a time on the storage: each has a fresh /run, and podman, finding its
        # runtime state gone, takes it for a reboot and marks the other's containers exited.
        self._lock = os.open(self.home / "podman.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another podman on {self.storage} to finish")
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.namespace.start()

    def stop(self) -> None:
        self.namespace.stop()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _write_config(self) -> None:
        """podman on this machine: cgroupfs (cgroup v1, no systemd), runc, file events, and
        containers' ulimits no higher than the machine's hard limits (runc may not raise them)."""
        limits = []
        for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
            hard = resource.getrlimit(which)[1]
            if hard != resource.RLIM_INFINITY:
                limits.append(f'"{name}={hard}:{hard}"')
        conf = self.root / "etc" / "containers" / "containers.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(
            "[containers]\n"
            f"default_ulimits = [{', '.join(limits)}]\n"
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            'runtime = "runc"\n'
        )

    def command(self, *args: str) -> list[str]:
        env = ["TMPDIR=/var/tmp", "PODMAN_IGNORE_CGROUPSV1_WARNING=1"]
        return self.namespace.command("podman", "--storage-driver=overlay", *args, env=env)

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        result = subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-30:])
            raise ImageError(f"podman {' '.join(args[:3])} failed (exit {result.returncode}):\n{tail}")
        return result

    def popen(self, *args: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(*args), **kwargs)

    def image_exists(self, image: str) -> bool:
        return self.run("image", "exists", image, check=False).returncode == 0

    def ensure_base(self, image: str) -> None:
        """The Dockerfile's base where it cannot be pulled: a bookworm stand-in under its name."""
        name = qualified(image)
        if self.image_exists(name):
            return
        tarball = make_root(self.home / f"base-{BASE_SUITE}.tar", BASE_SUITE, BASE_PACKAGES, _trust_hooks())
        with timed(f"import the {BASE_SUITE} stand-in as {name}"):
            subprocess.run(
                self.command("import", "--change", f"ENV PATH={_PATH}", "--change", 'CMD ["python3"]', "-", name),
                stdin=tarball.open("rb"),
                capture_output=True,
                check=True,
                timeout=600,
            )

    def _image_id(self, image: str) -> str:
        found = self.run("image", "inspect", "--format={{.Id}}", image, check=False)
        return found.stdout.strip() if found.returncode == 0 else ""

    def build(self, tag: str, context: Path = ROOT, dockerfile: Path = DOCKERFILE) -> None:
        for base in base_images(dockerfile):
            self.ensure_base(base)
        previous = self._image_id(tag)
        with timed(f"podman build -t {tag}"):
            result = subprocess.run(
                self.command(
                    "build",
                    # Docker's image format: OCI's has no HEALTHCHECK, which podman would drop.
                    "--format=docker",
                    "--pull=never",
                    "--network=host",
                    "--jobs=1",
                    "--layers",
                    f"--file={dockerfile}",
                    f"--tag={tag}",
                    str(context),
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=1800,
            )
        if result.returncode != 0:
            tail = "\n".join(result.stdout.strip().splitlines()[-40:])
            raise ImageError(f"podman build of {dockerfile} failed (exit {result.returncode}):\n{tail}")
        # The image this tag named before: each rebuild would leave one (a few GB) behind. Only that
        # one: a prune would also drop the builder stage's image, the cache of the next build.
        if previous and previous != self._image_id(tag):
            self.run("rmi", previous, check=False)

    def save(self, image: str, archive: Path) -> Path:
        """The image as an OCI archive (what `ctr images import` reads)."""
        with timed(f"podman save {image}"):
            self.run("save", "--format=oci-archive", f"--output={archive}", image, timeout=900)
        return archive


def build_image(cache_dir: Path, tag: str = DEFAULT_TAG) -> None:
    with Podman(cache_dir, shared=[ROOT]) as podman:
        podman.build(tag)


def main(argv: Sequence[str] | None = None) -> int:
    from app.settings import load_settings

    parser = argparse.ArgumentParser(prog="python -m app.local.image", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"image name (default {DEFAULT_TAG})")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("image: building needs root (mount and PID namespaces, chroot)", file=sys.stderr)
        return 1
    start = time.monotonic()
    try:
        build_image(Path(load_settings().cache_dir), args.tag)
    except ImageError as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 1
    log(f"{args.tag} built in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
