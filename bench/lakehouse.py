"""geoingest on the local shape against the lakehouse shape, and what staging costs on an object store.

One command, one broker, the same events for every run: the demo's sample stream (app/local/sample.py:
GeoJSON points mostly, WKB tracks, EWKB zones, WKB sites, a trickle of malformed events) produced
once on the plain listener of the lakehouse's broker. Then, at each batch size (max offsets per
trigger), each run in a fresh process with its own Spark driver:

  local        Spark local[2], a SQLite catalog, a file:// warehouse, the broker's plain listener
  lakehouse    app.local.lakehouse.Lakehouse: the table in a bucket of s3proxy through Iceberg's REST
               catalog, a Spark standalone cluster (its executor and Python workers are processes
               of their own, 2 cores), the broker over SASL_SSL (SCRAM-SHA-512 over TLS)

each with clustering "batch" (every valid row staged as Arrow IPC slices under <table>/staging,
then merged into the batch's files: the rows are written and read twice) and "task" (each task
writes its own sorted runs as files: no staging). Every run is warm: its process first drains a
small warm-up topic into a table of its own. Then the service runs with a processing-time trigger
("0 seconds": the next batch starts when the last one is done, as under a backlog) and is timed
from query start to the last commit, as bench/ingest.py times it. Each configuration runs --repeats
times, the configurations alternating, and the faster run of each is kept (a fresh JVM's figure
moves by tens of percent from run to run, and other work may share the machine).

For the lakehouse runs, around the measured run only (warm-up and queries left out):
  requests     the object store's requests by kind (PUT, GET, HEAD, LIST, DELETE, POST) from
               `LocalObjectStore.request_counts()`, and by the part of the table they touch
               (staging, data, metadata, dead-letters) from the same request log
  bytes        the growth of the bucket (files under the store's data_dir: what stays); the
               bytes uploaded, staged slices deleted again included, from what s3proxy wrote to
               disk (its /proc/<pid>/io write_bytes): pyarrow writes every object as a multipart
               upload, which s3proxy's filesystem store writes twice (the part, then the object),
               so half of it; and the bytes it served (wchar - write_bytes: what it wrote to its
               sockets, GET bodies and listings)

and for every run the pruning it leaves: the files and row groups a window query reads
(streaming.read.query's own stats) over random windows of 0.1 % of the data extent, against the model
ideal, as bench/ingest.py reports it.

Writes bench/results/lakehouse.json and lakehouse.md.

    .venv/bin/python bench/lakehouse.py [--events 200000] [--batch-sizes 50000,10000]
        [--clusterings batch,task] [--shapes local,lakehouse] [--warmup-events 20000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):  # run as a script: app/, streaming/ and bench/ingest.py
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from ingest import (  # noqa: E402
    CONTRACT,
    CORES,
    DRIVER_MEMORY,
    MASTER,
    NAMED_WINDOWS,
    RANDOM_WINDOW_AREA,
    RANDOM_WINDOWS,
    _rows_in,
    faster,
    pruning,
)

from app.local.lakehouse import Lakehouse  # noqa: E402
from app.local.object_store import _REQUEST_LINE, _REQUEST_PREFIX, REQUEST_KINDS, LocalObjectStore, _kind  # noqa: E402
from app.local.sample import produce, sample_events  # noqa: E402
from app.settings import load_settings  # noqa: E402
from streaming.contract import load_contract  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TRIGGER = "0 seconds"
# The lakehouse driver plans and commits only: its tasks run in the cluster's executor, which asks
# app/spark.py's 2g. The local driver is its own executor too, so it gets bench/ingest.py's size.
LAKEHOUSE_DRIVER_MEMORY = "2g"
# The parts of a table a request can touch, by the folder its key or LIST prefix names.
AREAS = ("staging", "dead-letters", "metadata", "data")
MB = 1e6


# -- the events and the windows ---------------------------------------------------------------------
def sample_windows(events) -> dict[str, tuple[float, float, float, float]]:
    """The README's named windows and random square windows of RANDOM_WINDOW_AREA of the data
    extent, centred on GeoJSON points of the sample (the same windows for every run)."""
    xy = []
    for event in events:
        if event.value[:1] != b"{":
            continue
        try:
            x, y = json.loads(event.value)["geometry"]["coordinates"][:2]
        except (ValueError, TypeError, KeyError):
            continue  # the sample's malformed events
        if -180 <= x <= 180 and -90 <= y <= 90:
            xy.append((x, y))
    x, y = np.asarray(xy).T
    rng = np.random.default_rng(17)
    side_x = (x.max() - x.min()) * RANDOM_WINDOW_AREA**0.5
    side_y = (y.max() - y.min()) * RANDOM_WINDOW_AREA**0.5
    out = dict(NAMED_WINDOWS)
    for i, at in enumerate(rng.choice(len(x), RANDOM_WINDOWS, replace=False)):
        out[f"random-{i}"] = (
            float(x[at] - side_x / 2),
            float(y[at] - side_y / 2),
            float(x[at] + side_x / 2),
            float(y[at] + side_y / 2),
        )
    return out


# -- the object store, seen from outside ------------------------------------------------------------
def store_state(store: LocalObjectStore) -> dict:
    """Requests so far, how many lines the request log holds, the bucket's size and the I/O of
    the s3proxy process."""
    io = proc_io(store._process.pid())
    lines = store.request_log_file.read_bytes().decode(errors="replace").splitlines()
    return {
        "requests": store.request_counts(),
        "log_lines": len(lines),
        "bucket_bytes": folder_bytes(store.data_dir),
        "write_bytes": io["write_bytes"],
        "wchar": io["wchar"],
    }


def store_spent(store: LocalObjectStore, before: dict, after: dict) -> dict:
    log = store.request_log_file.read_bytes().decode(errors="replace").splitlines()
    lines = log[before["log_lines"] : after["log_lines"]]
    by_area: dict[str, dict[str, int]] = {}
    markers = 0
    for line in lines:
        match = _REQUEST_LINE.search(line) if line.startswith(_REQUEST_PREFIX) else None
        if match is None:
            continue
        kinds = by_area.setdefault(_area(match.group(2)), {})
        kind = _kind(*match.groups())
        kinds[kind] = kinds.get(kind, 0) + 1
        # A key ending in "/" is an empty directory marker: pyarrow puts one back over the parent
        # folder of every object it deletes.
        markers += kind == "PUT" and match.group(2).endswith("/")
    written = after["write_bytes"] - before["write_bytes"]
    return {
        "requests": {
            k: after["requests"].get(k, 0) - before["requests"].get(k, 0) for k in {*REQUEST_KINDS, *after["requests"]}
        },
        "requests_by_area": by_area,
        "directory_marker_puts": markers,
        "bucket_growth_bytes": after["bucket_bytes"] - before["bucket_bytes"],
        "disk_written_bytes": written,
        "uploaded_bytes": written // 2,
        # What s3proxy wrote that did not go to disk went to its sockets: object bodies it served,
        # listings, response headers. write_bytes counts whole pages, wchar bytes: a few KB per
        # object written can make a run that served next to nothing come out below zero.
        "served_bytes": max((after["wchar"] - before["wchar"]) - written, 0),
    }


def _area(url: str) -> str:
    text = unquote(url)
    for area in AREAS:
        if f"/{area}/" in text or text.endswith(f"/{area}"):
            return area
    return "other"


def proc_io(pid: int | None) -> dict[str, int]:
    if pid is None:
        raise RuntimeError("the object store is not running")
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return {k: int(v) for k, v in fields.items()}


def folder_bytes(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass  # deleted while walking: a staging slice
    return total


# -- one run, in a process of its own --------------------------------------------------------------
def run_child(spec: dict, workdir: Path, what: str) -> dict:
    """This script's --child mode over `spec` in a fresh process; returns its result."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "spec.json").write_text(json.dumps(spec))
    with open(workdir / "child.log", "wb") as log:
        command = [sys.executable, str(Path(__file__).resolve()), "--child", str(workdir / "spec.json")]
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT), start_new_session=True)
        try:
            process.wait(timeout=3600)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    result_path = workdir / "result.json"
    if process.returncode != 0 or not result_path.exists():
        tail = "\n".join((workdir / "child.log").read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{what} exited with {process.returncode}:\n{tail}")
    return json.loads(result_path.read_text())


def geoingest_child(spec: dict) -> dict:
    from app.service import configure_logging, run, start_spark
    from streaming.read.query import query_bbox
    from streaming.table.catalog import create_table, open_catalog

    configure_logging("WARNING")
    workdir = Path(spec["workdir"])
    settings = load_settings(
        env={},
        topic=spec["topic"],
        metrics_port=0,
        checkpoint_location=str(workdir / "checkpoints"),
        max_offsets_per_trigger=spec["per_batch"],
        clustering=spec["clustering"],
        trigger_interval=TRIGGER,
        **spec["shape_settings"],
    )
    contract = dataclasses.replace(load_contract(CONTRACT), table=f"{spec['namespace']}.events")
    warm_contract = dataclasses.replace(contract, table=f"{spec['namespace']}.warmup")
    catalog = open_catalog(settings.catalog_name, settings.catalog)
    table, _ = create_table(catalog, contract)
    create_table(catalog, warm_contract)
    store = LocalObjectStore(Path(spec["store_home"]), Path(settings.cache_dir)) if spec.get("store_home") else None

    spark = start_spark(settings)
    started = time.monotonic()
    warm = dataclasses.replace(settings, topic=spec["warmup_topic"], checkpoint_location=str(workdir / "warmup-ck"))
    run(warm, warm_contract, until_idle=True, spark=spark)
    warmup_s = time.monotonic() - started

    reports: list = []
    done_at: list[float] = []

    def observe(report) -> None:
        reports.append(report)
        if sum(r.consumed for r in reports) >= spec["events"] and not done_at:
            done_at.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)  # the service stops after this batch

    load_before = os.getloadavg()[0]
    before = store_state(store) if store else None
    started = time.monotonic()
    run(settings, contract, until_idle=False, observers=(observe,), spark=spark)
    elapsed = done_at[0] - started
    spent = store_spent(store, before, store_state(store)) if store else None
    load_after = os.getloadavg()[0]

    table.refresh()
    files = [task.file for task in table.scan().plan_files()]
    stages = {k: round(sum(r.seconds.get(k, 0.0) for r in reports), 2) for k in ("ingest", "merge", "commit", "total")}
    result = {
        "batches": len(reports),
        "consumed": sum(r.consumed for r in reports),
        "committed_rows": _rows_in(table),
        "rejected": sum(sum(r.rejected.values()) for r in reports),
        "files": len(files),
        "table_data_bytes": sum(f.file_size_in_bytes for f in files),
        "seconds": round(elapsed, 2),
        "events_per_s": round(spec["events"] / elapsed),
        "warmup_s": round(warmup_s, 2),
        "load_1min": [round(load_before, 2), round(load_after, 2)],
        "stage_seconds": {k: v for k, v in stages.items() if v},
        "object_store": spent,
        "pruning": pruning(table, spec["windows"], query_bbox),
    }
    spark.stop()  # the application leaves the cluster before the process goes
    return result


