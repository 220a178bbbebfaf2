"""The alert rules (helm/geoingest/alerts/geoingest.rules.yaml) checked and unit-tested by a real
promtool (Debian's prometheus package, app/local/prometheus.py): every rule parses, every alert fires
on the synthetic series of its trouble and stays quiet beside it (tests/deploy/alerts_test.yaml),
and every alert has a test and a line in docs/monitoring.md."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from app.local.prometheus import ensure_binaries
from tests.conftest import CACHE_DIR

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "helm" / "geoingest" / "alerts" / "geoingest.rules.yaml"
RULE_TESTS = Path(__file__).resolve().parent / "alerts_test.yaml"


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ensure_binaries(CACHE_DIR) / "promtool"


def alerts() -> set[str]:
    return {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}


def test_every_rule_passes_promtool_check(promtool: Path) -> None:
    done = subprocess.run([str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_each_alert_fires_on_its_trouble_and_stays_quiet_beside_it(promtool: Path) -> None:
    done = subprocess.run(
        [str(promtool), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert tested == alerts(), f"alerts without a test that makes them fire: {sorted(alerts() - tested)}"


def test_every_alert_says_what_to_do_in_the_docs() -> None:
    page = (ROOT / "docs" / "monitoring.md").read_text()
    assert not [name for name in sorted(alerts()) if f"`{name}`" not in page]
