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
