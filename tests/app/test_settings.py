"""Settings: defaults < TOML file < environment, typed, frozen, secrets masked when shown.

Every test passes `env=` so the real environment never leaks in.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from app.settings import Settings, SettingsError, load_settings

JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="svc" password="hunter2";'


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "geoingest.toml"
    path.write_text(text)
    return path


def test_defaults():
    s = load_settings(env={})
    assert s.bootstrap_servers == "127.0.0.1:9092"
    assert s.topic == "geo-events"
    assert s.dead_letter_topic == "geo-events.dlq"
    assert s.starting_offsets == "earliest"
    assert s.max_offsets_per_trigger == 1_000_000
    assert s.max_message_bytes == 1024 * 1024 and s.max_vertices == 100_000
    assert s.kafka == {} and s.spark == {}
    assert s.catalog["type"] == "sql"
    assert s.catalog["uri"].startswith("sqlite:///") and s.catalog["uri"].endswith("catalog.db")
    assert s.catalog["warehouse"].startswith("file://")
    assert Path(s.checkpoint_location).is_absolute()
    assert s.writer_id == "" and s.metrics_port == 9108
    assert s.cache_dir.endswith("geoingest")


def test_settings_are_frozen():
    s = load_settings(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.topic = "other"  # type: ignore[misc]


def test_values_come_from_the_toml_file(tmp_path):
    path = write_toml(
        tmp_path,
        """
topic = "positions"
max_vertices = 5000
starting_offsets = "latest"

[kafka]
"security.protocol" = "SASL_SSL"

