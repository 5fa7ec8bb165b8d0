# One entry point for every routine task. `make up` and `make test` do all set-up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help install up test unit bench lint typecheck proto lock clean

help:
	@echo "make up         run the whole stack (Redis, Triton, gateway, batcher) on loopback"
	@echo "make test       lint, type-check, then the whole test suite against real servers"
	@echo "make unit       only the unit tests (no servers)"
	@echo "make bench      Ferry against Triton alone: BENCHMARKS.md and docs/*.png (~15 min)"
	@echo "make lint       ruff"
	@echo "make typecheck  mypy --strict"
	@echo "make proto      regenerate services/ferry/v1 from proto/"
	@echo "make lock       re-pin requirements.lock from the current .venv"

$(STAMP): pyproject.toml requirements.lock scripts/install-redis.sh
	scripts/install-redis.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

up: install
	$(BIN)/ferry up $(ARGS)

test: install lint typecheck
	$(BIN)/pytest $(PYTEST_ARGS)

unit: install
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m loadtest.bench $(ARGS)

lint: install
	$(BIN)/ruff check services tests loadtest

typecheck: install
	$(BIN)/mypy

proto: install
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=services --pyi_out=services \
		proto/ferry/v1/task.proto

lock: install
	{ echo "# Exact versions for 'make up' / 'make test' (Python 3.11, Linux x86-64). Regenerate: make lock"; \
	  $(BIN)/python -m pip freeze --exclude-editable; } > requirements.lock

clean:
	rm -rf $(VENV) .ferry .pytest_cache .mypy_cache .ruff_cache
