"""Every third-party module the service's packages (app/, streaming/) import is installed by the
service's own dependencies (pyproject's [project] dependencies and what they pull in), not by the
test extras alone: the image installs those only, and a module missing there stops the service at
start ("No module named 'fastavro'" once)."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {"app", "streaming", "schemas", "tests", "bench"}


def service_distributions() -> set[str]:
    """The service's dependencies and what each requires, with the extras asked for."""
    pending = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    found: set[tuple[str, frozenset[str]]] = set()
    while pending:
        requirement = pending.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in found:
            continue
        found.add(key)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            needed = Requirement(text)
            wanted = needed.marker is None or any(
                needed.marker.evaluate({"extra": e}) for e in requirement.extras or {""}
            )
            if wanted:
                pending.append(needed)
    return {name for name, _ in found}


def imported_modules() -> dict[str, str]:
    """Top-level module -> a file that imports it, over app/ and streaming/."""
    out: dict[str, str] = {}
    for path in sorted([*ROOT.glob("app/**/*.py"), *ROOT.glob("streaming/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                out.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return out


def test_every_module_the_service_imports_comes_with_its_own_dependencies() -> None:
    distributions = metadata.packages_distributions()
    allowed = service_distributions()
    missing = []
    for module, where in imported_modules().items():
        if module in FIRST_PARTY or module in sys.stdlib_module_names or module == "__future__":
            continue
        owners = {canonicalize_name(d) for d in distributions.get(module, [])}
        if not owners & allowed:
            missing.append(f"{module} (imported by {where}; installed by {sorted(owners) or 'nothing'})")
    assert not missing, "modules the image would not have:\n" + "\n".join(missing)


# -- the lock files -------------------------------------------------------------------------------
LOCKS = {"test": ROOT / "requirements" / "test.txt", "service": ROOT / "requirements" / "service.txt"}


def pins(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of every requirement of a lock file that applies to this Python."""
    out: dict[str, tuple[str, list[str]]] = {}
    for entry in lock.read_text().replace("\\\n", " ").splitlines():
        text = entry.split("#", 1)[0].strip()
        if not text:
            continue
        spec, *options = text.split(" --hash=")
        requirement = Requirement(spec)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        (pinned,) = requirement.specifier
        assert pinned.operator == "==", f"{lock.name}: {spec} is not pinned"
        out[canonicalize_name(requirement.name)] = (pinned.version, [o.strip() for o in options])
    return out


def test_the_locks_pin_every_dependency_within_pyprojects_ranges_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {
        "service": project["dependencies"],
        "test": [*project["dependencies"], *project["optional-dependencies"]["test"]],
    }
    for kind, lock in LOCKS.items():
        pinned = pins(lock)
        assert all(hashes and all(h.startswith("sha256:") for h in hashes) for _, hashes in pinned.values()), lock
        for text in wanted[kind]:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate():
                continue
            name = canonicalize_name(requirement.name)
            assert name in pinned, f"{lock.name} lacks {name}: run make lock"
            assert requirement.specifier.contains(pinned[name][0], prereleases=True), (
                f"{lock.name} pins {name}=={pinned[name][0]}, outside pyproject's {requirement.specifier}: run make lock"
            )
    service, test = pins(LOCKS["service"]), pins(LOCKS["test"])
    assert {n: v for n, (v, _) in service.items()} == {n: test[n][0] for n in service}, (
        "the image's versions are the tests'"
    )


def test_this_environment_holds_exactly_the_locked_versions() -> None:
    """`make setup` installs from the lock: what the tests run with is what the lock says."""
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    drifted = [
        f"{n}: {installed.get(n)} installed, {v} locked"
        for n, (v, _) in pins(LOCKS["test"]).items()
        if installed.get(n) != v
    ]
    assert not drifted, "\n".join(drifted)
