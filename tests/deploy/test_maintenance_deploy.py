"""Table maintenance in the deployment: on by default in both modes (the service between batches;
in kubernetes mode also the chart's CronJob, the two sharing the table's lease); the CronJob runs
`geoingest table maintain` in a locked-down pod that no ingest selector picks, with the service's
settings; the chart refuses a CronJob that could not reach the table; the dashboard shows what
maintenance does."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from app.cli import _parser
from app.settings import Settings
from tests.deploy.conftest import CHART, Helm
from tests.deploy.test_dashboard import DASHBOARD, panel_with
from tests.deploy.test_helm import (  # noqa: F401  (the render fixture)
    CI_FILES,
    KUBERNETES_CASE,
    NAMESPACE,
    RELEASE,
    SERVICE_UID,
    config_map,
    kind,
    one,
    render,
    rendered_notes,
    settings_of,
    values_of,
)

yaml = pytest.importorskip("yaml")

CRONJOB_CASE = "maintenance-cronjob-values.yaml"


def cron_job(docs) -> dict:
    return one(docs, "CronJob", f"{RELEASE}-geoingest-maintenance")


def test_a_ci_case_runs_maintenance_as_a_cron_job():
    assert CRONJOB_CASE in CI_FILES


# Every maintenance_* setting of the service, which the chart's config must carry as well.
MAINTENANCE_SETTINGS = {f.name: f.default for f in dataclasses.fields(Settings) if f.name.startswith("maintenance_")}
SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def rendered_toml(docs) -> dict:
    return tomllib.loads(config_map(docs)["data"]["settings.toml"])


def test_the_charts_maintenance_config_is_the_services_defaults():
    """Written out in values.yaml (not left to the service's defaults) so that `helm show values`
    documents them, and equal to them so that the chart and `geoingest run` maintain alike."""
    config = values_of("(chart defaults)")["config"]
    assert {k: v for k, v in config.items() if k.startswith("maintenance_")} == MAINTENANCE_SETTINGS
    schema = SCHEMA["properties"]["config"]["properties"]
    assert MAINTENANCE_SETTINGS.keys() <= schema.keys()
    for name in ("maintenance_interval_commits", "maintenance_max_snapshots"):
        assert schema[name] == {**schema[name], "type": "integer", "minimum": 0}, "0 turns it off"
    assert schema["maintenance_lease_s"]["minimum"] == 1, "a lease of no time would guard nothing"


def test_local_mode_maintains_its_own_table_by_default_and_makes_no_cron_job(render, tmp_path):
    docs = render("(chart defaults)")
    toml = rendered_toml(docs)
    assert {k: v for k, v in toml.items() if k.startswith("maintenance_")} == MAINTENANCE_SETTINGS
    assert toml["maintenance_mode"] == "beside"
    assert (toml["maintenance_interval_commits"], toml["maintenance_max_snapshots"], toml["maintenance_lease_s"]) == (
        10,
        100,
        900,
    )
    settings, _ = settings_of(docs, tmp_path)
    assert settings.maintenance_mode == "beside"
    # auto: the service's own maintenance covers its one pod (and a job could not reach this SQLite catalog).
    assert kind(docs, "CronJob") == []


def test_kubernetes_mode_runs_the_cron_job_beside_the_services_maintenance_by_default(render, tmp_path):
    assert values_of(KUBERNETES_CASE)["maintenance"]["cronJob"]["enabled"] == "auto", "the chart's default"
    docs = render(KUBERNETES_CASE)
    job = cron_job(docs)
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    (container,) = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    args = _parser().parse_args(container["args"])
    assert (args.action, args.compact, args.expire, args.orphans) == ("maintain", False, False, False), (
        "no step named: the job runs config.maintenance_steps"
    )
    settings, _ = settings_of(docs, tmp_path)
    assert settings.maintenance_mode == "beside", "the lease lets both maintain"


@pytest.mark.parametrize(
    "case, sets",
    [
        (KUBERNETES_CASE, ("maintenance.cronJob.enabled=false",)),
        # Local mode, even with a PostgreSQL catalog and a bucket a job could reach.
        ("monitoring-secrets-values.yaml", ()),
        # auto leaves a SQLite catalog on the driver's volume to the service's own maintenance.
        ("(chart defaults)", ("spark.mode=kubernetes", "config.catalog.warehouse=s3://lake/warehouse")),
        # A secret without a URI key leaves the SQLite URI as it is.
        (
            "(chart defaults)",
            (
                "spark.mode=kubernetes",
                "config.catalog.warehouse=s3://lake/warehouse",
                "secrets.catalog.existingSecret=iceberg-catalog",
                "secrets.catalog.uriKey=",
                "secrets.catalog.tokenKey=token",
            ),
        ),
    ],
)
def test_no_cron_job_when_turned_off_or_when_auto_finds_the_table_out_of_its_reach(render, case, sets):
    assert kind(render(case, *sets), "CronJob") == []


def test_auto_makes_the_cron_job_for_a_sqlite_uri_a_secret_replaces(render):
    docs = render(
        "(chart defaults)",
        "spark.mode=kubernetes",
        "config.catalog.warehouse=s3://lake/warehouse",
        "secrets.catalog.existingSecret=iceberg-catalog",
    )
    cron_job(docs)


def test_maintenance_mode_off_is_accepted(helm: Helm, render, tmp_path):
    lint = helm.run("lint", str(CHART), "--strict", "--set", "config.maintenance_mode=off", check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = render("(chart defaults)", "config.maintenance_mode=off")
    assert rendered_toml(docs)["maintenance_mode"] == "off"
    settings, _ = settings_of(docs, tmp_path)
    assert settings.maintenance_mode == "off"


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
        # Where auto would quietly make none, an explicit true says why.
        (
            "maintenance.cronJob.enabled=true,spark.mode=kubernetes,config.catalog.warehouse=s3://lake/warehouse",
            "SQLite catalog lives on the ingest pod's volume",
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
        ("maintenance.cronJob.enabled=sometimes", "cronJob/enabled"),
        ("config.maintenance_interval_commits=-1", "maintenance_interval_commits"),
        ("config.maintenance_max_snapshots=-1", "maintenance_max_snapshots"),
        ("config.maintenance_lease_s=0", "maintenance_lease_s"),
    ],
)
def test_the_schema_rejects_bad_maintenance_values(helm: Helm, bad: str, why: str):
    lint = helm.run("lint", str(CHART), "--set", bad, check=False)
    assert lint.returncode != 0 and why in lint.stdout + lint.stderr, lint.stdout + lint.stderr


@pytest.mark.parametrize(
    "case, sets, says",
    [
        ("(chart defaults)", (), "Table maintenance: the service itself (beside)."),
        (KUBERNETES_CASE, (), "they share the table's maintenance lease"),
        ("(chart defaults)", ("config.maintenance_mode=off",), "WARNING: nothing maintains the table"),
    ],
)
def test_the_notes_say_who_maintains_the_table(helm: Helm, tmp_path, case, sets, says):
    notes = rendered_notes(helm, tmp_path, case, sets)
    assert says in notes, notes


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