# -- the run ----------------------------------------------------------------------------------------
def shape_settings(shape: str, workdir: Path, stack: Lakehouse) -> dict:
    if shape == "local":
        return {
            "bootstrap_servers": stack.broker.bootstrap,
            "spark_master": MASTER,
            "driver_memory": DRIVER_MEMORY,
            "catalog": {
                "type": "sql",
                "uri": f"sqlite:///{workdir}/catalog.db",
                "warehouse": f"file://{workdir}/warehouse",
            },
        }
    return {**stack.settings_values(), "driver_memory": LAKEHOUSE_DRIVER_MEMORY}


def per_batch_figures(run: dict) -> dict:
    """The object store's figures of a lakehouse run per micro-batch."""
    spent, batches = run.get("object_store"), run["batches"]
    if not spent:
        return {}
    requests = {k: round(spent["requests"].get(k, 0) / batches, 1) for k in REQUEST_KINDS}
    return {
        "requests": requests,
        "requests_total": round(sum(spent["requests"].values()) / batches, 1),
        "requests_by_area": {
            area: round(sum(kinds.values()) / batches, 1) for area, kinds in sorted(spent["requests_by_area"].items())
        },
        "directory_marker_puts": round(spent["directory_marker_puts"] / batches, 1),
        "uploaded_mb": round(spent["uploaded_bytes"] / batches / MB, 2),
        "bucket_growth_mb": round(spent["bucket_growth_bytes"] / batches / MB, 2),
        "served_mb": round(spent["served_bytes"] / batches / MB, 2),
    }


