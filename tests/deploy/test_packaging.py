"""The project installs as `make setup` installs it, into a fresh virtualenv, without a warning."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_license_is_an_spdx_expression():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"


def test_an_editable_install_into_a_fresh_virtualenv_prints_no_warning(tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # As `make setup` does: a current pip, which shows the build backend's warnings (older ones hide them).
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True, timeout=600
    )
    # As the Makefile installs (quiet, editable); the dependencies are this suite's own, not the subject.
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--editable", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    noise = [line for line in output.splitlines() if "warning" in line.lower() or "!!" in line]
    assert noise == [], output
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.util as u; print(u.find_spec('app.cli').origin)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(listed.stdout.strip()) == ROOT / "app" / "cli.py", "the editable install points at the tree"
