"""Fuzz run of the decoder: at least 100,000 inputs per format, none may raise or hit a defect.

Two engines per format (GeoJSON, WKB, EWKB, GeoPackage, whole records with odd keys and headers, and
JSON events with the geometry in fields, WKT / EWKT text and STAC Items, each under its own contract), each in
processes of its own so a crash of native code (GEOS, Arrow) is caught and its input kept:
  - coverage-guided: atheris (libFuzzer) mutates raw values, seeded with valid records of the
    format and the saved corpus; it follows new branches of streaming/; it stops at the first crash;
  - structured: tests/fuzz_inputs.py builds hostile records (deep nesting, size claims, control and
    trailing bytes, encodings, wrong nesting), decoded in batches as the service does.
An input that raises, reaches decode_failed or kills the process is saved to
tests/streaming/decode/fuzz_corpus/<format>/ (once, whatever its name there), which `make test` replays;
the run then exits 1, listing it. Figures go to bench/results/fuzz.json (`make fuzz`).

    python bench/fuzz_decode.py [--inputs 100000] [--formats geojson,wkb,ewkb,gpkg,key_headers,json,wkt,stac]
                                [--engines atheris,structured] [--results FILE]
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
CORPUS = ROOT / "tests" / "streaming" / "decode" / "fuzz_corpus"
RESULTS = ROOT / "bench" / "results" / "fuzz.json"
BATCH = 200


# -- the check, shared by both engines -------------------------------------------------------------
def _decoder(fmt: str):
    from streaming.decode.decoder import DecodeOptions, Decoder
    from tests.fuzz_inputs import contract_for

    return Decoder(contract_for(fmt), DecodeOptions(max_message_bytes=8 * 1024 * 1024, max_vertices=20_000))


def _check(decoder, records) -> None:
    """Every record comes out once, valid or rejected for a reason that is not a decoder defect,
    a reject keeping its original value."""
    from streaming.decode.rejects import Reason
    from tests.streaming.decode.test_decoder import kafka_batch

    batch = kafka_batch([v for _, v, _ in records], keys=[k for k, _, _ in records], headers=[h for _, _, h in records])
    out = decoder.decode(batch)
    if out.num_rows != len(records):
        raise AssertionError(f"{len(records)} records in, {out.num_rows} rows out")
    reasons = out.column("_reject_reason").to_pylist()
    if "decode_failed" in reasons:
        row = reasons.index("decode_failed")
        raise AssertionError(f"decoder defect: {out.column('_reject_detail')[row]}")
    known = {r.value for r in Reason}
    raw = out.column("_raw_value").to_pylist()
    geometry = out.column("geometry").to_pylist()
    for (_, value, _), reason, kept, wkb in zip(records, reasons, raw, geometry):
        if reason is None and not wkb:
            raise AssertionError("a valid row without a geometry")
        if reason is not None and (reason not in known or kept != value):
            raise AssertionError(f"reject {reason!r} does not keep its value or has no known reason")


def _digest(value: bytes) -> str:
    return hashlib.sha1(value).hexdigest()


def _save_crashes(fmt: str, inputs: list[tuple[str, bytes]]) -> tuple[list[str], list[str]]:
    """Keeps crashing inputs in the corpus, each once whatever its name there. Returns the inputs
    new to the corpus and the corpus files that crashed again."""
    folder = CORPUS / fmt
    folder.mkdir(parents=True, exist_ok=True)
    kept = {_digest(p.read_bytes()): p for p in folder.iterdir() if p.is_file()}
    new, again = [], []
    for kind, value in inputs:
        digest = _digest(value)
        if digest in kept:
            again.append(str(kept[digest].relative_to(ROOT)))
            continue
        path = folder / f"{kind}-{digest}"
        path.write_bytes(value)
        kept[digest] = path
        new.append(str(path.relative_to(ROOT)))
    return sorted(set(new)), sorted(set(again))


# -- coverage-guided ---------------------------------------------------------------------------------
def _atheris_main(fmt: str, runs: int, seeds: str, artifacts: str) -> None:
    import atheris

    with atheris.instrument_imports(include=["streaming"]):
        decoder = _decoder(fmt)

    from tests.fuzz_inputs import unpack_record

    def one_input(data: bytes) -> None:
        _check(decoder, [unpack_record(data) if fmt == "key_headers" else (b"k", data, [])])

    atheris.Setup(
        [
            sys.argv[0],
            f"-runs={runs}",
            f"-artifact_prefix={artifacts}/",
            "-max_len=65536",
            "-rss_limit_mb=4096",
            "-timeout=60",
            "-print_final_stats=1",
            seeds,
        ],
        one_input,
    )
    atheris.Fuzz()


def seed_values(fmt: str, count: int = 40) -> list[bytes]:
    import shapely

    from tests.fuzz_inputs import (
        geojson_value,
        pack_record,
        record,
        seed_feature,
        seed_geometries,
        seed_item,
        seed_position,
    )

    rng = random.Random(7)
    if fmt == "geojson":
        return [json.dumps(seed_feature(rng)).encode() for _ in range(count)] + [geojson_value(rng) for _ in range(10)]
    if fmt == "wkb":
        return [shapely.to_wkb(g, output_dimension=4, byte_order=b) for g in seed_geometries() for b in (0, 1)]
    if fmt == "ewkb":
        return [
            shapely.to_wkb(shapely.set_srid(g, s), include_srid=True, output_dimension=4)
            for g in seed_geometries()
            for s in (4326, 3857, 2154)
        ]
    if fmt == "gpkg":
        from tests.gpkg_blobs import gpkg, kart

        return [kart(g) for g in seed_geometries()] + [
            gpkg(g, srs_id=s, kind=k, little=b)
            for g in seed_geometries()[:10]
            for s, k, b in ((3857, 4, False), (-1, 1, True))
        ]
    if fmt == "json":
        return [json.dumps(seed_position(rng)).encode() for _ in range(count)]
    if fmt == "wkt":
        return [shapely.to_wkt(g).encode() for g in seed_geometries()] + [
            b"SRID=%d;" % s + shapely.to_wkt(g).encode() for g in seed_geometries()[:5] for s in (4326, 3857)
        ]
    if fmt == "stac":
        return [json.dumps(seed_item(rng)).encode() for _ in range(count)]
    return [pack_record(*record(fmt, rng)) for _ in range(count)]


def run_atheris(fmt: str, runs: int) -> dict:
    """A libFuzzer run of `runs` inputs, seeded with valid values and the saved corpus; it stops
    at the first crash, which is then saved to the corpus."""
    with tempfile.TemporaryDirectory() as seeds, tempfile.TemporaryDirectory() as artifacts:
        saved = [p.read_bytes() for p in (CORPUS / fmt).glob("*") if p.is_file() and p.stat().st_size <= 65536]
        for value in seed_values(fmt) + saved:
            (Path(seeds) / _digest(value)).write_bytes(value)
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, __file__, "--atheris-child", fmt, str(runs), seeds, artifacts],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        seconds = time.monotonic() - started
        found = [
            (p.name.split("-", 1)[0], p.read_bytes())
            for p in sorted(Path(artifacts).iterdir())
            if p.name.startswith(("crash-", "timeout-", "oom-"))
        ]
    new, again = _save_crashes(fmt, found)
    executed = _stat(proc.stderr, r"stat::number_of_executed_units:\s*(\d+)")
    coverage = _stat(proc.stderr, r"\bcov: (\d+)")
    if proc.returncode != 0 and not found:
        raise SystemExit(f"atheris run of {fmt} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {
        "engine": "atheris",
        "format": fmt,
        "inputs": executed,
        "seconds": round(seconds, 1),
        "edges_covered": coverage,
        "crashes": new,
        "known_crashes": again,
        "exit": proc.returncode,
    }


def _stat(stderr: str, pattern: str) -> int | None:
    found = re.findall(pattern, stderr)
    return int(found[-1]) if found else None


# -- structured --------------------------------------------------------------------------------------
def _structured_batch(args: tuple[str, int]) -> None:
    from tests.fuzz_inputs import record

    fmt, seed = args
    rng = random.Random(seed)
    _check(_decoder(fmt), [record(fmt, rng) for _ in range(BATCH)])


def _batch_records(fmt: str, seed: int):
    from tests.fuzz_inputs import record

    rng = random.Random(seed)
    return [record(fmt, rng) for _ in range(BATCH)]


def _isolate(fmt: str, seed: int) -> list[bytes]:
    """The records of a failed batch that fail alone (each in a fresh process, to survive crashes),
    as saved inputs."""
    from tests.fuzz_inputs import saved_input

    culprits = []
    for key, value, headers in _batch_records(fmt, seed):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(
                [
                    [
                        None if key is None else key.hex(),
                        None if value is None else value.hex(),
                        [[k, None if v is None else v.hex()] for k, v in headers],
                    ]
                ],
                f,
            )
        proc = subprocess.run([sys.executable, __file__, "--check-child", f.name, fmt], capture_output=True, cwd=ROOT)
        Path(f.name).unlink()
        if proc.returncode != 0:
            culprits.append(saved_input(fmt, (key, value, headers)))
    return culprits


def run_structured(fmt: str, inputs: int) -> dict:
    seeds = [zlib.crc32(f"{fmt}-{i}".encode()) for i in range(max(1, inputs // BATCH))]
    failed: list[int] = []
    started = time.monotonic()
    ctx = mp.get_context("spawn")
    with ctx.Pool(2, maxtasksperchild=50) as pool:
        results = {seed: pool.apply_async(_structured_batch, ((fmt, seed),)) for seed in seeds}
        for seed, result in results.items():
            try:
                result.get(timeout=600)
            except Exception:  # noqa: BLE001 - a failed check, a dead worker or a timeout: isolated below
                failed.append(seed)
    seconds = time.monotonic() - started
    new, again = _save_crashes(fmt, [("crash", value) for seed in failed for value in _isolate(fmt, seed)])
    return {
        "engine": "structured",
        "format": fmt,
        "inputs": len(seeds) * BATCH,
        "seconds": round(seconds, 1),
        "failed_batches": len(failed),
        "crashes": new,
        "known_crashes": again,
    }


def _check_child(path: str, fmt: str) -> None:
    records = [
        (
            None if k is None else bytes.fromhex(k),
            None if v is None else bytes.fromhex(v),
            [(hk, None if hv is None else bytes.fromhex(hv)) for hk, hv in h],
        )
        for k, v, h in json.loads(Path(path).read_text())
    ]
    _check(_decoder(fmt), records)


ENGINES = {"atheris": run_atheris, "structured": run_structured}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--atheris-child":
        _atheris_main(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--check-child":
        _check_child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs per format and engine")
    from tests.fuzz_inputs import FORMATS

    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--engines", default="atheris,structured")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the figures go (JSON)")
    args = parser.parse_args()
    runs = []
    for fmt in args.formats.split(","):
        for engine in args.engines.split(","):
            result = ENGINES[engine](fmt, args.inputs)
            runs.append(result)
            print(
                f"{result['format']:12s} {result['engine']:10s} {result['inputs'] or 0:>8} inputs "
                f"{result['seconds']:>7} s  new crashing inputs: {len(result['crashes'])}, "
                f"saved ones crashing again: {len(result['known_crashes'])}",
                flush=True,
            )
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"inputs_per_format_and_engine": args.inputs, "runs": runs}, indent=2) + "\n")
    crashing = sorted({c for r in runs for c in r["crashes"] + r["known_crashes"]})
    print(f"{sum(r['inputs'] or 0 for r in runs)} inputs, {len(crashing)} crashing inputs; written to {args.results}")
    for path in crashing:
        print(f"  {path}")
    if crashing:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