def staging_costs(runs: dict, batch_sizes: list[int]) -> dict:
    """Clustering "batch" against "task" on each shape at each batch size: what staging costs
    (events/s, requests and bytes per batch) and what it buys (row groups per window)."""
    out = {}
    for per_batch in batch_sizes:
        for shape in ("local", "lakehouse"):
            staged, direct = runs.get(f"{shape}-batch-{per_batch}"), runs.get(f"{shape}-task-{per_batch}")
            if not staged or not direct:
                continue
            figures = {
                "events_per_s": [staged["events_per_s"], direct["events_per_s"]],
                "time_ratio": round(direct["events_per_s"] / staged["events_per_s"], 2),
                "row_groups_per_window": [
                    staged["pruning"]["random_mean_row_groups"],
                    direct["pruning"]["random_mean_row_groups"],
                ],
                "files_per_window": [staged["pruning"]["random_mean_files"], direct["pruning"]["random_mean_files"]],
                "row_groups_ratio": round(
                    direct["pruning"]["random_mean_row_groups"] / staged["pruning"]["random_mean_row_groups"], 2
                ),
            }
            a, b = staged.get("per_batch", {}), direct.get("per_batch", {})
            if a and b:
                figures.update(
                    {
                        "requests_per_batch": [a["requests_total"], b["requests_total"]],
                        "requests_ratio": round(a["requests_total"] / b["requests_total"], 2),
                        "staging_requests_per_batch": a["requests_by_area"].get("staging", 0),
                        "uploaded_mb_per_batch": [a["uploaded_mb"], b["uploaded_mb"]],
                        "uploaded_ratio": round(a["uploaded_mb"] / b["uploaded_mb"], 2),
                        "served_mb_per_batch": [a["served_mb"], b["served_mb"]],
                    }
                )
            out[f"{shape}-{per_batch}"] = figures
    return out


