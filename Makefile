# One entry point for every routine task. `make up` and `make test` do all set-up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Every Python process make starts writes the bytecode it compiles (gitignored __pycache__):
# where PYTHONDONTWRITEBYTECODE is set (this machine sets it), each of the hundreds of gateway,
# batcher and CLI processes a test run starts would compile all it imports again, and uv, which
# installs the venvs, leaves the compiling to first use.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help setup install tools chromium peers peers-lock up test test-cluster unit soak bench plan-check lint typecheck proto lock chart k8s clean
TOOLS := .tools
HELM := $(TOOLS)/bin/helm
CHART := deploy/helm/ferry
# The plain manifests: the default values, and a Redis password Secret made by the operator
# (no generated secret is written into the repository).
K8S_VALUES := --set redis.existingPasswordSecret=ferry-redis

help:
	@echo "make up         run the whole stack (Redis, Triton, gateway, batcher) on loopback"
	@echo "make test       lint, type-check, then the whole test suite against real servers"
	@echo "                (and the tests marked cluster again against a Redis Cluster)"
	@echo "make unit       only the unit tests (no servers)"
	@echo "make bench      Ferry against Triton alone and its Python peers (Ray Serve, BentoML,"
	@echo "                LitServe: their own venv): BENCHMARKS.md and docs/*.png (~60 min)"
	@echo "make plan-check the planner's predictions next to BENCHMARKS.md: PLANNER.md (~1 min)"
	@echo "make lint       ruff"
	@echo "make typecheck  mypy --strict"
	@echo "make proto      regenerate services/ferry/v1 from proto/"
	@echo "make lock       re-pin requirements.lock from the current .venv"
	@echo "make chart      helm lint, render, schema-validate and policy-scan deploy/helm/ferry"
	@echo "make k8s        re-render the plain manifests in deploy/k8s/ from the chart"

$(STAMP): pyproject.toml requirements.lock scripts/install-redis.sh scripts/venv-install.sh
	scripts/install-redis.sh
	PYTHON=$(PYTHON) scripts/venv-install.sh $(VENV) -r requirements.lock
	scripts/venv-install.sh $(VENV) --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

$(TOOLS)/.installed: scripts/install-chart-tools.sh scripts/venv-install.sh
	scripts/install-chart-tools.sh
	touch $@

# perf_analyzer (Triton's C++ load generator) for the bench and the tests that drive Ferry with it.
PERF_ANALYZER := $(TOOLS)/perf_analyzer/.installed
$(PERF_ANALYZER): scripts/install-perf-analyzer.sh $(STAMP)  # its pip is the venv's
	scripts/install-perf-analyzer.sh
	touch $@

# make bench's Python peers (Ray Serve, BentoML, LitServe: the bench extra) in a venv of their own,
# never in make up's or make test's install (loadtest/peers/).
PEERS_VENV := $(TOOLS)/peers
PEERS := $(PEERS_VENV)/.installed
$(PEERS): pyproject.toml loadtest/peers/requirements.lock
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --disable-pip-version-check \
		-r loadtest/peers/requirements.lock
	$(PEERS_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps -e '.[bench]'
	touch $@

peers: $(PEERS)

# An S3-compatible server (moto's, in its own venv) for the job store's tests.
S3_SERVER := $(TOOLS)/s3/.installed
$(S3_SERVER): scripts/install-s3-server.sh scripts/venv-install.sh
	scripts/install-s3-server.sh
	touch $@

# Debian's Chromium, for the test that renders /docs with no network (the script is a no-op
# once it is there).
chromium:
	scripts/install-chromium.sh

tools: $(TOOLS)/.installed $(PERF_ANALYZER) $(S3_SERVER) chromium

up: install
	$(BIN)/ferry up $(ARGS)

# The venv and the test tools install side by side (mostly downloads and unpacking; apt, where a
# package is missing, one at a time).
setup:
	$(MAKE) --no-print-directory -j4 install tools

# mypy, the chart's tests, the unit tests and the chaos soak's minute (its own servers; it checks
# answers, not times) run two at a time (two cores); then the other integration tests, then
# again on a Redis Cluster. The integration tests mostly wait (on servers, on time: the cores
# were idle half of their 21 minutes), so they run in two workers, a module at a time each, each
# worker with its own Redis and Triton. The slowest 25 are listed at the end (the time budget).
INTEGRATION_WORKERS ?= 2
XDIST := -n $(INTEGRATION_WORKERS) --dist loadfile
test: setup
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory -j2 -O typecheck chart unit soak
	$(BIN)/pytest $(XDIST) --durations=25 --ignore=tests/unit --ignore=tests/deploy \
		--ignore=tests/integration/test_soak.py $(PYTEST_ARGS)
	$(MAKE) test-cluster

# One minute of every fault against a whole stack (python -m loadtest.soak --duration-s 1800 for
# the real thing: docs/redis.md).
soak: install
	$(BIN)/pytest tests/integration/test_soak.py $(PYTEST_ARGS)

# The integration tests marked `cluster`, again, against a 3-master Redis Cluster on loopback.
test-cluster: install
	FERRY_TEST_REDIS_CLUSTER=1 $(BIN)/pytest $(XDIST) tests/integration \
		-m "cluster and not single_redis" $(PYTEST_ARGS)

chart: install tools
	$(BIN)/pytest tests/deploy $(PYTEST_ARGS)

k8s: tools
	$(HELM) template ferry $(CHART) --namespace ferry $(K8S_VALUES) > deploy/k8s/ferry.yaml

unit: install
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

bench: install $(PERF_ANALYZER) $(PEERS)
	$(BIN)/python -m loadtest.bench $(ARGS)

# The planner's predictions next to BENCHMARKS.md's measurements, and the design scenario.
plan-check: install
	$(BIN)/python -m ferry.planner.validate --bench BENCHMARKS.md --out PLANNER.md \
		--gpu-runs loadtest/gpukit/results/*.json

lint: install
	$(BIN)/ruff check services tests loadtest

typecheck: install
	$(BIN)/mypy

proto: install
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=services --pyi_out=services \
		proto/ferry/v1/task.proto

peers-lock: $(PEERS)
	{ echo "# Exact versions for make bench's peers venv (.tools/peers: the bench extra; Python 3.11, Linux x86-64). Regenerate: make peers-lock"; \
	  $(PEERS_VENV)/bin/python -m pip freeze --exclude-editable; } > loadtest/peers/requirements.lock

lock: install
	{ echo "# Exact versions for 'make up' / 'make test' (Python 3.11, Linux x86-64). Regenerate: make lock"; \
	  $(BIN)/python -m pip freeze --exclude-editable --exclude uv; } > requirements.lock

clean:
	rm -rf $(VENV) $(TOOLS) .ferry .pytest_cache .mypy_cache .ruff_cache
