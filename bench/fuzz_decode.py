"""Fuzz run of the decoder: at least 100,000 inputs per format, none may raise or hit a defect.

Two engines per format, each in its own processes so a crash of native code (GEOS, Arrow) is
caught and its input kept:
  - coverage-guided: atheris (libFuzzer) mutates raw values, seeded with valid records of the
    format and the saved corpus; it follows new branches of streaming/decode.py;
  - structured: tests/fuzz_inputs.py builds hostile records (deep nesting, size claims, control and
    trailing bytes, wrong nesting), decoded in batches as the service does.
An input that raises, reaches decode_failed or kills the process is written to
tests/streaming/fuzz_corpus/<format>/, which `make test` replays. Figures go to
bench/results/fuzz.json.

    python bench/fuzz_decode.py [--inputs 100000] [--formats geojson,wkb,ewkb,key_headers]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import random
import re
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the spawned workers import this file by path
    sys.path.insert(0, str(ROOT))
CORPUS = ROOT / "tests" / "streaming" / "fuzz_corpus"
RESULTS = ROOT / "bench" / "results" / "fuzz.json"
BATCH = 200


# -- the check, shared by both engines -------------------------------------------------------------
def _decoder():
    from streaming.decode import DecodeOptions, Decoder
    from tests.streaming.test_decode import DEMO

    return Decoder(DEMO, DecodeOptions(max_message_bytes=8 * 1024 * 1024, max_vertices=20_000))


def _check(decoder, records) -> None:
    from tests.streaming.test_decode import kafka_batch

    batch = kafka_batch([v for _, v, _ in records], keys=[k for k, _, _ in records],
                        headers=[h for _, _, h in records])
    out = decoder.decode(batch)
    if out.num_rows != len(records):
        raise AssertionError(f"{len(records)} records in, {out.num_rows} rows out")
    reasons = out.column("_reject_reason").to_pylist()
    if "decode_failed" in reasons:
        row = reasons.index("decode_failed")
        raise AssertionError(f"decoder defect: {out.column('_reject_detail')[row]}")


# -- coverage-guided ---------------------------------------------------------------------------------
def _atheris_main(fmt: str, runs: int, seeds: str, artifacts: str) -> None:
    import atheris

    with atheris.instrument_imports(include=["streaming"]):
        decoder = _decoder()

    def one_input(data: bytes) -> None:
        if fmt == "key_headers":
            fdp = atheris.FuzzedDataProvider(data)
            key = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64)) if fdp.ConsumeBool() else None
            headers = [(fdp.ConsumeUnicodeNoSurrogates(8), fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 32)))
                       for _ in range(fdp.ConsumeIntInRange(0, 3))]
            record = (key, fdp.ConsumeBytes(fdp.remaining_bytes()), headers)
        else:
            record = (b"k", data, [])
        _check(decoder, [record])

    atheris.Setup([sys.argv[0], f"-runs={runs}", f"-artifact_prefix={artifacts}/", "-max_len=65536",
                   "-rss_limit_mb=4096", "-timeout=60", "-print_final_stats=1", seeds], one_input)
    atheris.Fuzz()


def seed_values(fmt: str, count: int = 40) -> list[bytes]:
    from tests.fuzz_inputs import geojson_value, seed_feature, seed_geometries

    import shapely

    rng = random.Random(7)
    if fmt == "geojson":
        return [json.dumps(seed_feature(rng)).encode() for _ in range(count)] + [geojson_value(rng) for _ in range(10)]
    if fmt == "wkb":
        return [shapely.to_wkb(g, output_dimension=4, byte_order=b) for g in seed_geometries() for b in (0, 1)]
    if fmt == "ewkb":
        return [shapely.to_wkb(shapely.set_srid(g, s), include_srid=True, output_dimension=4)
                for g in seed_geometries() for s in (4326, 3857, 2154)]
    return [json.dumps(seed_feature(rng)).encode() for _ in range(count)]


def run_atheris(fmt: str, runs: int) -> dict:
    found = CORPUS / fmt
    found.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as seeds:
        for value in seed_values(fmt) + [p.read_bytes() for p in found.glob("*") if p.stat().st_size <= 65536]:
            (Path(seeds) / hashlib.sha1(value).hexdigest()).write_bytes(value)
        before = set(found.glob("crash-*")) | set(found.glob("timeout-*")) | set(found.glob("oom-*"))
        started = time.monotonic()
        proc = subprocess.run([sys.executable, __file__, "--atheris-child", fmt, str(runs), seeds, str(found)],
                              capture_output=True, text=True, cwd=ROOT)
        seconds = time.monotonic() - started
    crashes = sorted(set(found.glob("crash-*")) | set(found.glob("timeout-*")) | set(found.glob("oom-*")) - before)
    executed = _stat(proc.stderr, r"stat::number_of_executed_units:\s*(\d+)")
    coverage = _stat(proc.stderr, r"\bcov: (\d+)")
    if proc.returncode != 0 and not crashes:
        raise SystemExit(f"atheris run of {fmt} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"engine": "atheris", "format": fmt, "inputs": executed, "seconds": round(seconds, 1),
            "edges_covered": coverage, "crashes": [str(p.relative_to(ROOT)) for p in crashes],
            "exit": proc.returncode}


def _stat(stderr: str, pattern: str) -> int | None:
    found = re.findall(pattern, stderr)
    return int(found[-1]) if found else None


# -- structured --------------------------------------------------------------------------------------
def _structured_batch(args: tuple[str, int]) -> None:
    from tests.fuzz_inputs import record

    fmt, seed = args
    rng = random.Random(seed)
    _check(_decoder(), [record(fmt, rng) for _ in range(BATCH)])


def _batch_records(fmt: str, seed: int):
    from tests.fuzz_inputs import record

    rng = random.Random(seed)
    return [record(fmt, rng) for _ in range(BATCH)]


def _isolate(fmt: str, seed: int) -> list[bytes]:
    """The records of a failed batch that fail alone (each in a fresh process, to survive crashes)."""
    culprits = []
    for key, value, headers in _batch_records(fmt, seed):
        probe = [(key, value, headers)]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump([[None if key is None else key.hex(), None if value is None else value.hex(),
                        [[k, None if v is None else v.hex()] for k, v in headers]] for key, value, headers in probe], f)
        proc = subprocess.run([sys.executable, __file__, "--check-child", f.name], capture_output=True, cwd=ROOT)
        Path(f.name).unlink()
        if proc.returncode != 0:
            culprits.append(value or b"")
    return culprits


def run_structured(fmt: str, inputs: int) -> dict:
    seeds = [zlib.crc32(f"{fmt}-{i}".encode()) for i in range(max(1, inputs // BATCH))]
    failed: list[int] = []
    started = time.monotonic()
    ctx = mp.get_context("spawn")
    pending = list(seeds)
    while pending:
        with ctx.Pool(2, maxtasksperchild=50) as pool:
            results = {seed: pool.apply_async(_structured_batch, ((fmt, seed),)) for seed in pending}
            pending = []
            for seed, result in results.items():
                try:
                    result.get(timeout=600)
                except mp.TimeoutError:
                    failed.append(seed)
                except Exception:  # noqa: BLE001 - a failed check or a dead worker: isolate it below
                    failed.append(seed)
    crashes = []
    for seed in failed:
        for value in _isolate(fmt, seed):
            path = CORPUS / fmt / f"crash-{hashlib.sha1(value).hexdigest()}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(value)
            crashes.append(str(path.relative_to(ROOT)))
    return {"engine": "structured", "format": fmt, "inputs": len(seeds) * BATCH,
            "seconds": round(time.monotonic() - started, 1), "failed_batches": len(failed), "crashes": crashes}


def _check_child(path: str) -> None:
    records = [(None if k is None else bytes.fromhex(k), None if v is None else bytes.fromhex(v),
                [(hk, None if hv is None else bytes.fromhex(hv)) for hk, hv in h])
               for k, v, h in json.loads(Path(path).read_text())]
    _check(_decoder(), records)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--atheris-child":
        _atheris_main(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--check-child":
        _check_child(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs per format and engine")
    parser.add_argument("--formats", default="geojson,wkb,ewkb,key_headers")
    args = parser.parse_args()
    runs = []
    for fmt in args.formats.split(","):
        for engine in (run_atheris, run_structured):
            result = engine(fmt, args.inputs)
            runs.append(result)
            print(f"{result['format']:12s} {result['engine']:10s} {result['inputs'] or 0:>8} inputs "
                  f"{result['seconds']:>7} s  crashes: {len(result['crashes'])}", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"inputs_per_format_and_engine": args.inputs, "runs": runs}, indent=2) + "\n")
    total = sum(len(r["crashes"]) for r in runs)
    print(f"{sum(r['inputs'] or 0 for r in runs)} inputs, {total} crashing inputs; written to {RESULTS}")
    if total:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
