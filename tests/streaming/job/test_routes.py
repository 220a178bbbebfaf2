"""Routes: topics and records to tables, and every route a user can mistype refused by name."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from streaming.job.routes import RecordField, RouteError, field_values, parse_routes

FLEET = {
    "name": "fleet",
    "topic_pattern": r"fleet\.(?<city>[a-z]+)\.positions",
    "table": "fleet.positions_{city}",
    "contract": "schemas/fleet.yaml",
}
SENSORS = {"topic": "sensors", "field": "header:kind", "table": "sensors.{value}", "contract": "schemas/s.yaml"}
AUDIT = {"topic": "audit-log", "table": "ops.audit", "contract": "schemas/audit.yaml"}


def test_a_pattern_names_each_topics_table_from_its_groups():
    routes = parse_routes([FLEET, AUDIT])
    fleet = routes.route_of("fleet.paris.positions")
    assert fleet is not None and fleet.name == "fleet"
    assert fleet.table_for_topic("fleet.paris.positions") == "fleet.positions_paris"
    assert fleet.table_for_topic("fleet.lyon.positions") == "fleet.positions_lyon"
    audit = routes.route_of("audit-log")
    assert audit is not None and audit.table_for_topic("audit-log") == "ops.audit"
    assert routes.route_of("fleet.paris.stops") is None
    assert routes.route_of("fleet.Paris.positions") is None, "the whole name matches, as Kafka's subscription"


def test_the_subscription_takes_every_routed_topic_and_no_other_in_javas_spelling():
    routes = parse_routes([FLEET, AUDIT, SENSORS])
    subscription = routes.subscription()
    assert "(?<city>" in subscription, "Kafka's subscribePattern is a Java regular expression"
    python = re.compile(subscription.replace("(?<", "(?P<"))
    for topic in ("fleet.paris.positions", "audit-log", "sensors"):
        assert python.fullmatch(topic), topic
    for topic in ("fleet.paris.stops", "audit-logs", "sensors2", "auditXlog"):
        assert not python.fullmatch(topic), topic


def test_a_field_route_names_each_records_table_by_its_header_or_key():
    routes = parse_routes([SENSORS])
    route = routes.route_of("sensors")
    assert route is not None and route.field == RecordField("header", ("kind",))
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    records = pa.record_batch(
        {
            "key": pa.array([b"k1", b"k2", None, b"k4", b"k5", b"k6"], pa.binary()),
            "headers": pa.array(
                [
                    [{"key": "kind", "value": b"air"}],
                    [{"key": "other", "value": b"x"}, {"key": "kind", "value": b"noise"}],
                    [],
                    [{"key": "kind", "value": b"air"}, {"key": "kind", "value": b"water"}],  # the last one wins
                    [{"key": "kind", "value": b"bad name"}],
                    [{"key": "kind", "value": b"\xff\xfe"}],
                ],
                pa.list_(header),
            ),
        }
    )
    index, names, details = route.tables_for_values(field_values(records, route.field))
    tables = [names[i] if i >= 0 else None for i in index]
    assert tables == ["sensors.air", "sensors.noise", None, "sensors.water", None, None]
    assert details[0] is None and details[1] is None and details[3] is None
    assert details[2] == "header:kind: the record has none, so route routes[0] names no table"
    assert "'bad name'" in details[4] and "not a table name" in details[4]
    assert "not UTF-8" in details[5]
    by_key = parse_routes([{**SENSORS, "field": "key", "table": "keyed.t_{value}"}]).routes[0]
    assert by_key.field is not None
    index, names, _ = by_key.tables_for_values(field_values(records, by_key.field))
    assert [names[i] if i >= 0 else None for i in index] == [
        "keyed.t_k1", "keyed.t_k2", None, "keyed.t_k4", "keyed.t_k5", "keyed.t_k6",
    ]  # fmt: skip


def test_records_without_the_header_or_any_header_name_no_table():
    route = parse_routes([SENSORS]).routes[0]
    assert route.field is not None
    header = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    for headers in (pa.array([None, []], header), pa.array([[{"key": "other", "value": b"x"}], None], header)):
        records = pa.record_batch({"key": pa.array([b"a", b"b"]), "headers": headers})
        assert field_values(records, route.field).to_pylist() == [None, None]


def test_a_json_member_names_each_records_table_as_sparks_json_path_gives_it():
    route = parse_routes([{**SENSORS, "field": "json:meta.kind"}]).routes[0]
    assert route.field == RecordField("json", ("meta", "kind"))
    values = [
        b'{"meta": {"kind": "air"}, "x": 1}',
        b'{"meta": {"kind": 7}}',
        b'{"meta": {}}',
        b'{"meta": "air"}',
        b"{not json",
        None,
        b'[{"meta": {"kind": "air"}}]',
    ]
    records = pa.record_batch({"key": pa.array([b"k"] * len(values)), "value": pa.array(values, pa.binary())})
    assert field_values(records, route.field).to_pylist() == [b"air", b"7", None, None, None, None, None]
    index, names, details = route.tables_for_values(field_values(records, route.field))
    assert [names[i] if i >= 0 else None for i in index] == ["sensors.air", "sensors.7", *[None] * 5]
    assert details[4] == "json:meta.kind: the record has none, so route routes[0] names no table"


def test_a_field_route_knows_the_tables_its_template_makes():
    route = parse_routes([{**SENSORS, "table": "sensors.t_{value}_v1"}]).routes[0]
    assert route.makes("sensors.t_air_v1") and route.makes("sensors.t_a.b_v1")
    assert not route.makes("sensors.air") and not route.makes("other.t_air_v1") and not route.makes("sensors.t__v1")


def test_a_topic_two_patterns_take_is_refused_naming_both_when_it_comes():
    other = {**FLEET, "name": "everything", "topic_pattern": "fleet\\..*", "table": "fleet.all"}
    routes = parse_routes([FLEET, other])
    with pytest.raises(RouteError, match="'fleet.paris.positions' is claimed by routes fleet and everything"):
        routes.route_of("fleet.paris.positions")


def test_a_topic_name_that_makes_no_valid_table_is_refused_naming_the_route_and_topic():
    loose = {**FLEET, "topic_pattern": r"fleet\.(?<city>.+)\.positions"}
    route = parse_routes([loose]).routes[0]
    assert route.table_for_topic("fleet.new-york.positions") == "fleet.positions_new-york"
    with pytest.raises(RouteError, match=r"route fleet: topic 'fleet\.a b\.positions' makes .*not a table name"):
        route.table_for_topic("fleet.a b.positions")


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        ([AUDIT, {**AUDIT, "table": "ops.other"}], r"route routes\[1\]: topic 'audit-log' is already routed by routes\[0\]"),
        ([{**FLEET, "topic_pattern": "audit.*", "table": "ops.all"}, AUDIT], r"route fleet: its pattern 'audit\.\*' also takes topic 'audit-log'"),
        ([{**FLEET, "table": "fleet.positions_{town}"}], r"routes\[0\] \(fleet\)\.table: .*uses \{town\}.*gives: city"),
        ([{**FLEET, "table": "positions_{city}"}], r"routes\[0\] \(fleet\)\.table: .*not a table name"),
        ([{**FLEET, "topic_pattern": "fleet.(?<city"}], r"routes\[0\] \(fleet\)\.topic_pattern: .*no regular expression"),
        ([{**AUDIT, "topic_pattern": "a.*"}], r"routes\[0\]: give exactly one of 'topic' and 'topic_pattern'"),
        ([{k: v for k, v in AUDIT.items() if k != "contract"}], r"routes\[0\]: 'contract' .* is missing"),
        ([{**AUDIT, "tabel": "x.y"}], r"routes\[0\]: unknown key 'tabel'"),
        ([{**SENSORS, "field": "xml:kind"}], r"routes\[0\]\.field: 'xml:kind' is none of key, header:<name>, json:"),
        ([{**SENSORS, "field": "json:meta.a b"}], r"routes\[0\]\.field: 'json:meta.a b': a member's name is letters"),
        ([{**SENSORS, "field": "json:meta..kind"}], r"routes\[0\]\.field: 'json:meta..kind' names no member"),
        ([{**SENSORS, "field": "header:"}], r"routes\[0\]\.field: 'header:' names no header"),
        ([{**SENSORS, "table": "sensors.all"}, {**FLEET, "field": "key"}], r"routes\[1\] \(fleet\): a 'field' route takes one topic"),
        ([{**AUDIT, "name": "a"}, {**FLEET, "name": "a"}], r"routes: two routes are named 'a'"),
        ([{**AUDIT, "topic": 3}], r"routes\[0\]\.topic: expected a non-empty string, got 3"),
        ({"topic": "x"}, r"routes: expected a list of routes, got dict"),
    ],
)  # fmt: skip
def test_a_route_that_cannot_be_followed_is_refused_in_one_line_naming_it(routes, message):
    with pytest.raises(RouteError, match=message) as caught:
        parse_routes(routes)
    assert "\n" not in str(caught.value)
