"""Table maintenance in the deployment: the chart's CronJob runs `geoingest table maintain` in a
locked-down pod that no ingest selector picks, with the service's settings; the chart refuses a
CronJob that could not reach the table; the dashboard shows what maintenance does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import _parser
from tests.deploy.conftest import CHART, Helm
from tests.deploy.test_dashboard import DASHBOARD, panel_with
from tests.deploy.test_helm import (  # noqa: F401  (the render fixture)
    CI_FILES,
    RELEASE,
    SERVICE_UID,
    config_map,
    kind,
    one,
    render,
    settings_of,
)

CRONJOB_CASE = "maintenance-cronjob-values.yaml"


def cron_job(docs) -> dict:
    return one(docs, "CronJob", f"{RELEASE}-geoingest-maintenance")


def test_a_ci_case_runs_maintenance_as_a_cron_job():
    assert CRONJOB_CASE in CI_FILES


def test_no_cron_job_by_default(render):
    assert kind(render("(chart defaults)"), "CronJob") == []


def test_the_cron_job_runs_table_maintain_with_the_services_settings(render, tmp_path):
    docs = render(CRONJOB_CASE)
    job = cron_job(docs)
    spec = job["spec"]
    assert spec["schedule"] == "17 * * * *"
    assert spec["concurrencyPolicy"] == "Forbid", "two runs would only race each other's commits"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"] == ["geoingest"]
    args = _parser().parse_args(container["args"])
    assert (args.action, args.contract, args.compact, args.expire, args.orphans) == (
        "maintain",
        "/etc/geoingest/contract.json",
        True,
        True,
        False,
    )
    # The same settings file and secrets as the ingest pod.
    env = {e["name"]: e for e in container["env"]}
    assert env["GEOINGEST_CONFIG"]["value"] == "/etc/geoingest/settings.toml"
    assert env["GEOINGEST_CATALOG__URI"]["valueFrom"]["secretKeyRef"] == {
        "name": "iceberg-catalog",
        "key": "postgres-uri",
    }
    settings, _ = settings_of(docs, tmp_path)
    assert (settings.maintenance_mode, settings.maintenance_min_file_age_s, settings.maintenance_keep_snapshots) == (
        "off",
        1800,
        50,
    )
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == config_map(docs)["metadata"]["name"]


def test_the_cron_job_pod_is_locked_down_and_no_ingest_selector_picks_it(render):
    docs = render(CRONJOB_CASE)
    template = cron_job(docs)["spec"]["jobTemplate"]["spec"]["template"]
    pod = template["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == SERVICE_UID
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert {"/scratch", "/tmp", "/etc/geoingest"} <= set(mounts)
    assert container["resources"]["limits"]["memory"]
    labels = template["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "maintenance"
    for selecting in kind(docs, "Service") + kind(docs, "PodDisruptionBudget"):
        selector = selecting["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert not selector.items() <= labels.items(), selecting["metadata"]["name"]


@pytest.mark.parametrize(
    "bad, why",
    [
        ("maintenance.cronJob.enabled=true", "SQLite catalog lives on the ingest pod's volume"),
        (
            "maintenance.cronJob.enabled=true,config.catalog.uri=postgresql+psycopg2://db/iceberg",
            "warehouse is a local path",
        ),
    ],
)
def test_the_chart_refuses_a_cron_job_that_cannot_reach_the_table(helm: Helm, bad: str, why: str):
    result = helm.run("template", RELEASE, str(CHART), "--set", bad, check=False)
    assert result.returncode != 0 and why in result.stderr, result.stderr


@pytest.mark.parametrize(
    "bad, why",
    [
        ("config.maintenance_mode=sometimes", "maintenance_mode"),
        ("config.maintenance_steps=compact\\,vacuum", "maintenance_steps"),
        ("maintenance.cronJob.steps={vacuum}", "steps"),
        ("maintenance.cronJob.schedule=hourly", "schedule"),
    ],
)
def test_the_schema_rejects_bad_maintenance_values(helm: Helm, bad: str, why: str):
    lint = helm.run("lint", str(CHART), "--set", bad, check=False)
    assert lint.returncode != 0 and why in lint.stdout + lint.stderr, lint.stdout + lint.stderr


def test_the_dashboard_shows_files_bytes_duration_and_conflicts_of_maintenance():
    dashboard = json.loads(Path(DASHBOARD).read_text())

    topics = {
        "files rewritten and written": (
            r"geoingest_maintenance_files_rewritten_total",
            r"geoingest_maintenance_files_written_total",
        ),
        "bytes": (r"geoingest_maintenance_bytes_rewritten_total", r"geoingest_maintenance_bytes_written_total"),
        "duration": (r"geoingest_maintenance_duration_seconds_bucket",),
        "conflicts": (r"geoingest_maintenance_conflicts_total",),
        "runs by outcome": (r"sum by \(outcome\) \(increase\(geoingest_maintenance_runs_total",),
        "expiry": (r"geoingest_maintenance_snapshots_expired_total", r"geoingest_maintenance_files_deleted_total"),
        "snapshots and manifests": (r"geoingest_table_snapshots", r"geoingest_table_data_manifests"),
    }
    missing = [topic for topic, patterns in topics.items() if panel_with(dashboard, *patterns) is None]
    assert not missing, f"no panel shows: {missing}"
