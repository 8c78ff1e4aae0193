# One-word entry points. Every target creates the virtualenv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-quick warm-kernels lint demo demo-scan bench bench-psm bench-oph bench-scan bench-worker clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ needed"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## the whole test suite, Kafka integration tests included (the TEST_JOBS pytest workers
## share one local broker on free ports, started when a first test needs it; the suite is
## CPU-bound with 3 on the 2-core test machine, as its Kafka tests also wait on the broker).
## PYTEST_ARGS: more pytest arguments, e.g. PYTEST_ARGS='-m testdata'
## The tests start hundreds of dupalign processes: with PYTHONDONTWRITEBYTECODE set, each would
## compile the package's ~90 modules from source again (~0.5 s of CPU a process).
## --maxschedchunk 1: a worker is handed tests as it finishes them (xdist's default hands each
## a quarter of its share at first: -m "not testdata" gave one worker the first 51 tests, so
## all 46 slow or Kafka ones, run one after the other while the others ran the short ones).
TEST_JOBS ?= 3
PYTEST_ARGS ?=
XDIST := -n $(TEST_JOBS) --maxschedchunk 1
test: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q $(XDIST) --durations=30 $(PYTEST_ARGS)

## compile numba's kernels into their cache, if they are not there (make test does it first)
warm-kernels: $(STAMP)
	$(PY) -m tests.warm_kernels

## unit and property tests only (no Kafka, no slow corpus tests)
test-quick: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not kafka and not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check dupalign tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

## the real thing: local Kafka broker, a real corpus produced, the worker, matches printed
demo: $(STAMP)
	bash deploy/demo.sh

## embedded mode, no Kafka: a real corpus through the engine, matches printed
demo-scan: $(STAMP)
	bash deploy/demo-scan.sh

bench-psm: $(STAMP)
	$(PY) -m tests.bench.bench_psm --sizes 1e6,1e7 --queries 100000

bench-oph: $(STAMP)
	$(PY) -m tests.bench.bench_oph

bench-scan: $(STAMP)
	$(PY) -m tests.bench.bench_scan

bench-worker: $(STAMP)
	$(PY) -m tests.bench.bench_worker

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
