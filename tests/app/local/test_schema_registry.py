"""The local schema registry (Apicurio Registry, app/local/schema_registry.py) and the decoder's
client of it: schemas registered through the Confluent-compatible API, fetched and cached by id,
an unknown id and an unreachable registry told apart, Avro records decoded with the schema their
id names, a new optional field mid-stream included."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest

from app.local.process import free_port
from app.local.schema_registry import LocalSchemaRegistry
from app.settings import load_settings
from streaming.contract import parse_contract
from streaming.decode.decoder import REJECT_DETAIL, REJECT_REASON, DecodeOptions, Decoder
from streaming.decode.schema_registry import (
    RegistrySettings,
    RegistryUnavailable,
    SchemaRegistryClient,
    UnknownSchemaId,
)
from tests.streaming.decode.formats.test_avro import avro_bytes, contract, wire
from tests.streaming.decode.formats.test_protobuf import PING_PROTO, Ping
from tests.streaming.decode.test_decoder import kafka_batch

V1 = {
    "type": "record",
    "name": "Ping",
    "namespace": "geo",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "lon", "type": "double"},
        {"name": "lat", "type": "double"},
        {"name": "speed", "type": ["null", "double"], "default": None},
    ],
}
# The schema change: a new optional field, as a producer adds one (backward compatible).
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}


def register(
    registry_url: str, subject: str, schema: dict | str, schema_type: str = "AVRO", references: list | None = None
) -> int:
    """Registers a schema under a subject through the ccompat API; returns its id."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    body = {"schema": text, "schemaType": schema_type, **({"references": references} if references else {})}
    request = urllib.request.Request(
        f"{registry_url}/subjects/{urllib.parse.quote(subject, safe='')}/versions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(json.loads(response.read())["id"])


def get(registry_url: str, path: str) -> object:
    with urllib.request.urlopen(f"{registry_url}{path}", timeout=30) as response:
        return json.loads(response.read())


def test_a_schema_registered_through_the_ccompat_api_reads_back(schema_registry: LocalSchemaRegistry):
    schema_id = register(schema_registry.url, "pings-read-back-value", V1)
    assert json.loads(get(schema_registry.url, f"/schemas/ids/{schema_id}")["schema"]) == V1  # type: ignore[index]
    latest = get(schema_registry.url, "/subjects/pings-read-back-value/versions/latest")
    assert latest["id"] == schema_id and latest["version"] == 1  # type: ignore[index]
    assert "pings-read-back-value" in get(schema_registry.url, "/subjects")  # type: ignore[operator]


def test_the_client_caches_by_id_and_tells_unknown_from_unreachable(schema_registry: LocalSchemaRegistry):
    schema_id = register(schema_registry.url, "pings-cache-value", V1)
    client = SchemaRegistryClient(RegistrySettings(url=schema_registry.url))
    first = client.schema(schema_id)
    assert first.schema_type == "AVRO" and json.loads(first.text) == V1
    assert client.schema(schema_id) is first and client.requests == 1
    with pytest.raises(UnknownSchemaId):
        client.schema(987_654)
    with pytest.raises(UnknownSchemaId):
        client.schema(987_654)
    assert client.requests == 2  # the refusal is remembered too

    nowhere = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    with pytest.raises(RegistryUnavailable, match=f"schema registry at {nowhere} is unreachable"):
        SchemaRegistryClient(RegistrySettings(url=nowhere)).schema(schema_id)


def test_avro_records_decode_across_a_schema_change_with_every_record_accounted_for(
    schema_registry: LocalSchemaRegistry,
):
    v1 = register(schema_registry.url, "pings-evolving-value", V1)
    v2 = register(schema_registry.url, "pings-evolving-value", V2)
    assert v1 != v2
    note = {"id": 4, "name": "note", "type": "string", "from": ["properties.note"]}
    decoder = Decoder(
        parse_contract(contract({"lon_field": "lon", "lat_field": "lat"}, [note])),
        DecodeOptions(schema_registry=RegistrySettings(url=schema_registry.url)),
    )
    values = [
        wire(v1, avro_bytes(V1, {"id": "a", "lon": 2.35, "lat": 48.86, "speed": 1.5})),
        wire(v2, avro_bytes(V2, {"id": "b", "lon": 13.4, "lat": 52.5, "speed": None, "note": "after the change"})),
        wire(424_242, avro_bytes(V1, {"id": "c", "lon": 0.0, "lat": 0.0, "speed": None})),
        wire(v2, avro_bytes(V1, {"id": "d", "lon": 0.0, "lat": 0.0, "speed": None})),  # v1 bytes, v2 id
    ]
    out = decoder.decode(kafka_batch(values)).to_pylist()
    assert [r[REJECT_REASON] for r in out] == [None, None, "unknown_schema_id", "schema_mismatch"]
    assert schema_registry.url in out[2][REJECT_DETAIL]
    assert [(r["event_id"], r["speed"], r["note"]) for r in out[:2]] == [
        ("a", 1.5, None),
        ("b", None, "after the change"),
    ]


def test_protobuf_messages_decode_with_the_schema_the_registry_holds(schema_registry: LocalSchemaRegistry):
    schema_id = register(schema_registry.url, "pings-proto-value", PING_PROTO, "PROTOBUF")
    assert get(schema_registry.url, f"/schemas/ids/{schema_id}")["schemaType"] == "PROTOBUF"  # type: ignore[index]
    raw = {**contract({"lon_field": "lon", "lat_field": "lat"}), "formats": ["protobuf"]}
    decoder = Decoder(parse_contract(raw), DecodeOptions(schema_registry=RegistrySettings(url=schema_registry.url)))
    avro_id = register(schema_registry.url, "pings-proto-avro-value", V1)
    values = [
        wire(schema_id, b"\x00" + Ping(id="a", lon=2.35, lat=48.86, speed=1.5).SerializeToString()),
        wire(avro_id, b"\x00" + Ping(id="b", lon=2.35, lat=48.86).SerializeToString()),  # an Avro schema's id
    ]
    out = decoder.decode(kafka_batch(values)).to_pylist()
    assert [r[REJECT_REASON] for r in out] == [None, "schema_not_supported"]
    assert (out[0]["event_id"], out[0]["speed"]) == ("a", 1.5)
    assert "is of type AVRO, not PROTOBUF" in out[1][REJECT_DETAIL]


def test_a_protobuf_schema_whose_imports_are_schema_references_decodes_with_them(
    schema_registry: LocalSchemaRegistry,
):
    """What a Protobuf serializer registers for a file that imports others: each imported file under
    a subject of its own, and the schema with references naming them by their import paths."""
    from google.protobuf import message_factory

    from streaming.decode.formats.protobuf import general_proto_plan
    from tests.streaming.decode.formats.test_protobuf_nested import POSITION_PROTO, TRIP_PROTO, UNITS_PROTO

    for path, text in (("geo/position.proto", POSITION_PROTO), ("geo/units.proto", UNITS_PROTO)):
        register(schema_registry.url, path, text, "PROTOBUF")
    references = [{"name": path, "subject": path, "version": 1} for path in ("geo/position.proto", "geo/units.proto")]
    schema_id = register(schema_registry.url, "trips-value", TRIP_PROTO, "PROTOBUF", references)
    registered = SchemaRegistryClient(RegistrySettings(url=schema_registry.url)).schema(schema_id)
    assert registered.reference_names == ("geo/position.proto", "geo/units.proto")
    assert registered.references == (POSITION_PROTO, UNITS_PROTO)

    raw = {
        **contract(
            {"lon_field": "position.lon", "lat_field": "position.lat"},
            [{"id": 4, "name": "unit", "type": "string", "from": ["properties.unit"]}],
        ),
        "formats": ["protobuf"],
    }
    decoder = Decoder(parse_contract(raw), DecodeOptions(schema_registry=RegistrySettings(url=schema_registry.url)))
    plan = general_proto_plan(schema_id, TRIP_PROTO, list(zip(registered.reference_names, registered.references)))
    trip = message_factory.GetMessageClass(plan.messages[0])(id="t1", unit=1)
    trip.position.lon, trip.position.lat = 13.4, 52.5
    [row] = decoder.decode(kafka_batch([wire(schema_id, b"\x00" + trip.SerializeToString())])).to_pylist()
    assert (row[REJECT_REASON], row["event_id"], row["unit"]) == (None, "t1", "KM")


def test_an_unreachable_registry_stops_the_batch_naming_it():
    nowhere = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    decoder = Decoder(
        parse_contract(contract({"geometry_field": "geom"})),
        DecodeOptions(schema_registry=RegistrySettings(url=nowhere)),
    )
    with pytest.raises(RegistryUnavailable, match=nowhere):
        decoder.decode(kafka_batch([wire(1, b"\x02a")]))


def test_registry_settings_come_from_the_environment_with_the_password_masked():
    settings = load_settings(
        env={
            "GEOINGEST_SCHEMA_REGISTRY__URL": "https://registry.example:8443/apis/ccompat/v7",
            "GEOINGEST_SCHEMA_REGISTRY__USERNAME": "ingest",
            "GEOINGEST_SCHEMA_REGISTRY__PASSWORD": "s3cret",
            "GEOINGEST_SCHEMA_REGISTRY__CA_FILE": "/etc/ssl/registry-ca.pem",
        }
    )
    registry = RegistrySettings.from_mapping(settings.schema_registry)
    assert registry.url == "https://registry.example:8443/apis/ccompat/v7"
    assert (registry.username, registry.password, registry.ca_file) == ("ingest", "s3cret", "/etc/ssl/registry-ca.pem")
    assert settings.shown()["schema_registry"]["password"] == "***"
    assert "s3cret" not in repr(settings) and "s3cret" not in repr(registry)
    with pytest.raises(ValueError, match="unknown keys"):
        RegistrySettings.from_mapping({"uri": "http://x"})
