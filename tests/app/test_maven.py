"""Jars from Maven Central alone: resolved once into the cache, without asking any other host."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.maven import _SETTINGS, ResolveError, _ivy_module, artifact_name, resolve, without_spark_jars


def test_settings_name_maven_central_as_the_only_repository():
    assert _SETTINGS.count("<ibiblio ") == 1
    assert 'root="https://repo1.maven.org/maven2/"' in _SETTINGS
    assert "spark-packages" not in _SETTINGS


@pytest.mark.parametrize(
    "jar, name",
    [
        ("kafka-clients-3.9.0.jar", "kafka-clients"),
        ("spark-sql-kafka-0-10_2.13-4.0.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("geotools-wrapper-1.8.0-33.1.jar", "geotools-wrapper"),
        ("snappy-java-1.1.10.7.jar", "snappy-java"),
    ],
)
def test_artifact_names_drop_the_version(jar, name):
    assert artifact_name(jar) == name


def test_jars_spark_ships_are_left_out():
    kept = without_spark_jars(
        [Path("org.apache.kafka_kafka-clients-3.9.0.jar"), Path("org.slf4j_slf4j-api-1.7.0.jar")]
    )  # Spark ships slf4j-api
    assert kept == [Path("org.apache.kafka_kafka-clients-3.9.0.jar")]


def test_coordinates_must_name_group_artifact_and_version():
    with pytest.raises(ResolveError, match="'org.example:thing'"):
        _ivy_module("x", ["org.example:thing"])


@pytest.mark.integration
def test_resolves_from_maven_central_once(tmp_path, capfd):
    jars = resolve(["org.apache.commons:commons-pool2:2.12.0"], tmp_path, "pool")
    assert [j.name for j in jars] == ["org.apache.commons_commons-pool2-2.12.0.jar"]
    assert jars[0].stat().st_size > 100_000
    again = resolve(["org.apache.commons:commons-pool2:2.12.0"], tmp_path, "pool")
    assert again == jars, "the second call reuses the cache"
    out = capfd.readouterr()
    assert "not found" not in out.out + out.err
