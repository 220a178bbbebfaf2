"""Opening the catalog: a fresh SQLite catalog opened by several at once (a service's threads,
`geoingest status` beside it) opens for each of them. Real pyiceberg SQL catalogs on real files."""

from __future__ import annotations

import threading

from streaming.table.catalog import open_catalog


def test_a_fresh_sqlite_catalog_opened_by_six_threads_at_once_opens_for_each(tmp_path):
    failures: list[BaseException] = []
    for attempt in range(10):  # the race of pyiceberg's "check, then create" is lost often, not always
        folder = tmp_path / f"a{attempt}"
        properties = {"type": "sql", "uri": f"sqlite:///{folder}/c.db", "warehouse": f"file://{folder}/wh"}
        start = threading.Barrier(6)

        def open_it(properties=properties, start=start) -> None:
            start.wait()
            try:
                open_catalog("race", properties).list_namespaces()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)

        threads = [threading.Thread(target=open_it) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert open_catalog("race", properties).list_namespaces() == []
    assert not failures, failures[:3]
