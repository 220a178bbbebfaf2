"""The Dockerfile, read statically (there is no Docker engine here): pinned base, non-root user,
entrypoint and health check, the Kafka connector tied to the installed pyspark, dependencies
from the service's lock file only, a read-only root filesystem's writable paths, and the build context."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest

import app.spark as app_spark
from app.settings import Settings, load_settings
from app.spark import kafka_connector_package

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
TEXT = DOCKERFILE.read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@dataclass
class Instruction:
    stage: int
    keyword: str
    args: str
    heredocs: list[str]


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and heredoc bodies (<<EOF ... EOF) set aside."""
    out: list[Instruction] = []
    lines = text.splitlines()
    stage = -1
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        keyword, _, args = line.strip().partition(" ")
        heredocs = []
        for delimiter in re.findall(r"<<-?['\"]?(\w+)['\"]?", args):
            body = []
            while i < len(lines) and lines[i] != delimiter:
                body.append(lines[i])
                i += 1
            i += 1
            heredocs.append("\n".join(body))
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(stage, keyword, args.strip(), heredocs))
    return out


INSTRUCTIONS = parse(TEXT)
FINAL = max(i.stage for i in INSTRUCTIONS)


def final(keyword: str) -> list[Instruction]:
    return [i for i in INSTRUCTIONS if i.stage == FINAL and i.keyword == keyword]


def env_of_final_stage() -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in final("ENV"):
        for token in shlex.split(instruction.args):
            key, _, value = token.partition("=")
            env[key] = value
    return env


def test_base_images_are_one_pinned_slim_python_311_release():
    bases = [i.args.split()[0] for i in INSTRUCTIONS if i.keyword == "FROM"]
    assert len(bases) >= 2, "multi-stage: a builder and a runtime"
    for base in bases:
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base), (
            f"{base}: pin an exact slim Python 3.11 release on bookworm (Debian 12 ships openjdk-17)"
        )
    assert len(set(bases)) == 1, f"builder and runtime on different bases: {bases}"
    assert " AS " in [i for i in INSTRUCTIONS if i.keyword == "FROM"][0].args.upper()


def test_runs_as_a_fixed_non_root_user_matching_the_chart():
    users = final("USER")
    assert users, "the runtime stage sets no USER"
    user = users[-1].args.split(":")[0]
    assert user not in ("root", "0")
    assert user == "10001"
    values = (ROOT / "helm" / "geoingest" / "values.yaml").read_text()
    assert re.search(r"^\s+runAsUser: 10001$", values, re.MULTILINE)
    run = " ".join(i.args for i in final("RUN"))
    assert "--uid 10001" in run, "the user exists in /etc/passwd (Hadoop's login module needs a name)"


def test_entrypoint_and_default_contract():
    entrypoint = json.loads(final("ENTRYPOINT")[-1].args)
    cmd = json.loads(final("CMD")[-1].args)
    assert entrypoint == ["geoingest", "run"]
    # A fresh catalog gets the demo table: the header's `docker run` works as written.
    assert cmd == ["--contract", "/opt/geoingest/schemas/demo_events.json", "--create-table"]
    assert any(i.args.split() == ["schemas", "/opt/geoingest/schemas"] for i in final("COPY"))
    assert (ROOT / "schemas" / "demo_events.json").is_file()
    script = PYPROJECT["project"]["scripts"]["geoingest"]
    assert script == "app.cli:main"


def test_healthcheck_asks_healthz_on_the_metrics_port_with_python():
    check = final("HEALTHCHECK")
    assert len(check) == 1
    args = check[0].args
    assert "/healthz" in args
    assert "python -c" in args and "urllib.request" in args, "no curl in a slim image: Python asks"
    assert "curl" not in args and "wget" not in args
    port = str(Settings().metrics_port)
    assert f"'{port}'" in args, "the default port of the check is the service's"
    exposed = {p for i in final("EXPOSE") for p in i.args.split()}
    assert port in exposed


def test_kafka_connector_is_derived_from_the_installed_pyspark():
    assert kafka_connector_package() == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"
    resolving = [doc for i in INSTRUCTIONS for doc in i.heredocs if "kafka_connector_jars" in doc]
    assert len(resolving) == 1, "one build step resolves the connector with the service's own code"
    snippet = resolving[0]
    compile(snippet, "Dockerfile:connector", "exec")
    assert "kafka_connector_package()" in snippet and "pyspark.__version__" in snippet
    assert "kafka_connector_jars(cache) == []" in snippet, "the build checks the service will resolve nothing"
    # No version of the connector written down anywhere else in the Dockerfile.
    for version in re.findall(r"spark-sql-kafka-0-10_2\.13[:-](\d[\w.]*)", TEXT):
        assert version == pyspark.__version__, f"connector {version} baked in, pyspark is {pyspark.__version__}"
    assert re.search(r"pyspark==\d", TEXT) is None