[spark]
"spark.sql.shuffle.partitions" = 8
""",
    )
    s = load_settings(path, env={})
    assert s.topic == "positions"
    assert s.max_vertices == 5000
    assert s.starting_offsets == "latest"
    assert s.kafka == {"security.protocol": "SASL_SSL"}
    assert s.spark == {"spark.sql.shuffle.partitions": "8"}, "map values are strings"
    assert s.bootstrap_servers == "127.0.0.1:9092", "what the file leaves out keeps its default"


def test_config_file_can_be_named_in_the_environment(tmp_path):
    path = write_toml(tmp_path, 'topic = "from-file"\n')
    assert load_settings(env={"GEOINGEST_CONFIG": str(path)}).topic == "from-file"


def test_environment_overrides_the_file(tmp_path):
    path = write_toml(tmp_path, 'topic = "from-file"\nmax_vertices = 5000\n[kafka]\n"security.protocol" = "SASL_SSL"\n')
    s = load_settings(
        path,
        env={
            "GEOINGEST_TOPIC": "from-env",
            "GEOINGEST_MAX_VERTICES": "7",
            "GEOINGEST_KAFKA__SASL_MECHANISM": "PLAIN",
            "OTHER_TOPIC": "ignored",
        },
    )
    assert s.topic == "from-env"
    assert s.max_vertices == 7, "env strings are typed like the default"
    assert s.kafka == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "nested keys merge"


def test_keyword_overrides_win_over_environment():
    s = load_settings(env={"GEOINGEST_TOPIC": "from-env"}, topic="from-cli", writer_id=None)
    assert s.topic == "from-cli" and s.writer_id == ""


def test_nested_env_becomes_a_kafka_option_and_is_masked():
    s = load_settings(env={"GEOINGEST_KAFKA__SASL_JAAS_CONFIG": JAAS})
    assert s.kafka == {"sasl.jaas.config": JAAS}, "the real value is there for the Kafka client"
    assert s.shown()["kafka"]["sasl.jaas.config"] == "***"
    assert "hunter2" not in repr(s)
    assert "hunter2" not in str(s)
    assert "sasl.jaas.config" in repr(s)


@pytest.mark.parametrize("key", ["ssl.key.password", "ssl.truststore.location", "sasl.oauthbearer.token"])
def test_other_secret_looking_kafka_options_are_masked(key):
    s = load_settings(env={}, kafka={key: "s3cr3t"})
    assert s.shown()["kafka"][key] == "***"
    assert "s3cr3t" not in repr(s)


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("postgresql://user:pw@host/db", "postgresql://user:***@host/db"),
        (
            "postgresql+psycopg2://user:p@ss@db.example:5432/iceberg?sslmode=require",
            "postgresql+psycopg2://user:***@db.example:5432/iceberg?sslmode=require",
        ),
        # A user part alone may be a token (https://TOKEN@host): masked too.
        ("postgresql://user@host/db", "postgresql://***@host/db"),
        ("sqlite:////tmp/catalog.db", "sqlite:////tmp/catalog.db"),
    ],
)
def test_catalog_uri_password_is_masked(uri, shown):
    s = load_settings(env={"GEOINGEST_CATALOG__URI": uri})
    assert s.catalog["uri"] == uri
    assert s.shown()["catalog"]["uri"] == shown
    assert shown in repr(s)
    if shown != uri:
        assert uri not in repr(s)


def test_catalog_secret_keys_are_masked_and_others_shown(tmp_path):
    path = write_toml(
        tmp_path, '[catalog]\ntype = "rest"\n"s3.secret-access-key" = "abc123"\n"s3.access-key-id" = "AKIA"\n'
    )
    shown = load_settings(path, env={}).shown()["catalog"]
    assert shown["s3.secret-access-key"] == "***"
    assert shown["s3.access-key-id"] == "AKIA" and shown["type"] == "rest"


@pytest.mark.parametrize("env", [{"GEOINGEST_MAX_VERTICES": "many"}, {"GEOINGEST_METRICS_PORT": "9108.5"}])
def test_a_wrong_int_in_the_environment_names_the_setting(env):
    name = next(iter(env)).removeprefix("GEOINGEST_").lower()
    with pytest.raises(SettingsError, match=rf"^{name}: expected a whole number"):
        load_settings(env=env)


def test_a_wrong_int_in_the_file_names_the_setting(tmp_path):
    path = write_toml(tmp_path, 'max_offsets_per_trigger = "lots"\n')
    with pytest.raises(SettingsError, match=r"^max_offsets_per_trigger: expected a whole number, got 'lots'"):
        load_settings(path, env={})


def test_a_map_setting_given_a_plain_value_names_the_setting(tmp_path):
    path = write_toml(tmp_path, 'kafka = "sasl"\n')
    with pytest.raises(SettingsError, match="^kafka: expected a table"):
        load_settings(path, env={})


def test_an_unknown_key_in_the_file_is_an_error(tmp_path):
    path = write_toml(tmp_path, 'topik = "typo"\n')
    with pytest.raises(SettingsError, match="topik"):
        load_settings(path, env={})


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (
            "GEOINGEST_BOOTSTRAP_SERVER",
            "GEOINGEST_BOOTSTRAP_SERVER: not a geoingest setting; did you mean GEOINGEST_BOOTSTRAP_SERVERS?",
        ),
        ("GEOINGEST_CATALOG_NAMES", "did you mean GEOINGEST_CATALOG_NAME?"),
        ("GEOINGEST_NOT_A_SETTING", "GEOINGEST_NOT_A_SETTING: not a geoingest setting; docs/settings.md lists them"),
    ],
)
def test_an_unknown_environment_variable_is_refused_with_the_nearest_setting(key, message):
    # One letter short used to leave the default broker in place without a word.
    with pytest.raises(SettingsError) as info:
        load_settings(env={key: "x"})
    assert message in str(info.value)


def test_variables_other_tools_read_are_not_refused():
    assert load_settings(env={"GEOINGEST_JAVA_HOME": "/opt/java", "GEOINGEST_CONFIG": ""}).topic == "geo-events"
    # Kubernetes' service links of a Service named geoingest, Docker's container links.
    links = {
        "GEOINGEST_SERVICE_HOST": "10.96.0.7",
        "GEOINGEST_SERVICE_PORT": "9108",
        "GEOINGEST_SERVICE_PORT_METRICS": "9108",
        "GEOINGEST_PORT": "tcp://10.96.0.7:9108",
        "GEOINGEST_PORT_9108_TCP": "tcp://10.96.0.7:9108",
        "GEOINGEST_PORT_9108_TCP_ADDR": "10.96.0.7",
        "GEOINGEST_NAME": "/web/geoingest",
        "GEOINGEST_ENV_TZ": "UTC",
    }
    assert load_settings(env=links).metrics_port == 9108


def test_a_catalog_key_reaches_pyiceberg_in_its_own_spelling():
    settings = load_settings(env={"GEOINGEST_CATALOG__PY_IO_IMPL": "pyiceberg.io.fsspec.FsspecFileIO"})
    assert settings.catalog["py-io-impl"] == "pyiceberg.io.fsspec.FsspecFileIO"


@pytest.mark.parametrize(
    ("setting", "key", "value"),
    [
        ("catalog", "adls.account-key", "c2VjcmV0"),
        ("catalog", "adls.connection-string", "DefaultEndpointsProtocol=https;AccountKey=c2VjcmV0"),
        ("catalog", "adls.sas-token.acct", "sv=2024&sig=c2VjcmV0"),
        ("catalog", "header.X-Api-Key", "c2VjcmV0"),
        ("catalog", "uri", "https://c2VjcmV0@catalog.example/api"),
        ("spark", "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net", "c2VjcmV0"),
        ("kafka", "sasl.jaas.config", '... password="c2VjcmV0";'),
    ],
)
def test_every_kind_of_secret_is_masked_where_settings_are_shown(setting, key, value):
    settings = load_settings(env={}, **{setting: {key: value}})
    assert "c2VjcmV0" not in repr(settings) and "c2VjcmV0" not in json.dumps(settings.shown())
    assert "c2VjcmV0" in json.dumps(dataclasses.asdict(settings)), "the value itself is kept for its consumer"


def test_missing_or_broken_file_names_the_path(tmp_path):
    missing = tmp_path / "absent.toml"
    with pytest.raises(SettingsError, match="not found") as info:
        load_settings(missing, env={})
    assert str(missing) in str(info.value)
    broken = write_toml(tmp_path, "topic = \n")
    with pytest.raises(SettingsError, match="not valid TOML") as info:
        load_settings(broken, env={})
    assert str(broken) in str(info.value)


def test_checkpoint_location_is_per_table():
    a = load_settings(env={"GEOINGEST_CHECKPOINT_LOCATION": "/ckpt/a/"})
    assert a.checkpoint_for("demo.events") == "/ckpt/a/demo.events"


def test_dead_letter_topic_defaults_to_topic_dot_dlq_and_can_be_set():
    assert load_settings(env={"GEOINGEST_TOPIC": "positions"}).dead_letter_topic == "positions.dlq"
    assert load_settings(env={"GEOINGEST_DLQ_TOPIC": "rejects"}).dead_letter_topic == "rejects"


def test_settings_can_be_built_directly():
    assert Settings(topic="t").dead_letter_topic == "t.dlq"


# -- bugs found while writing these tests --------------------------------------------------------------
@pytest.mark.parametrize("line", ["max_vertices = 1.5", "metrics_port = true"])
def test_a_float_or_boolean_for_an_int_setting_is_an_error(tmp_path, line):
    path = write_toml(tmp_path, line + "\n")
    with pytest.raises(SettingsError, match=line.split(" ")[0]):
        load_settings(path, env={})


@pytest.mark.parametrize("key", ["GEOINGEST_TOPIC__NAME", "GEOINGEST_METRICS_PORT__X"])
def test_a_nested_variable_on_a_scalar_setting_names_it(key):
    with pytest.raises(SettingsError, match=key.removeprefix("GEOINGEST_").split("__")[0].lower()):
        load_settings(env={key: "x"})


def test_a_spark_key_spelled_as_spark_spells_it_keeps_its_case():
    s = load_settings(
        env={
            "GEOINGEST_SPARK__spark.executorEnv.GEO_TZ": "UTC",
            "GEOINGEST_SPARK__spark.sql.streaming.stopGracefullyOnShutdown": "false",
            "GEOINGEST_SPARK__SPARK_EXECUTOR_MEMORY": "3g",
        }
    )
    assert s.spark == {
        "spark.executorEnv.GEO_TZ": "UTC",
        "spark.sql.streaming.stopGracefullyOnShutdown": "false",
        "spark.executor.memory": "3g",
    }


def test_a_whole_map_as_one_json_variable_merges_with_the_file(tmp_path):
    path = write_toml(tmp_path, '[catalog]\ntype = "rest"\nuri = "http://catalog:8181"\n')
    s = load_settings(
        path,
        env={
            "GEOINGEST_CATALOG": '{"s3.endpoint": "http://127.0.0.1:9000", "s3.region": "eu"}',
            "GEOINGEST_SPARK": '{"spark.executorEnv.AWS_REGION": "eu"}',
        },
    )
    assert s.catalog == {
        "type": "rest",
        "uri": "http://catalog:8181",
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.region": "eu",
    }
    assert s.spark == {"spark.executorEnv.AWS_REGION": "eu"}


def test_catalog_keys_follow_pyicebergs_environment_rule():
    s = load_settings(
        env={
            "GEOINGEST_CATALOG__S3__ACCESS_KEY_ID": "AKIA",
            "GEOINGEST_CATALOG__S3__PATH_STYLE_ACCESS": "true",
            "GEOINGEST_CATALOG__s3.secret-access-key": "shh",
        }
    )
    assert {k: s.catalog[k] for k in ("s3.access-key-id", "s3.path-style-access", "s3.secret-access-key")} == {
        "s3.access-key-id": "AKIA",
        "s3.path-style-access": "true",
        "s3.secret-access-key": "shh",
    }
    assert "shh" not in repr(s)


@pytest.mark.parametrize("raw", ["not json", '["a", "b"]'])
def test_a_map_variable_that_is_no_json_object_names_the_variable(raw):
    with pytest.raises(SettingsError, match="GEOINGEST_SPARK: expected a JSON object"):
        load_settings(env={"GEOINGEST_SPARK": raw})


@pytest.mark.parametrize(
    ("variable", "written", "meant"),
    [
        # What a manifest's `env:` list tends to hold: the property upper-cased, dots kept.
        ("GEOINGEST_CATALOG__S3.ENDPOINT", "S3.ENDPOINT", "s3.endpoint"),
        ("GEOINGEST_CATALOG__S3.Region", "S3.Region", "s3.region"),
        ("GEOINGEST_KAFKA__SASL.MECHANISM", "SASL.MECHANISM", "sasl.mechanism"),
        ("GEOINGEST_KAFKA__Security.Protocol", "Security.Protocol", "security.protocol"),
        ("GEOINGEST_SPARK__SPARK.EXECUTOR.MEMORY", "SPARK.EXECUTOR.MEMORY", "spark.executor.memory"),
        (
            "GEOINGEST_SPARK__spark.kubernetes.executor.podtemplatefile",
            "spark.kubernetes.executor.podtemplatefile",
            "spark.kubernetes.executor.podTemplateFile",
        ),
        ("GEOINGEST_SPARK__SPARK.EXECUTORENV.TZ", "SPARK.EXECUTORENV.TZ", "spark.executorEnv.TZ"),
    ],
)
def test_a_known_key_in_another_case_is_an_error_naming_both_spellings(variable, written, meant):
    with pytest.raises(SettingsError) as info:
        load_settings(env={variable: "x"})
    message = str(info.value)
    assert message.startswith(f"{variable}: ")
    assert repr(written) in message and repr(meant) in message
    assert "\n" not in message


def test_a_known_key_in_another_case_in_the_file_or_a_json_variable_names_where_it_is(tmp_path):
    path = write_toml(tmp_path, '[catalog]\ntype = "rest"\n"S3.ENDPOINT" = "http://127.0.0.1:9000"\n')
    with pytest.raises(SettingsError, match=rf"^{re.escape(str(path))} \[catalog\]: catalog key 'S3.ENDPOINT'"):
        load_settings(path, env={})
    with pytest.raises(SettingsError, match=r"^GEOINGEST_KAFKA: kafka key 'Bootstrap.Servers' is 'bootstrap.servers'"):
        load_settings(env={"GEOINGEST_KAFKA": '{"Bootstrap.Servers": "b:9092"}'})


def test_keys_in_their_own_case_and_unknown_keys_are_kept():
    s = load_settings(
        env={
            "GEOINGEST_CATALOG__s3.endpoint": "http://127.0.0.1:9000",
            "GEOINGEST_CATALOG__S3__REGION": "us-east-1",
            "GEOINGEST_CATALOG__header.X-Iceberg-Access-Delegation": "vended-credentials",
            "GEOINGEST_KAFKA__SASL_MECHANISM": "PLAIN",
            "GEOINGEST_SPARK__spark.executorEnv.tz": "UTC",
            "GEOINGEST_SPARK__spark.myCompany.Flag": "1",
        }
    )
    assert s.catalog["s3.endpoint"] == "http://127.0.0.1:9000"
    assert s.catalog["s3.region"] == "us-east-1"
    assert s.catalog["header.X-Iceberg-Access-Delegation"] == "vended-credentials"
    assert s.kafka == {"sasl.mechanism": "PLAIN"}
    assert s.spark == {"spark.executorEnv.tz": "UTC", "spark.myCompany.Flag": "1"}
