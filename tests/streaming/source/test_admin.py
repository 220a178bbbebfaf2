"""Java client options (as Spark's Kafka source takes them) translated for kafka-python."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from app.local.broker import LocalBroker
from streaming.source.admin import client_config, ensure_topic

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


def sasl_ssl(jaas: str, **extra: str) -> dict[str, str]:
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": jaas, **extra}


def test_shared_options_take_underscores_and_kafka_pythons_types() -> None:
    config = client_config(
        {
            "client.id": "geo",
            "max.poll.records": "500",
            "enable.auto.commit": "false",
            "acks": "all",
            "request.timeout.ms": "15000",
        }
    )
    assert config == {
        "client_id": "geo",
        "max_poll_records": 500,
        "enable_auto_commit": False,
        "acks": "all",
        "request_timeout_ms": 15000,
    }


def test_the_java_clients_spelling_of_unset_is_kafka_pythons_none() -> None:
    config = client_config({"compression.type": "none", "receive.buffer.bytes": "-1", "send.buffer.bytes": "131072"})
    assert config == {"compression_type": None, "receive_buffer_bytes": None, "send_buffer_bytes": 131072}
    assert client_config({"compression.type": "zstd"}) == {"compression_type": "zstd"}


def test_options_only_the_java_client_knows_are_left_out() -> None:
    options = {
        "interceptor.classes": "com.example.Interceptor",
        "sasl.login.refresh.buffer.seconds": "60",
        "client.id": "geo",
    }
    assert client_config(options) == {"client_id": "geo"}


def test_a_client_class_keeps_only_what_that_client_takes() -> None:
    options = {"max.poll.records": "500", "linger.ms": "5", "client.id": "geo"}
    assert client_config(options, KafkaAdminClient) == {"client_id": "geo"}
    assert client_config(options, KafkaConsumer) == {"max_poll_records": 500, "client_id": "geo"}
    assert client_config(options, KafkaProducer) == {"linger_ms": 5, "client_id": "geo"}


def test_a_word_for_a_boolean_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match=r"enable\.auto\.commit='yes please'"):
        client_config({"enable.auto.commit": "yes please"})


def test_scram_over_tls_with_a_pem_truststore() -> None:
    options = sasl_ssl(
        f'{SCRAM} required username="geoingest" password="s3cret";',
        **{"ssl.truststore.type": "PEM", "ssl.truststore.location": "/etc/geo/ca.pem"},
    )
    assert client_config(options) == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "geoingest",
        "sasl_plain_password": "s3cret",
        "ssl_cafile": "/etc/geo/ca.pem",
    }


def test_plain_login_module_and_sasl_plaintext() -> None:
    options = {
        "security.protocol": "sasl_plaintext",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": f"{PLAIN} required username=alice password=wonder-land;",
    }
    assert client_config(options) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "wonder-land",
    }


@pytest.mark.parametrize(
    ("written", "password"),
    [
        (r'"a\"b"', 'a"b'),
        (r'"back\\slash"', "back\\slash"),
        (r'"semi;colon = and spaces"', "semi;colon = and spaces"),
        (r"'single \' quoted'", "single ' quoted"),
        (r'"tab\tand octal \101"', "tab\tand octal A"),
        ('"ünïcode"', "ünïcode"),
    ],
)
def test_quoted_values_are_unescaped_as_the_java_client_reads_them(written: str, password: str) -> None:
    config = client_config(sasl_ssl(f'{SCRAM} required\n  username="u"\n  password={written};'))
    assert config["sasl_plain_password"] == password


def test_the_brokers_own_client_options_round_trip_whatever_the_password(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "kafka", tmp_path / "cache", secure_port=9093)
    password = 'a "quoted" \\ password; with = signs'
    config = client_config(broker.client_options(password=password))
    assert config["sasl_plain_username"] == broker.user
    assert config["sasl_plain_password"] == password
    assert config["ssl_cafile"] == str(broker.ca_file)


def test_a_sasl_protocol_without_a_mechanism_means_gssapi_as_in_java() -> None:
    options = {
        "security.protocol": "SASL_SSL",
        "sasl.kerberos.service.name": "kafka-prod",
        "sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true "
        'keyTab="/etc/geo/geo.keytab" principal="geo@EXAMPLE.COM";',
    }
    assert client_config(options) == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "GSSAPI",
        "sasl_kerberos_service_name": "kafka-prod",
    }


def test_a_login_module_kafka_python_cannot_use_is_refused() -> None:
    options = sasl_ssl("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;")
    with pytest.raises(ValueError, match=r"sasl\.jaas\.config.*OAuthBearerLoginModule"):
        client_config(options)


def test_a_shaded_login_module_is_recognised() -> None:
    options = sasl_ssl(
        'kafkashaded.org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";'
    )
    assert client_config(options)["sasl_plain_password"] == "p"


@pytest.mark.parametrize(
    ("jaas", "message"),
    [
        (f'{SCRAM} required username="u";', "no password"),
        (f"{SCRAM} required;", "no username and no password"),
        (f'{SCRAM} required username="u" password="hunter2"', "';' at the end"),
        (f'{SCRAM} mandatory username="u" password="hunter2";', "not a control flag"),
        (f'{SCRAM} required username="u" password hunter2;', "'=' after password, found a word"),
        (f'{SCRAM} required username="u" password="hunter2"; {PLAIN} required;', "exactly one login module"),
        (f'{SCRAM} required username="u" password=1hunter2;', "unexpected character at position"),
        (f'{SCRAM} required username="u" password="hunter2;', "unexpected character at position"),
    ],
)
def test_a_malformed_jaas_config_is_refused_without_showing_the_password(jaas: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"sasl\.jaas\.config") as raised:
        client_config(sasl_ssl(jaas))
    assert message in str(raised.value)
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    ("store_type", "shown"),
    [
        ({"ssl.truststore.type": "JKS"}, "JKS"),
        ({"ssl.truststore.type": "PKCS12"}, "PKCS12"),
        ({}, "JKS truststore (ssl.truststore.type, the Java default)"),
    ],
)
def test_a_truststore_kafka_python_cannot_read_is_refused(store_type: dict[str, str], shown: str) -> None:
    options = sasl_ssl(
        f'{SCRAM} required username="u" password="p";',
        **{"ssl.truststore.location": "/etc/geo/truststore.jks", "ssl.truststore.password": "x", **store_type},
    )
    with pytest.raises(ValueError, match=r"ssl\.truststore\.location") as raised:
        client_config(options)
    assert shown in str(raised.value)
    assert "ssl.truststore.type=PEM" in str(raised.value)


def test_a_pem_keystore_file_is_the_client_certificate() -> None:
    options = {
        "security.protocol": "SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": "/etc/geo/me.pem",
        "ssl.key.password": "key-secret",
        "ssl.keystore.password": "unused for PEM",
    }
    assert client_config(options) == {
        "security_protocol": "SSL",
        "ssl_certfile": "/etc/geo/me.pem",
        "ssl_password": "key-secret",
    }


def test_a_pkcs12_keystore_is_refused() -> None:
    options = {"security.protocol": "SSL", "ssl.keystore.type": "PKCS12", "ssl.keystore.location": "/etc/geo/me.p12"}
    with pytest.raises(ValueError, match=r"ssl\.keystore\.location: a PKCS12 keystore.*ssl\.keystore\.type=PEM"):
        client_config(options)


@pytest.mark.parametrize(
    "inline", ["ssl.truststore.certificates", "ssl.keystore.certificate.chain", "ssl.keystore.key"]
)
def test_pem_text_in_an_option_is_refused_naming_it(inline: str) -> None:
    options = {
        "security.protocol": "SSL",
        f"{inline.rsplit('.', 2)[0]}.type": "PEM",
        inline: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
    }
    with pytest.raises(ValueError, match=rf"kafka option {inline}: kafka-python reads .* from a file"):
        client_config(options)


@pytest.mark.parametrize(("algorithm", "check"), [("", False), ("https", True), ("HTTPS", True)])
def test_endpoint_identification_is_the_host_name_check(algorithm: str, check: bool) -> None:
    options = {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": algorithm}
    assert client_config(options) == {"security_protocol": "SSL", "ssl_check_hostname": check}


def test_an_unknown_endpoint_identification_is_refused() -> None:
    with pytest.raises(ValueError, match=r"ssl\.endpoint\.identification\.algorithm='ldaps'"):
        client_config({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "ldaps"})


def test_tls_options_do_not_matter_without_tls_as_in_java() -> None:
    options = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": f'{PLAIN} required username="u" password="p";',
        "ssl.truststore.location": "/etc/geo/truststore.jks",
        "ssl.endpoint.identification.algorithm": "",
    }
    config = client_config(options)
    assert not any(name.startswith("ssl_") for name in config)
    assert client_config({"sasl.jaas.config": "not even parsed", "ssl.truststore.location": "x.jks"}) == {}


def test_every_translated_option_is_one_each_kafka_python_client_takes() -> None:
    options = sasl_ssl(
        f'{SCRAM} required username="u" password="p";',
        **{
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": "/ca.pem",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": "/me.pem",
            "ssl.key.password": "k",
            "ssl.endpoint.identification.algorithm": "",
        },
    )
    config = client_config(options)
    assert set(config) == {
        "security_protocol",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "ssl_cafile",
        "ssl_certfile",
        "ssl_password",
        "ssl_check_hostname",
    }
    for client in (KafkaAdminClient, KafkaConsumer, KafkaProducer):
        assert set(config) <= set(client.DEFAULT_CONFIG), client.__name__


def test_ensure_topic_refuses_options_kafka_python_cannot_honour_before_connecting() -> None:
    options = {"security.protocol": "SSL", "ssl.truststore.location": "/etc/geo/truststore.jks"}
    with pytest.raises(ValueError, match=r"ssl\.truststore\.location"):
        ensure_topic("127.0.0.1:1", "geo-dlq", options)