def verdict(costs: dict, batch_sizes: list[int]) -> list[str]:
    """The measured trade-off on the object store, batch size by batch size, and the rule that
    decides it: staging is worth keeping where the window reads it saves (task's row groups per
    window over batch's) outweigh its cost in ingest time (batch's seconds over task's)."""
    lines = []
    for per_batch in batch_sizes:
        c, local = costs.get(f"lakehouse-{per_batch}"), costs.get(f"local-{per_batch}")
        if not c:
            continue
        e_staged, e_direct = c["events_per_s"]
        text = (
            f"- {per_batch:,} events per batch: on the lakehouse, events/s with staging {e_staged:,} against "
            f"{e_direct:,} without ({e_staged / e_direct:.2f}x)"
        )
        if local:
            text += f"; on the local shape {local['events_per_s'][0] / local['events_per_s'][1]:.2f}x"
        if "requests_per_batch" in c:
            r_staged, r_direct = c["requests_per_batch"]
            u_staged, u_direct = c["uploaded_mb_per_batch"]
            s_staged, s_direct = c["served_mb_per_batch"]
            text += (
                f". Per batch {r_staged:g} object-store requests against {r_direct:g} "
                f"({c['staging_requests_per_batch']:g} under staging/), {u_staged:g} MB uploaded against "
                f"{u_direct:g}, {s_staged:g} MB read back against {s_direct:g}"
            )
        g_staged, g_direct = c["row_groups_per_window"]
        worth = c["row_groups_ratio"] > c["time_ratio"]
        text += (
            f". A 0.1 % window reads {g_staged:g} row groups with staging, {g_direct:g} without "
            f"({c['row_groups_ratio']:g}x) against {c['time_ratio']:g}x the ingest time: "
            + (
                "worth keeping, the reads it saves outweigh the ingest time it costs"
                if worth
                else "not worth it, it costs more ingest time than it saves reads"
            )
        )
        lines.append(text + ".")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch-sizes", default="50000,10000")
    parser.add_argument("--clusterings", default="batch,task")
    parser.add_argument("--shapes", default="local,lakehouse")
    parser.add_argument(
        "--warmup-events",
        type=int,
        default=20_000,
        help="events each run drains from a warm-up topic before it is measured",
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs of each configuration, alternating, the faster kept"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(Path(args.child).read_text())
        (Path(spec["workdir"]) / "result.json").write_text(json.dumps(geoingest_child(spec)))
        return

    run_started = time.monotonic()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    clusterings, shapes = args.clusterings.split(","), args.shapes.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="geoingest-bench-lakehouse-"))
    cache_dir = Path(load_settings(env={}).cache_dir)
    stack = Lakehouse.in_folder(tmp / "lakehouse", cache_dir, cores=CORES)
    report: dict = {
        "events": args.events,
        "batch_sizes": batch_sizes,
        "warmup_events": args.warmup_events,
        "cores": CORES,
        "trigger": TRIGGER,
        "repeats": args.repeats,
        "machine_cores": os.cpu_count(),
        "load_1min_at_start": round(os.getloadavg()[0], 2),
        "runs": {},
    }
    try:
        stack.start(say=lambda text: print(text, flush=True))
        events = list(sample_events(args.events))
        # The producers stand for the users' own: they write on the broker's plain listener.
        produce(stack.broker.bootstrap, "events", events, total=len(events), progress=False)
        produce(stack.broker.bootstrap, "warmup", list(sample_events(args.warmup_events, seed=11)), progress=False)
        windows = sample_windows(events)
        for per_batch in batch_sizes:
            for repeat in range(args.repeats):
                for shape in shapes:
                    for clustering in clusterings:
                        label = f"{shape}-{clustering}-{per_batch}"
                        workdir = tmp / f"{label}-{repeat}"
                        spec = {
                            "topic": "events",
                            "warmup_topic": "warmup",
                            "events": args.events,
                            "per_batch": per_batch,
                            "clustering": clustering,
                            "workdir": str(workdir),
                            "windows": windows,
                            "namespace": f"b_{shape}_{clustering}_{per_batch}_{repeat}",
                            "shape_settings": shape_settings(shape, workdir, stack),
                            "store_home": str(stack.store.home) if shape == "lakehouse" else None,
                        }
                        run = run_child(spec, workdir, f"geoingest, {label}")
                        if run["consumed"] != args.events or run["committed_rows"] + run["rejected"] != args.events:
                            raise RuntimeError(
                                f"{label}: {run['consumed']} of {args.events} events consumed, "
                                f"{run['committed_rows']} rows in the table, {run['rejected']} rejected"
                            )
                        run["per_batch"] = per_batch_figures(run)
                        print(
                            label,
                            json.dumps({k: v for k, v in run.items() if k not in ("pruning", "object_store")}),
                            flush=True,
                        )
                        report["runs"][label] = faster(report["runs"].get(label), run)
    finally:
        stack.stop()
    report["staging"] = staging_costs(report["runs"], batch_sizes)
    report["verdict"] = verdict(report["staging"], batch_sizes)
    report["load_1min_at_end"] = round(os.getloadavg()[0], 2)
    report["run_seconds"] = round(time.monotonic() - run_started)
    write_results(report)


