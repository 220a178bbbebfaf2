# Everything a newcomer runs. Each target sets itself up: a virtualenv with the project and its
# dependencies; the Kafka broker's jars and Spark's Kafka connector come from Maven Central on
# first use, into the cache folder (GEOINGEST_CACHE_DIR, default ~/.cache/geoingest).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: setup lock panels demo demo-lakehouse check test image cluster-parts test-cluster bench fuzz clean

# The versions the tests pass with, every file checked against its hash: requirements/test.txt
# (the service's and the tests' dependencies) and requirements/service.txt (the service's alone,
# what the image installs), both compiled from pyproject.toml's ranges by `make lock`.
LOCKED := requirements/test.txt
PIP_VERSION := 26.3

$(INSTALLED): pyproject.toml $(LOCKED)
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"geoingest needs Python 3.11, {sys.executable} is {sys.version.split()[0]}"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "pip==$(PIP_VERSION)"
	$(PY) -m pip install --quiet --require-hashes --requirement $(LOCKED)
	$(PY) -m pip install --quiet --no-deps --editable .
	@touch $@

setup: $(INSTALLED)

# Compile the lock files again from pyproject.toml's ranges, taking the newest versions they allow
# (uv, in a virtualenv of its own so that it is not among what the lock pins). Run the tests after.
LOCK_VENV ?= .venv-lock
lock:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet "uv>=0.9,<1"
	$(LOCK_VENV)/bin/uv pip compile --quiet --upgrade --universal --generate-hashes --extra test pyproject.toml -o requirements/test.txt
	$(LOCK_VENV)/bin/uv pip compile --quiet --upgrade --universal --generate-hashes --constraint requirements/test.txt pyproject.toml -o requirements/service.txt

demo: setup
	$(VENV)/bin/geoingest demo

# The demo on the lakehouse shape: an S3-compatible object store, Iceberg's REST catalog, a Spark
# standalone cluster and the broker over SASL_SSL, all started and stopped by it (app/local/lakehouse.py).
demo-lakehouse: setup
	$(VENV)/bin/geoingest demo --lakehouse

# The suite on two workers (pytest-xdist, a test file to a worker): half its time waits on brokers,
# servers and JVMs starting, which the other worker fills. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: setup check
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# The service image from the Dockerfile, with podman from a Debian root kept in the cache folder
# (no Docker engine needed; needs root). docs/deploying.md says what it does and what it stands in for.
image: setup
	$(PY) -m app.local.image --tag localhost/geoingest:dev

# What test-cluster builds before its first test, built into the cache folder and nothing started:
# the image, the node's root, Kubernetes and containerd from source (about 18 minutes of two cores
# on a fresh machine, measured; seconds once cached).
cluster-parts: setup
	$(PY) -m app.local.kubernetes --build-only

# The image run as users run it, and the chart on a single-node Kubernetes cluster started here
# (docs/deploying.md); builds what it needs into the cache folder first, printing each step's time
# (-s: the times and the figures the tests measure show as they come).
test-cluster: setup
	$(PY) -m pytest -s -m "image or cluster" tests/deploy

# Lint, format and types, as configured in pyproject.toml.
check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# docs/panels/*.png: every row of the Grafana dashboard as a real Prometheus answers it, for a
# healthy service and one falling behind (about eight minutes).
panels: setup
	$(PY) dashboards/draw_panels.py

bench: setup
	$(PY) -m pip install --quiet --editable ".[test,bench]"
	PYTHONPATH=$(CURDIR) $(PY) bench/ingest.py
	PYTHONPATH=$(CURDIR) $(PY) bench/sustained.py
	PYTHONPATH=$(CURDIR) $(PY) bench/sustained.py --datasets geojson-points --stacks spark-kafka,python --compression none --results sustained_uncompressed
	PYTHONPATH=$(CURDIR) $(PY) bench/kafka_source.py --batch-sizes 1000000 --compression none --results kafka_source_uncompressed
	PYTHONPATH=$(CURDIR) $(PY) bench/kafka_source.py --batch-sizes 1000000 --compression lz4 --results kafka_source_lz4
	PYTHONPATH=$(CURDIR) $(PY) bench/source_read.py
	PYTHONPATH=$(CURDIR) $(PY) bench/lakehouse.py
	PYTHONPATH=$(CURDIR) $(PY) bench/pruning.py
	PYTHONPATH=$(CURDIR) $(PY) bench/antimeridian.py
	PYTHONPATH=$(CURDIR) $(PY) bench/layout.py
	PYTHONPATH=$(CURDIR) $(PY) bench/json_parsers.py
	PYTHONPATH=$(CURDIR) $(PY) bench/formats.py
	PYTHONPATH=$(CURDIR) $(PY) bench/registry_decode.py
	PYTHONPATH=$(CURDIR) $(PY) bench/concurrency.py
	PYTHONPATH=$(CURDIR) $(PY) bench/commit_cost.py
	PYTHONPATH=$(CURDIR) $(PY) bench/reliability.py
	PYTHONPATH=$(CURDIR) $(PY) bench/maintenance.py
	PYTHONPATH=$(CURDIR) $(PY) bench/retention.py
	PYTHONPATH=$(CURDIR) $(PY) bench/defaults.py
	PYTHONPATH=$(CURDIR) $(PY) bench/duckdb_pruning.py
	PYTHONPATH=$(CURDIR) $(PY) bench/upsert.py
	PYTHONPATH=$(CURDIR) $(PY) bench/partitioning.py
	PYTHONPATH=$(CURDIR) $(PY) bench/routing.py --tables 50 --events 400000 --rate 10000 --seconds 40 --trigger "10 seconds"
	PYTHONPATH=$(CURDIR) $(PY) bench/freshness.py --seconds 45 --warmup 15
	PYTHONPATH=$(CURDIR) $(PY) bench/freshness.py --seconds 45 --warmup 15 --rates 20000,100000 --triggers "0 seconds" --slow-record --results freshness_slow_record
	PYTHONPATH=$(CURDIR) $(PY) bench/freshness.py --seconds 180 --warmup 20 --rates 100000 --triggers "0 seconds" --results freshness_100k_180s
	$(MAKE) fuzz

# The decoder against 100,000 generated inputs per format and engine (bench/results/fuzz.json);
# a crashing input is saved to tests/streaming/decode/fuzz_corpus/, which `make test` replays.
fuzz: setup
	PYTHONPATH=$(CURDIR) $(PY) bench/fuzz_decode.py --inputs 100000

clean:
	rm -rf .demo .demo-lakehouse $(VENV)