def test_python_dependencies_come_from_the_service_lock_with_hashes_only():
    """The image installs the versions the tests passed with (requirements/service.txt, compiled
    from pyproject.toml by `make lock`), each checked against its hash, and nothing else."""
    pip_installs = [
        m.group(1) for i in INSTRUCTIONS if i.keyword == "RUN" for m in re.finditer(r"pip install ([^&;]+)", i.args)
    ]
    assert pip_installs, "no pip install"
    allowed = {"--require-hashes", "--requirement", "requirements/service.txt", "--no-deps", ".", "--no-cache-dir"}
    for command in pip_installs:
        assert set(command.split()) <= allowed, f"pip install {command}: installs something the lock does not list"
    assert any("--require-hashes" in c and "requirements/service.txt" in c for c in pip_installs)
    assert "--no-deps ." in TEXT, "the project is installed, not in editable mode"
    names = [re.split(r"[\[<>=!~; ]", dep, maxsplit=1)[0].lower() for dep in PYPROJECT["project"]["dependencies"]]
    for name in names:
        assert re.search(rf"\b{re.escape(name)}\s*(==|>=|<=|~=)", TEXT, re.IGNORECASE) is None, (
            f"{name} is pinned in the Dockerfile too"
        )
    assert sorted(p.name for p in ROOT.glob("requirements*")) == ["requirements"], "one folder of lock files"


def test_runtime_has_debian_java_17_and_no_network_needs():
    run = " ".join(i.args for i in final("RUN"))
    assert "openjdk-17-jre-headless" in run
    env = env_of_final_stage()
    assert env["JAVA_HOME"] == "/usr/lib/jvm/java-17"
    assert env["GEOINGEST_JAVA_HOME"] == env["JAVA_HOME"]
    assert env["SPARK_HOME"].endswith("/site-packages/pyspark")


def test_a_connector_on_sparks_classpath_is_not_resolved_again(tmp_path, monkeypatch):
    # What the image holds: the connector among Spark's own jars. Then nothing is downloaded at
    # start (no network, no write to the read-only cache).
    jars = tmp_path / "pyspark" / "jars"
    jars.mkdir(parents=True)
    (jars / f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar").write_bytes(b"")
    monkeypatch.setattr(app_spark, "spark_home", lambda: str(tmp_path / "pyspark"))
    assert app_spark.kafka_connector_jars(tmp_path / "read-only-cache") == []
    assert not (tmp_path / "read-only-cache").exists()


def test_writable_paths_are_volumes_and_settings_read_the_image_environment(tmp_path):
    env = env_of_final_stage()
    writable = ("/scratch", "/tmp", "/data")
    assert env["HOME"].startswith(writable) and env["TMPDIR"].startswith(writable)
    workdirs = final("WORKDIR")
    assert workdirs and workdirs[-1].args.startswith(writable)
    settings = load_settings(env=env)
    assert settings.cache_dir == "/opt/geoingest/cache"
    assert settings.checkpoint_location.startswith("/data/")
    assert settings.spark["spark.local.dir"].startswith("/scratch/")
    run = " ".join(i.args for i in final("RUN"))
    for path in ("/scratch", "/data"):
        assert path in run and "chown 10001:10001" in run


def test_executor_launcher_is_built_into_the_image_where_the_chart_runs_it():
    scripts = [doc for i in INSTRUCTIONS for doc in i.heredocs if "spark-executor" in doc]
    assert len(scripts) == 1
    subprocess.run(["bash", "-n"], input=scripts[0], text=True, check=True)
    assert "KubernetesExecutorBackend" in scripts[0]
    template = (ROOT / "helm" / "geoingest" / "templates" / "executor-pod-template.yaml").read_text()
    assert '"/opt/geoingest/bin/spark-executor"' in template
    assert "/opt/geoingest/bin/spark-executor" in scripts[0]


def _dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents decides."""

    def regex(pattern: str) -> re.Pattern:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                out, i = out + pattern[i : end + 1], end + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return re.compile(out + "$")

    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = regex(raw.lstrip("!").rstrip("/"))
        if any(pattern.match(p) for p in prefixes):
            excluded = not negate
    return excluded


def test_dockerignore_sends_only_what_the_build_copies():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for instruction in INSTRUCTIONS:
        if instruction.keyword == "COPY" and "--from=" not in instruction.args:
            sources += instruction.args.split()[:-1]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not _dockerignore_excludes(patterns, source), f"{source} is copied but .dockerignore drops it"
        if (ROOT / source).is_dir():
            for file in (ROOT / source).rglob("*.py"):
                if "__pycache__" not in file.parts:
                    assert not _dockerignore_excludes(patterns, file.relative_to(ROOT).as_posix()), file
    for dropped in (
        ".venv/bin/python",
        ".git/HEAD",
        ".demo/catalog.db",
        ".cache/ivy/x.jar",
        "tests/conftest.py",
        "helm/geoingest/Chart.yaml",
        "app/__pycache__/cli.cpython-311.pyc",
        "bench/ingest.py",
    ):
        assert _dockerignore_excludes(patterns, dropped), f"{dropped} would be sent to the builder"


@pytest.mark.parametrize("script", ["connector", "executor"])
def test_build_scripts_parse(script):
    docs = [doc for i in INSTRUCTIONS for doc in i.heredocs]
    if script == "connector":
        compile(next(d for d in docs if "kafka_connector_package" in d), "connector", "exec")
    else:
        outer = next(d for d in docs if "cat > /opt/geoingest/bin/spark-executor" in d)
        subprocess.run(["bash", "-n"], input=outer, text=True, check=True)
