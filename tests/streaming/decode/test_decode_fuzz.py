"""Fuzzing the decoder: whatever the bytes of a value, key or headers, every record comes out as a
valid row or a reject with a reason, and never as a decoder defect (decode_failed) or an exception.

A fixed, derandomized budget runs here: hypothesis over generated records and arbitrary bytes, and
a short coverage-guided (atheris) run of bench/fuzz_decode.py; `make fuzz` runs that script with
100,000 inputs per format and engine. Every input that ever broke the decoder is kept in
fuzz_corpus/ and replayed.
"""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import shapely
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streaming.decode.decoder import (
    HILBERT,
    RAW_VALUE,
    REJECT_REASON,
    SOURCE_OFFSET,
    DecodeOptions,
    Decoder,
)
from streaming.decode.rejects import Reason
from tests.fuzz_inputs import FORMATS, contract_for, record, saved_record
from tests.streaming.decode.test_decoder import kafka_batch

CORPUS = Path(__file__).parent / "fuzz_corpus"
SHORT_RUN_INPUTS = 800  # per format; `make fuzz` runs 100,000
DECODERS = {
    fmt: Decoder(contract_for(fmt), DecodeOptions(max_message_bytes=8 * 1024 * 1024, max_vertices=20_000))
    for fmt in FORMATS
}
REASONS = {r.value for r in Reason} - {Reason.DECODE_FAILED.value, Reason.NO_ROUTE.value}  # the decoder gives neither
# A record every format's contract takes: the second of each corpus replay
VALID = {
    "json": b'{"vehicle": "v1", "position": {"lon": 1, "lat": 2}, "speed": 3}',
    "wkt": b"POINT (1 2)",
}
VALID_GEOJSON = b'{"type":"Feature","id":"g","properties":{},"geometry":{"type":"Point","coordinates":[1,2]}}'


def check_decodes(records: list[tuple[bytes | None, bytes | None, list]], fmt: str = "geojson") -> None:
    batch = kafka_batch([v for _, v, _ in records], keys=[k for k, _, _ in records], headers=[h for _, _, h in records])
    out = DECODERS[fmt].decode(batch).to_pylist()
    assert len(out) == len(records)
    assert [row[SOURCE_OFFSET] for row in out] == batch.column("offset").to_pylist()
    for (_, value, _), row in zip(records, out):
        if row[REJECT_REASON] is None:
            geometry = shapely.from_wkb(row["geometry"])
            assert geometry is not None and not shapely.is_empty(geometry)
            assert row["bbox"] is not None and row[HILBERT] is not None
            assert shapely.get_type_id(geometry) in (0, 1, 3, 4, 5, 6)
        else:
            assert row[REJECT_REASON] in REASONS, f"{row[REJECT_REASON]} for {value[:200]!r}"
            assert row[RAW_VALUE] == value


def corpus_inputs() -> list[Path]:
    return sorted(p for p in CORPUS.rglob("*") if p.is_file())


def test_corpus_holds_inputs_of_every_format():
    assert {p.parent.name for p in corpus_inputs()} >= {"geojson", "wkb", "ewkb"}


@pytest.mark.parametrize("path", corpus_inputs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_inputs_that_once_broke_the_decoder(path):
    fmt = path.parent.name
    check_decodes([saved_record(path), (b"k", VALID.get(fmt, VALID_GEOJSON), [])], fmt)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(fmt=st.sampled_from(FORMATS), rng=st.randoms(use_true_random=False), size=st.integers(1, 40))
def test_generated_batches_of_hostile_records(fmt, rng: random.Random, size):
    check_decodes([record(fmt, rng) for _ in range(size)], fmt)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    values=st.lists(
        st.one_of(
            st.none(),
            st.binary(max_size=300),
            st.binary(max_size=60).map(lambda b: b"\x01" + b),
            st.binary(max_size=60).map(lambda b: b"{" + b),
        ),
        min_size=1,
        max_size=30,
    ),
    keys=st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=30, max_size=30),
)
def test_arbitrary_bytes(values, keys):
    check_decodes([(k, v, []) for k, v in zip(keys, values)])


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris has wheels for Linux x86-64 alone")
def test_a_short_coverage_guided_run_finds_no_crash(tmp_path):
    results = tmp_path / "fuzz.json"
    root = Path(__file__).resolve().parents[3]
    run = subprocess.run(
        [
            sys.executable,
            str(root / "bench" / "fuzz_decode.py"),
            "--engines",
            "atheris",
            "--inputs",
            str(SHORT_RUN_INPUTS),
            "--results",
            str(results),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=900,
    )
    assert run.returncode == 0, f"crashing inputs, saved to the corpus:\n{run.stdout[-3000:]}{run.stderr[-3000:]}"
    runs = json.loads(results.read_text())["runs"]
    assert {r["format"] for r in runs} == set(FORMATS)
    # libFuzzer may execute a few units beyond -runs (2010 of 2000 seen once).
    assert all(r["inputs"] >= SHORT_RUN_INPUTS and r["crashes"] == [] for r in runs), runs