def write_results(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lakehouse.json").write_text(json.dumps(report, indent=2))
    intro = (
        f"geoingest on the local shape (Spark {MASTER}, SQLite catalog, file:// warehouse, plain Kafka listener) "
        f"and the lakehouse shape (s3proxy bucket, Iceberg REST catalog, Spark standalone cluster of "
        f"{report['cores']} cores, SASL_SSL listener): {report['events']:,} sample events (app/local/sample.py), "
        f"processing-time trigger {report['trigger']!r}, events/s from query start to the last commit, every run "
        f"in a fresh process and warm ({report['warmup_events']:,} warm-up events first), {report['repeats']} "
        f"run(s) of each, the faster kept. {report['machine_cores']} cores shared by the driver, the executor, "
        f"the broker, s3proxy, the REST catalog and other work on the machine (1-minute load "
        f"{report['load_1min_at_start']} at the start, {report['load_1min_at_end']} at the end): compare within "
        f"this run, not across runs."
    )
    store_note = (
        "Object-store figures per micro-batch, counted around the timed run only (warm-up and queries left "
        "out). Requests from s3proxy's request log. MB uploaded: half of what s3proxy wrote to disk (pyarrow "
        "writes every object as a multipart upload, which s3proxy's filesystem store writes twice), staged "
        "slices deleted again included. MB bucket growth: what stays. MB served: what s3proxy wrote to its "
        "sockets (GET bodies, listings); both within about 0.1 MB per batch, since the kernel counts disk writes by "
        "the page. Windows: random windows of 0.1 % of the data extent, files and row "
        "groups read by streaming.read.query, against the model ideal."
    )
    kinds = REQUEST_KINDS
    lines = [
        intro,
        "",
        store_note,
        "",
        f"| shape | clustering | events per batch | batches | events/s | each run | files | {' | '.join(kinds)} "
        "| requests | MB uploaded | MB bucket growth | MB served | files per window | row groups per window "
        "| vs model ideal |",
        "|---|---|---|---|---|---|---|" + "---|" * len(kinds) + "---|---|---|---|---|---|---|",
    ]
    for label, run in report["runs"].items():
        shape, clustering, per_batch = label.split("-")
        b, p = run.get("per_batch", {}), run["pruning"]
        store = (
            [f"{b['requests'][k]:g}" for k in kinds]
            + [f"{b[k]:g}" for k in ("requests_total", "uploaded_mb", "bucket_growth_mb", "served_mb")]
            if b
            else ["-"] * (len(kinds) + 4)
        )
        lines.append(
            f"| {shape} | {clustering} | {int(per_batch):,} | {run['batches']} | {run['events_per_s']:,} | "
            f"{', '.join(f'{e:,}' for e in run['events_per_s_each'])} | {run['files']} | "
            + " | ".join(store)
            + f" | {p['random_mean_files']} | {p['random_mean_row_groups']} | "
            f"{p['random_row_groups_vs_ideal']}x |"
        )
    areas = [*AREAS, "other"]
    lines += [
        "",
        "Object-store requests per batch by the part of the table they touch, and the empty directory "
        "markers among the PUTs (pyarrow puts one back over the folder of every object it deletes):",
        "",
        f"| run | {' | '.join(areas)} | directory markers |",
        "|---|" + "---|" * (len(areas) + 1),
    ]
    for label, run in report["runs"].items():
        b = run.get("per_batch")
        if b:
            lines.append(
                f"| {label} | "
                + " | ".join(f"{b['requests_by_area'].get(a, 0):g}" for a in areas)
                + f" | {b['directory_marker_puts']:g} |"
            )
    lines += [
        "",
        'Staging (clustering "batch") against none ("task"), per batch:',
        "",
        "| shape | events per batch | events/s batch / task | requests batch / task "
        "| MB uploaded batch / task | MB served batch / task | row groups per window batch / task |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, c in report["staging"].items():
        shape, per_batch = key.split("-")
        pairs = [
            _pair(c, name)
            for name in (
                "events_per_s",
                "requests_per_batch",
                "uploaded_mb_per_batch",
                "served_mb_per_batch",
                "row_groups_per_window",
            )
        ]
        lines.append(f"| {shape} | {int(per_batch):,} | " + " | ".join(pairs) + " |")
    lines += [
        "",
        "Where the time goes (seconds summed over the batches of one run):",
        "",
        "| run | batches | stages |",
        "|---|---|---|",
    ]
    for label, run in report["runs"].items():
        lines.append(
            f"| {label} | {run['batches']} | {', '.join(f'{k} {v}' for k, v in run.get('stage_seconds', {}).items())} |"
        )
    rule = (
        "Is staging worth keeping on an object store? Judged here as worth keeping where the row groups a "
        "window reads without it, over those it reads with it, exceed the ingest time it costs (task's "
        "events/s over batch's): ingest pays for staging once per batch, every query pays for the layout a "
        "batch left until compaction (`geoingest table maintain --compact`) rewrites its files."
    )
    lines += ["", rule, "", *report["verdict"], "", f"Run time {report['run_seconds'] / 60:.1f} min."]
    (RESULTS / "lakehouse.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _pair(figures: dict, name: str) -> str:
    if name not in figures:
        return "-"
    return " / ".join(f"{v:,}" if isinstance(v, int) else f"{v:g}" for v in figures[name])


if __name__ == "__main__":
    main()
