"""A dead letter that cannot be written stops the service with one line naming the record, and the
batch is not committed, so nothing is lost: once the cause is fixed, a restart dead-letters the
record and lands the others.

The failure is real: a dead-letter topic made by someone else with a 1 KiB record cap refuses the
record, and the spill location the service falls back to lies under a regular file."""

from __future__ import annotations

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from tests.app.test_poison_pill import good, landed
from tests.streaming.decode.test_dead_letter_corpus import dead_letters, large_record_topic, produce
from tests.streaming.job.test_chaos import CONTRACT_FILE, Service, geoingest, service_env

pytestmark = pytest.mark.integration


def test_an_unwritable_dead_letter_stops_the_service_with_one_line_and_loses_nothing(kafka, tmp_path):
    topic = large_record_topic(kafka.bootstrap, partitions=1)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        admin.create_topics(
            [
                NewTopic(
                    f"{topic}.dlq", num_partitions=1, replication_factor=1, topic_configs={"max.message.bytes": "1024"}
                )
            ]
        )
    finally:
        admin.close()
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the spill location's folder would be")
    env = service_env(kafka.bootstrap, topic, tmp_path, GEOINGEST_TRIGGER_INTERVAL="2 seconds")
    geoingest(env, "table", "create", "--contract", str(CONTRACT_FILE))
    before, after = good("before", 20), good("after", 20)
    bad = (b"too-big-for-the-dlq", b"not an event " * 400, [])  # 5 kB, over the topic's 1 KiB
    assert produce(kafka.bootstrap, topic, [*before, bad, *after]) == 41

    service = Service(
        env,
        tmp_path,
        "unwritable",
        extra_env={"GEOINGEST_DEAD_LETTER_SPILL_LOCATION": f"file://{blocker}/dead-letters"},
    )
    code = service.wait(timeout=600)
    assert code != 0
    last = service.stderr().rstrip().splitlines()[-1]
    assert last.startswith(
        f"geoingest: the rejected record {topic}/0/20 (unknown_format) could not be stored at "
        f"file://{blocker}/dead-letters/{topic}/0/20.arrow"
    ), service.stderr_tail()
    assert "Not a directory" in last
    assert landed(env) == set(), "the batch of the record was not committed"

    # The spill location fixed (the default, beside the table), the same batch runs again.
    geoingest(env, "run", "--contract", str(CONTRACT_FILE), "--until-idle", timeout=900)
    assert landed(env) == {key.decode() for key, _, _ in before + after}
    dead = list(dead_letters(kafka.bootstrap, f"{topic}.dlq").values())
    assert [(d.reason, d.offset, d.key, d.value, d.spilled) for d in dead] == [
        ("unknown_format", 20, bad[0], bad[1], True)
    ]
